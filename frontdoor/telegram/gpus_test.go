package telegram

import (
	"strings"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/nvml"
)

// /gpu status on a box with two GPUs has one line per GPU naming who holds
// memory on it; with one GPU it has none of those lines.
func TestFormatStatusPerGPU(t *testing.T) {
	dev := func(i int, used uint64) nvml.Device {
		return nvml.Device{Index: i, Name: "NVIDIA GeForce RTX 4090", UUID: nvml.SimUUIDFor(i), MemoryUsedMiB: used, MemoryTotalMiB: 24564}
	}
	gpus := []api.GPUStatus{
		{Index: 0, Name: "NVIDIA GeForce RTX 4090", UUID: nvml.SimUUIDFor(0), MemoryUsedMiB: 18, MemoryTotalMiB: 24564, Holders: []api.GPUHolder{}},
		{Index: 1, Name: "NVIDIA GeForce RTX 4090", UUID: nvml.SimUUIDFor(1), MemoryUsedMiB: 6218, MemoryTotalMiB: 24564,
			Holders: []api.GPUHolder{{PID: 7, Name: "ollama", UsedMiB: 6200, Unit: "gpuhost-ollama.service", Profile: "llama"}}},
	}
	st := api.Status{State: api.State{Phase: api.PhaseActive, Profile: "llama"},
		GPU: &nvml.Snapshot{Backend: "sim", Devices: []nvml.Device{dev(0, 18), dev(1, 6218)}}, GPUs: gpus}
	got := formatStatus(st, health{}, time.Now())
	for _, want := range []string{"GPU 0 NVIDIA GeForce RTX 4090 (GPU-5a1f4090…) 0.0/24.0 GiB: free", "GPU 1 NVIDIA GeForce RTX 4090 (GPU-5a1f4091…) 6.1/24.0 GiB: llama (gpuhost-ollama.service) 6200 MiB"} {
		if !strings.Contains(got, want) {
			t.Errorf("status lacks %q:\n%s", want, got)
		}
	}
	st.GPU.Devices, st.GPUs = st.GPU.Devices[:1], st.GPUs[:1]
	if got := formatStatus(st, health{}, time.Now()); strings.Contains(got, "GPU 0 ") {
		t.Errorf("one GPU got per-GPU lines:\n%s", got)
	}
}
