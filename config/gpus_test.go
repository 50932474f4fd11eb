package config

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"gpuhost/internal/exitclass"
)

// TestProfileGPUs: the gpus key of a profile is read as a list or auto,
// unset is GPU 0, and every wrong placement is a config error (exit 78)
// naming the key.
func TestProfileGPUs(t *testing.T) {
	tests := []struct {
		name     string
		extra    string // appended under profiles.p1
		want     []int  // resolved set when valid
		wantAuto bool
		wantErr  []string
	}{
		{name: "unset is GPU 0", want: []int{0}},
		{name: "one GPU", extra: "    gpus: [1]\n", want: []int{1}},
		{name: "two GPUs", extra: "    gpus: [0, 1]\n", want: []int{0, 1}},
		{name: "block list", extra: "    gpus:\n      - 1\n      - 0\n", want: []int{1, 0}},
		{name: "auto", extra: "    gpus: auto\n", wantAuto: true},
		{name: "empty list", extra: "    gpus: []\n", wantErr: []string{"profiles.p1.gpus", "at least one GPU"}},
		{name: "negative", extra: "    gpus: [-1]\n", wantErr: []string{"profiles.p1.gpus[0]", ">= 0"}},
		{name: "duplicate", extra: "    gpus: [0, 0]\n", wantErr: []string{"profiles.p1.gpus[1]", "listed twice"}},
		{name: "other word", extra: "    gpus: all\n", wantErr: []string{"profiles.p1.gpus", `"all"`, "auto"}},
		{name: "heads not divisible", extra: "    gpus: [0, 1, 2]\n    model_params:\n      attention_heads: 32\n",
			wantErr: []string{"profiles.p1.gpus", "does not divide the model's 32 attention heads"}},
		{name: "heads divisible", extra: "    gpus: [0, 1]\n    model_params:\n      attention_heads: 32\n", want: []int{0, 1}},
		{name: "tp in extra_args with gpus", extra: "    gpus: [0, 1]\n    vllm:\n      extra_args: [--tensor-parallel-size, '2']\n",
			wantErr: []string{"profiles.p1.vllm.extra_args", "set by gpuhost from gpus"}},
		{name: "tp 2 in extra_args without gpus", extra: "    vllm:\n      extra_args: ['--tensor-parallel-size=2']\n",
			wantErr: []string{"profiles.p1.vllm.extra_args", "set gpus"}},
		{name: "tp 1 in extra_args without gpus", extra: "    vllm:\n      extra_args: [--tensor-parallel-size, '1']\n", want: []int{0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse("t.yaml", []byte(minimal+tt.extra))
			if len(tt.wantErr) > 0 {
				var ce *Error
				if !errors.As(err, &ce) || exitclass.Of(err) != 78 {
					t.Fatalf("err = %v (exit %d); want a config error, exit 78", err, exitclass.Of(err))
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("err = %v; want it to say %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			g := cfg.Profiles["p1"].GPUs
			if g.Auto != tt.wantAuto || (!tt.wantAuto && !reflect.DeepEqual(g.Resolved(), tt.want)) {
				t.Errorf("gpus = %+v (resolved %v); want %v auto %v", g, g.Resolved(), tt.want, tt.wantAuto)
			}
		})
	}
}

func TestSimGPUDevices(t *testing.T) {
	tests := []struct {
		name, yaml, wantErr string
	}{
		{"two cards", "gpu:\n  backend: sim\n  sim:\n    devices: [{name: RTX 4090, memory_mib: 24564}, {name: RTX 3090, memory_mib: 24576}]\n", ""},
		{"default size", "gpu:\n  backend: sim\n  sim:\n    devices: [{}, {}]\n", ""},
		{"tiny card", "gpu:\n  backend: sim\n  sim:\n    devices: [{memory_mib: 10}]\n", "gpu.sim.devices[0].memory_mib"},
		{"unknown key", "gpu:\n  sim:\n    devices: [{vram: 10}]\n", "gpu.sim.devices[0].vram"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("t.yaml", []byte(minimal+tt.yaml))
			if tt.wantErr == "" && err != nil {
				t.Fatal(err)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr) || exitclass.Of(err) != 78) {
				t.Errorf("err = %v; want a config error naming %s", err, tt.wantErr)
			}
		})
	}
}
