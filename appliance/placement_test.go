package appliance

import (
	"context"
	"os"
	"reflect"
	"strings"
	"testing"

	"gpuhost/nvml"
	"gpuhost/units"
)

// twoCards is a simulated 2×RTX 4090 box whose GPUs hold the given MiB
// (claims of this test's own, live, process).
func twoCards(t *testing.T, p2p bool, heldMiB [2]uint64) nvml.Snapshot {
	t.Helper()
	dir := t.TempDir()
	pid := os.Getpid()
	for i, mib := range heldMiB {
		if mib == 0 {
			continue
		}
		// A process has one claim file: the second device's claim is
		// written under the parent's pid, which is alive too.
		claimPID := pid
		if i == 1 {
			claimPID = os.Getppid()
		}
		if err := nvml.WriteClaim(dir, nvml.Claim{PID: claimPID, MiB: mib, Name: "other", GPUs: nvml.ClaimGPUs([]int{i})}); err != nil {
			t.Fatal(err)
		}
	}
	snap, err := nvml.NewSim(nvml.SimConfig{Dir: dir, P2P: p2p, Devices: make([]nvml.SimDevice, 2)}).Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

func TestPlaceProfile(t *testing.T) {
	fixed := func(idx ...int) units.GPUSet { return units.GPUSet{Indices: idx, Given: true} }
	auto := units.GPUSet{Auto: true, Given: true}
	ollama30 := units.ModelParams{TotalParamsB: 30, WeightBits: 8} // ~28 GiB: no single 24 GB card
	tests := []struct {
		name        string
		backend     units.Backend
		gpus        units.GPUSet
		params      units.ModelParams
		p2p         bool
		held        [2]uint64
		want        []int
		wantDisable bool
		wantErr     []string
	}{
		{name: "unset is GPU 0", backend: units.VLLM, want: []int{0}},
		{name: "fixed GPU 1", backend: units.VLLM, gpus: fixed(1), want: []int{1}},
		{name: "tensor parallel without P2P", backend: units.VLLM, gpus: fixed(0, 1), want: []int{0, 1}, wantDisable: true},
		{name: "tensor parallel with P2P", backend: units.VLLM, gpus: fixed(0, 1), p2p: true, want: []int{0, 1}},
		{name: "Ollama on two GPUs needs no NCCL setting", backend: units.Ollama, gpus: fixed(0, 1), want: []int{0, 1}},
		{name: "GPU not present", backend: units.VLLM, gpus: fixed(0, 2), wantErr: []string{`profile "p"`, "profiles.p.gpus[1]", "GPU 2 is not present", "NVML reports 2: [0, 1]"}},
		{name: "auto takes GPU 0 when free", backend: units.VLLM, gpus: auto, want: []int{0}},
		{name: "auto takes GPU 1 when GPU 0 is full", backend: units.VLLM, gpus: auto, held: [2]uint64{20000, 0}, want: []int{1}},
		{name: "auto spreads a model no card holds", backend: units.Ollama, gpus: auto, params: ollama30, want: []int{0, 1}},
		{name: "auto finds nothing", backend: units.VLLM, gpus: auto, held: [2]uint64{8000, 8000},
			wantErr: []string{"profiles.p.gpus: auto: fits on no GPU set", "[0]: GPU 0 has", "[0, 1]: GPU 0 has"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			snap := twoCards(t, tt.p2p, tt.held)
			p := &units.Profile{Name: "p", Backend: tt.backend, Model: "m", Port: 1, GPUs: tt.gpus, Params: tt.params}
			pl, err := placeProfile(p, snap)
			if len(tt.wantErr) > 0 {
				for _, w := range tt.wantErr {
					if err == nil || !strings.Contains(err.Error(), w) {
						t.Errorf("err = %v; want it to say %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(pl.Indices, tt.want) || pl.P2PDisable != tt.wantDisable || pl.P2PWhy == "" {
				t.Errorf("placement = %+v; want %v, P2P disabled %v, with a reason", pl, tt.want, tt.wantDisable)
			}
			for k, i := range pl.Indices {
				if pl.UUIDs[k] != nvml.SimUUIDFor(i) {
					t.Errorf("UUID %d = %s; want GPU %d's", k, pl.UUIDs[k], i)
				}
			}
			env := units.ParseEnvFile(units.PinnedEnvFile(placedProfile(*p, pl), false, pl.pinning()))
			if want := strings.Join(pl.UUIDs, ","); env[units.EnvCUDAVisibleDevices] != want || env[units.EnvCUDADeviceOrder] != "PCI_BUS_ID" {
				t.Errorf("env = %v; want CUDA_VISIBLE_DEVICES=%s, CUDA_DEVICE_ORDER=PCI_BUS_ID", env, want)
			}
			if tp := strings.Contains(env[units.EnvArgs], "--tensor-parallel-size 2"); tp != (tt.backend == units.VLLM && len(tt.want) == 2) {
				t.Errorf("args %q: tensor parallel flag %v", env[units.EnvArgs], tp)
			}
		})
	}
}

func TestForEachSubset(t *testing.T) {
	var got []string
	forEachSubset(3, 2, func(s []int) bool { got = append(got, units.IndicesString(s)); return true })
	if want := []string{"[0, 1]", "[0, 2]", "[1, 2]"}; !reflect.DeepEqual(got, want) {
		t.Errorf("subsets = %v; want %v", got, want)
	}
}
