package appliance_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"gpuhost/api"
	"gpuhost/appliance/appliancetest"
	"gpuhost/config"
	"gpuhost/nvml"
	"gpuhost/units"
)

// A simulated 2-card box: a switch to a profile placed on GPU 1 pins the
// backend to GPU 1's UUID, the simulated backend's memory shows on GPU 1
// only, and /api/status's GPUs name the unit and profile holding it; the
// switch back to the unplaced profile lands on GPU 0 as before.
func TestSwitchToProfileOnGPU1(t *testing.T) {
	f := appliancetest.New(t, appliancetest.Options{Hook: func(c *config.Config) {
		c.GPU.Sim.Devices = make([]config.SimGPUDevice, 2)
		c.Profiles["llama"].GPUs = units.GPUSet{Indices: []int{1}, Given: true}
	}})
	ctx := context.Background()
	if _, err := f.SwitchTo(t, "llama"); err != nil {
		t.Fatal(err)
	}
	env := units.ParseEnvFile(readFile(t, f.Cfg.EnvFilePath(f.Cfg.BackendFor(units.Ollama).Unit)))
	if env[units.EnvCUDAVisibleDevices] != nvml.SimUUIDFor(1) || env[units.EnvCUDADeviceOrder] != "PCI_BUS_ID" {
		t.Errorf("ollama env = %v; want pinned to %s in PCI order", env, nvml.SimUUIDFor(1))
	}
	st := f.Sup.Status(ctx)
	if len(st.GPUs) != 2 {
		t.Fatalf("status GPUs = %+v; want 2", st.GPUs)
	}
	if g0 := st.GPUs[0]; len(g0.Holders) != 0 {
		t.Errorf("GPU 0 holders = %+v; want none", g0.Holders)
	}
	g1 := st.GPUs[1]
	if len(g1.Holders) != 1 || g1.Holders[0].Profile != "llama" || g1.Holders[0].Unit != "gpuhost-ollama.service" || g1.Holders[0].UsedMiB != 6200 {
		t.Errorf("GPU 1 holders = %+v; want llama on gpuhost-ollama.service with 6200 MiB", g1.Holders)
	}
	if !strings.Contains(g1.Line(), "llama (gpuhost-ollama.service) 6200 MiB") {
		t.Errorf("GPU 1 line = %q", g1.Line())
	}

	if _, err := f.SwitchTo(t, "coder"); err != nil {
		t.Fatal(err)
	}
	st = f.Sup.Status(ctx)
	if h := st.GPUs[0].Holders; len(h) != 1 || h[0].Profile != "coder" {
		t.Errorf("GPU 0 holders after the switch back = %+v; want coder", h)
	}
	env = units.ParseEnvFile(readFile(t, f.Cfg.EnvFilePath(f.Cfg.BackendFor(units.VLLM).Unit)))
	if env[units.EnvCUDAVisibleDevices] != nvml.SimUUID || strings.Contains(env[units.EnvArgs], "tensor-parallel") {
		t.Errorf("vllm env = %v; want GPU 0's UUID and no tensor parallel flag", env)
	}
}

