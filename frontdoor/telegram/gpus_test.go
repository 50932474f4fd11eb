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

// /gpu status on a box whose profiles run on several GPU sets has one line
// per lane saying what serves there (the per-GPU lines stay); a box of one
// lane has none.
func TestFormatStatusPerLane(t *testing.T) {
	dev := func(i int) nvml.Device {
		return nvml.Device{Index: i, Name: "NVIDIA GeForce RTX 4090", UUID: nvml.SimUUIDFor(i), MemoryTotalMiB: 24564}
	}
	gpu0 := api.State{Lane: "GPU 0", GPUs: []int{0}, Phase: api.PhaseSwitching, Target: "gemma3-27b", Step: api.StepVRAMRelease,
		Standby: []api.StandbyInfo{{Profile: "qwen3-coder", Mode: "sleep1"}}}
	lanes := []api.State{
		gpu0,
		{Lane: "GPU 1", GPUs: []int{1}, Phase: api.PhaseActive, Profile: "llama3-8b", Backend: "ollama"},
		{Lane: "GPU 0+1", GPUs: []int{0, 1}, Phase: api.PhaseIdle, LastWanted: "gemma3-27b-tp", NotServing: "nothing runs although it is wanted"},
	}
	head := gpu0
	head.Lanes = lanes
	tests := []struct {
		name        string
		state       api.State
		want, avoid []string
	}{
		{"three lanes", head, []string{
			"🔄 switching to gemma3-27b (step vram_release)\n🔄 GPU 0: switching to gemma3-27b: vram_release · qwen3-coder in standby (sleep1)\n" +
				"🟢 GPU 1: active: llama3-8b (ollama)\n🔴 GPU 0+1: idle; NOT SERVING: nothing runs although it is wanted\n",
			"GPU 0 NVIDIA GeForce RTX 4090 (GPU-5a1f4090…) 0.0/24.0 GiB: free",
			"GPU 1 NVIDIA GeForce RTX 4090 (GPU-5a1f4091…) 0.0/24.0 GiB: free",
		}, nil},
		{"one lane", api.State{Phase: api.PhaseActive, Profile: "llama3-8b", Backend: "ollama"},
			[]string{"🟢 llama3-8b · ollama\n"}, []string{"GPU 0:", "GPU 1:", "lane"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := api.Status{State: tc.state, GPU: &nvml.Snapshot{Backend: "sim", Devices: []nvml.Device{dev(0), dev(1)}},
				GPUs: []api.GPUStatus{{Index: 0, Name: "NVIDIA GeForce RTX 4090", UUID: nvml.SimUUIDFor(0), MemoryTotalMiB: 24564},
					{Index: 1, Name: "NVIDIA GeForce RTX 4090", UUID: nvml.SimUUIDFor(1), MemoryTotalMiB: 24564}}}
			got := formatStatus(st, health{}, time.Now())
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("status lacks %q:\n%s", w, got)
				}
			}
			for _, a := range tc.avoid {
				if strings.Contains(got, a) {
					t.Errorf("status has %q:\n%s", a, got)
				}
			}
		})
	}
}
