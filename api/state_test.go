package api

import "testing"

// LaneLine says what serves on a lane: its name, the phase line, the
// profiles in standby and why its wanted profile does not serve.
func TestLaneLine(t *testing.T) {
	tests := []struct {
		name string
		lane State
		want string
	}{
		{"active", State{Lane: "GPU 1", GPUs: []int{1}, Phase: PhaseActive, Profile: "llama3-8b", Backend: "ollama"},
			"GPU 1: active: llama3-8b (ollama)"},
		{"switching", State{Lane: "GPU 0", Phase: PhaseSwitching, Target: "gemma3-27b", Step: StepVRAMRelease},
			"GPU 0: switching to gemma3-27b: vram_release"},
		{"idle", State{Lane: "GPU 0+1", GPUs: []int{0, 1}, Phase: PhaseIdle}, "GPU 0+1: idle"},
		{"active with standby", State{Lane: "GPU 0", Phase: PhaseActive, Profile: "gemma3-27b", Backend: "vllm",
			Standby: []StandbyInfo{{Profile: "qwen3-coder", Mode: "sleep1"}}},
			"GPU 0: active: gemma3-27b (vllm) · qwen3-coder in standby (sleep1)"},
		{"idle with standby", State{Lane: "GPU 1", Phase: PhaseIdle, Standby: []StandbyInfo{{Profile: "llama3-8b", Mode: "unload"}}},
			"GPU 1: idle · llama3-8b in standby (unload)"},
		{"not serving", State{Lane: "GPU 1", Phase: PhaseIdle, LastWanted: "llama3-8b", NotServing: "crash loop: 5 restarts"},
			"GPU 1: idle; NOT SERVING: crash loop: 5 restarts"},
		{"failed", State{Lane: "GPU 0", Phase: PhaseFailed, Error: "start: boom"}, "GPU 0: failed: start: boom"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := LaneLine(tc.lane); got != tc.want {
				t.Errorf("LaneLine = %q, want %q", got, tc.want)
			}
		})
	}
}
