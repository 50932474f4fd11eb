package units

import (
	"slices"
	"strings"
	"testing"
)

// The rendered env file of a pinned backend: UUIDs (never indices), the
// PCI device order, NCCL_P2P_DISABLE only when asked, and vLLM's tensor
// parallel size from the set's length.
func TestPinnedEnvFile(t *testing.T) {
	const u0, u1 = "GPU-aaaaaaaa-0000-4000-8000-000000000000", "GPU-bbbbbbbb-0000-4000-8000-000000000001"
	tests := []struct {
		name    string
		backend Backend
		gpus    GPUSet
		pin     Pinning
		want    map[string]string // "" = must be absent
		wantTP  string            // "" = no flag
	}{
		{"unset, unpinned (no GPU facts)", VLLM, GPUSet{}, Pinning{},
			map[string]string{EnvCUDAVisibleDevices: "", EnvCUDADeviceOrder: "", EnvNCCLP2PDisable: ""}, ""},
		{"GPU 1", VLLM, GPUSet{Indices: []int{1}, Given: true}, Pinning{UUIDs: []string{u1}},
			map[string]string{EnvCUDAVisibleDevices: u1, EnvCUDADeviceOrder: "PCI_BUS_ID", EnvNCCLP2PDisable: ""}, ""},
		{"GPUs 0,1 with P2P", VLLM, GPUSet{Indices: []int{0, 1}, Given: true}, Pinning{UUIDs: []string{u0, u1}},
			map[string]string{EnvCUDAVisibleDevices: u0 + "," + u1, EnvCUDADeviceOrder: "PCI_BUS_ID", EnvNCCLP2PDisable: ""}, "2"},
		{"GPUs 0,1 without P2P", VLLM, GPUSet{Indices: []int{0, 1}, Given: true}, Pinning{UUIDs: []string{u0, u1}, P2PDisable: true},
			map[string]string{EnvCUDAVisibleDevices: u0 + "," + u1, EnvCUDADeviceOrder: "PCI_BUS_ID", EnvNCCLP2PDisable: "1"}, "2"},
		{"Ollama on GPU 1", Ollama, GPUSet{Indices: []int{1}, Given: true}, Pinning{UUIDs: []string{u1}},
			map[string]string{EnvCUDAVisibleDevices: u1, EnvCUDADeviceOrder: "PCI_BUS_ID"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Profile{Name: "p", Backend: tt.backend, Model: "m", Port: 8000, GPUs: tt.gpus}
			env := ParseEnvFile(PinnedEnvFile(p, false, tt.pin))
			for k, v := range tt.want {
				got, ok := env[k]
				if v == "" && ok {
					t.Errorf("%s = %q; want it absent", k, got)
				}
				if v != "" && got != v {
					t.Errorf("%s = %q; want %q", k, got, v)
				}
			}
			args := strings.Fields(env[EnvArgs])
			i := slices.Index(args, "--tensor-parallel-size")
			switch {
			case tt.wantTP == "" && i >= 0:
				t.Errorf("args %v carry --tensor-parallel-size; want none", args)
			case tt.wantTP != "" && (i < 0 || i+1 >= len(args) || args[i+1] != tt.wantTP):
				t.Errorf("args %v; want --tensor-parallel-size %s", args, tt.wantTP)
			}
			if EnvFile(p, false) != PinnedEnvFile(p, false, Pinning{}) {
				t.Error("EnvFile differs from an unpinned PinnedEnvFile")
			}
		})
	}
}

func TestGPUSetString(t *testing.T) {
	tests := []struct {
		g    GPUSet
		want string
	}{
		{GPUSet{}, "[0]"}, {GPUSet{Auto: true, Given: true}, "auto"}, {GPUSet{Indices: []int{0, 1}, Given: true}, "[0, 1]"},
	}
	for _, tt := range tests {
		if got := tt.g.String(); got != tt.want {
			t.Errorf("%+v.String() = %q; want %q", tt.g, got, tt.want)
		}
	}
}
