package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"gpuhost/internal/exitclass"
	"gpuhost/units"
)

// lanesYAML is a box of two GPUs: p1 and an Ollama profile on GPU 0, p2
// on GPU 1 and tp on both.
const lanesYAML = `
state_dir: /var/lib/gpuhost
profiles:
  p1:
    backend: vllm
    model: org/model
    port: 8000
  chat:
    backend: ollama
    model: llama3.1:8b
    port: 11434
  p2:
    backend: vllm
    model: org/model
    port: 8001
    gpus: [1]
  tp:
    backend: vllm
    model: org/model
    port: 8002
    gpus: [1, 0]
`

// TestLanes: each GPU set written in a profile is a lane; GPU 0's lane
// holds the unplaced profiles, keeps the configured unit names and the
// state folder, and comes first.
func TestLanes(t *testing.T) {
	cfg, err := Parse("t.yaml", []byte(lanesYAML))
	if err != nil {
		t.Fatal(err)
	}
	got := cfg.Lanes()
	want := []Lane{
		{Slot: "", GPUs: []int{0}, Profiles: []string{"chat", "p1"}},
		{Slot: "gpu0-1", GPUs: []int{0, 1}, Profiles: []string{"tp"}},
		{Slot: "gpu1", GPUs: []int{1}, Profiles: []string{"p2"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Lanes() = %+v, want %+v", got, want)
	}
	if n := got[1].Name(); n != "GPU 0+1" {
		t.Errorf("lane name %q", n)
	}
	if !got[1].Shares(got[0]) || !got[1].Shares(got[2]) || got[0].Shares(got[2]) {
		t.Error("Shares: GPU 0+1 shares with both, GPU 0 and GPU 1 share nothing")
	}
	l1 := cfg.LaneConfig(got[2])
	if l1.StateDir != "/var/lib/gpuhost/lanes/gpu1" || l1.Backends.VLLM.Unit != "gpuhost-vllm-gpu1.service" || l1.Backends.Ollama.Unit != "gpuhost-ollama-gpu1.service" {
		t.Errorf("GPU 1's lane config: state %s, units %s %s", l1.StateDir, l1.Backends.VLLM.Unit, l1.Backends.Ollama.Unit)
	}
	if !slices.Equal(l1.ProfileNames(), []string{"p2"}) || l1.Root() != cfg || !l1.UsesBackend(units.VLLM) || l1.UsesBackend(units.Ollama) {
		t.Errorf("GPU 1's lane: profiles %v, root %v, vllm %v, ollama %v", l1.ProfileNames(), l1.Root() == cfg, l1.UsesBackend(units.VLLM), l1.UsesBackend(units.Ollama))
	}
	l0 := cfg.LaneConfig(got[0])
	if l0.StateDir != cfg.StateDir || l0.Backends.VLLM.Unit != "gpuhost-vllm.service" || !l0.UsesBackend(units.Ollama) {
		t.Errorf("GPU 0's lane keeps the names and folder: %s %s", l0.StateDir, l0.Backends.VLLM.Unit)
	}
	if lane, ok := cfg.LaneOf("tp"); !ok || lane.Slot != "gpu0-1" {
		t.Errorf("LaneOf(tp) = %+v %v", lane, ok)
	}
}

// TestLaneUnitsConflictWhereTheyShareAGPU: one unit per backend and lane
// in use, Conflicts= exactly between units whose lanes share a GPU, none at
// all when a profile uses standby; every unit renders and validates.
func TestLaneUnitsConflictWhereTheyShareAGPU(t *testing.T) {
	for _, standby := range []bool{false, true} {
		y := lanesYAML
		if standby {
			y = strings.Replace(y, "    port: 11434\n", "    port: 11434\n    standby: unload\n", 1)
		}
		cfg, err := Parse("t.yaml", []byte(y))
		if err != nil {
			t.Fatal(err)
		}
		conflicts := map[string][]string{}
		var names []string
		for _, u := range cfg.BackendUnits() {
			names = append(names, u.Name)
			conflicts[u.Name] = u.Conflicts
			if err := u.Validate(); err != nil {
				t.Errorf("%s: %v", u.Name, err)
			}
			if !strings.Contains(units.RenderBackendUnit(u), "EnvironmentFile=") {
				t.Errorf("%s renders without its environment file", u.Name)
			}
		}
		wantNames := []string{"gpuhost-vllm.service", "gpuhost-ollama.service", "gpuhost-vllm-gpu0-1.service", "gpuhost-vllm-gpu1.service"}
		if !slices.Equal(names, wantNames) {
			t.Fatalf("units %v, want %v", names, wantNames)
		}
		want := map[string][]string{
			"gpuhost-vllm.service":        {"gpuhost-ollama.service", "gpuhost-vllm-gpu0-1.service"},
			"gpuhost-ollama.service":      {"gpuhost-vllm.service", "gpuhost-vllm-gpu0-1.service"},
			"gpuhost-vllm-gpu0-1.service": {"gpuhost-vllm.service", "gpuhost-ollama.service", "gpuhost-vllm-gpu1.service"},
			"gpuhost-vllm-gpu1.service":   {"gpuhost-vllm-gpu0-1.service"},
		}
		if standby {
			want = map[string][]string{}
		}
		for _, n := range names {
			if !slices.Equal(conflicts[n], want[n]) {
				t.Errorf("standby %v: %s Conflicts=%v, want %v", standby, n, conflicts[n], want[n])
			}
		}
		if got := cfg.BackendSockets(); len(got) != 0 && got[8001] == got[8000] {
			t.Errorf("ports of two lanes share a socket: %v", got)
		}
	}
}

// TestLanesRefused: what several lanes cannot do is a config error naming
// the key (exit 78).
func TestLanesRefused(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string
	}{
		{"auto beside another lane", strings.Replace(lanesYAML, "    port: 8000\n", "    port: 8000\n    gpus: auto\n", 1),
			[]string{"profiles.p1.gpus", "auto", "GPU 1 (p2)"}},
		{"adopted unit beyond GPU 0", lanesYAML + "backends:\n  vllm:\n    adopt: true\n",
			[]string{"backends.vllm.adopt", "GPU 1"}},
		{"one port on two lanes", strings.Replace(lanesYAML, "    port: 8001\n", "    port: 8000\n", 1),
			[]string{"profiles.", ".port", "port 8000", "ports of their own"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("t.yaml", []byte(tt.yaml))
			var ce *Error
			if !errors.As(err, &ce) || exitclass.Of(err) != 78 {
				t.Fatalf("err = %v (exit %d); want a config error, exit 78", err, exitclass.Of(err))
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("err = %v; want it to say %q", err, w)
				}
			}
		})
	}
	// auto on a box of one lane stays what it was.
	if _, err := Parse("t.yaml", []byte(strings.Replace(minimal, "    port: 8000\n", "    port: 8000\n    gpus: auto\n", 1))); err != nil {
		t.Fatalf("auto on a one-lane box: %v", err)
	}
}

// TestOneLaneIsTheBoxAsBefore: a config without gpus (the shipped
// example) is one lane, its lane config is the config itself, and its units
// are the two it always had.
func TestOneLaneIsTheBoxAsBefore(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(".", "gpuhost.example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Parse("gpuhost.example.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	lanes := cfg.Lanes()
	if len(lanes) != 1 || lanes[0].Slot != "" {
		t.Fatalf("lanes %+v", lanes)
	}
	if cfg.LaneConfig(lanes[0]) != cfg {
		t.Error("the one lane's config is not the config itself")
	}
	var names []string
	for _, u := range cfg.BackendUnits() {
		names = append(names, u.Name)
	}
	if !slices.Equal(names, []string{cfg.Backends.VLLM.Unit, cfg.Backends.Ollama.Unit}) {
		t.Errorf("units %v", names)
	}
}