// A GPU the box does not have refuses the switch before anything stops,
// naming the profile and the key.
func TestSwitchToMissingGPUIsRefused(t *testing.T) {
	f := appliancetest.New(t, appliancetest.Options{Activate: "coder", Hook: func(c *config.Config) {
		c.Profiles["llama"].GPUs = units.GPUSet{Indices: []int{1}, Given: true}
	}})
	_, _, err := f.Sup.Switch(context.Background(), "llama", apiSwitchOptions())
	if err == nil || !strings.Contains(err.Error(), "profiles.llama.gpus[0]: GPU 1 is not present") {
		t.Fatalf("switch to a missing GPU: %v; want the placement refusal", err)
	}
	if st := f.Sup.State(); st.Profile != "coder" {
		t.Errorf("after the refusal the active profile is %q; want coder still", st.Profile)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func apiSwitchOptions() api.SwitchOptions { return api.SwitchOptions{Force: true} }

// The doctor on a simulated 2-card box: every GPU's driver view, each
// profile's placement, the P2P decision of a tensor-parallel profile with
// its reason, a GPU that is not there as a failure, and the running
// backend pinned by UUID in PCI order.
func TestDoctorOnTwoGPUs(t *testing.T) {
	f := appliancetest.New(t, appliancetest.Options{Activate: "llama", Hook: func(c *config.Config) {
		c.GPU.Sim.Devices = make([]config.SimGPUDevice, 2)
		c.Profiles["llama"].GPUs = units.GPUSet{Indices: []int{1}, Given: true}
		c.Profiles["coder"].GPUs = units.GPUSet{Indices: []int{0, 1}, Given: true}
		c.Profiles["coder-greedy"].GPUs = units.GPUSet{Indices: []int{2}, Given: true}
	}})
	rep := f.Doctor(context.Background(), "")
	find := func(id, profile, value string) (api.DoctorCheck, bool) {
		for _, c := range rep.Checks {
			if c.ID == id && c.Profile == profile && (value == "" || c.Value == value) {
				return c, true
			}
		}
		return api.DoctorCheck{}, false
	}
	tests := []struct {
		id, profile, value string
		sev                units.Severity
		says               string
	}{
		{"gpu.device", "", "GPU 0", units.SeverityOK, nvml.SimUUIDFor(0)},
		{"gpu.device", "", "GPU 1", units.SeverityOK, "PCI 00000000:02:00.0"},
		{"gpus", "llama", "", units.SeverityOK, "runs on GPU [1]"},
		{"gpus", "coder", "", units.SeverityOK, "runs on GPU [0, 1]"},
		{"gpus.p2p", "coder", "NCCL_P2P_DISABLE=1", units.SeverityOK, "GPU 0–1 gpu_not_supported"},
		{"gpus", "coder-greedy", "", units.SeverityFail, "GPU 2 is not present"},
		{"gpus.pinning", "llama", "", units.SeverityOK, "pinned to GPU 1 by UUID, CUDA_DEVICE_ORDER=PCI_BUS_ID"},
	}
	for _, tt := range tests {
		c, ok := find(tt.id, tt.profile, tt.value)
		if !ok || c.Severity != tt.sev || !strings.Contains(c.Message, tt.says) {
			t.Errorf("%s %s %s = %+v (found %v); want %s saying %q", tt.id, tt.profile, tt.value, c, ok, tt.sev, tt.says)
		}
	}
}

// A backend in standby on GPU 1 keeps its residual there: the residual is
// measured (and then watched) on the GPUs its unit holds memory on, not
// on GPU 0 alone.
func TestStandbyResidualOnGPU1(t *testing.T) {
	f := appliancetest.New(t, appliancetest.Options{Activate: "coder", Hook: func(c *config.Config) {
		c.GPU.Sim.Devices = make([]config.SimGPUDevice, 2)
		c.Profiles["coder"].GPUs = units.GPUSet{Indices: []int{1}, Given: true}
		c.Profiles["coder"].Standby = units.StandbyAuto
	}})
	if _, err := f.SwitchTo(t, "llama"); err != nil {
		t.Fatal(err)
	}
	st := f.Sup.Status(context.Background())
	if len(st.State.Standby) != 1 || st.State.Standby[0].Profile != "coder" || st.State.Standby[0].ResidualMiB == 0 {
		t.Fatalf("standby = %+v; want coder with a measured residual", st.State.Standby)
	}
	var onGPU1 uint64
	for _, h := range st.GPUs[1].Holders {
		if h.Profile == "coder" {
			onGPU1 += h.UsedMiB
		}
	}
	if onGPU1 != st.State.Standby[0].ResidualMiB {
		t.Errorf("coder holds %d MiB on GPU 1; its recorded residual is %d", onGPU1, st.State.Standby[0].ResidualMiB)
	}
}
