package units

import (
	"strings"
	"testing"
)

func TestStandbyValidation(t *testing.T) {
	tests := []struct {
		backend Backend
		mode    Standby
		wantErr string
	}{
		{VLLM, "", ""},
		{VLLM, StandbyOff, ""},
		{VLLM, StandbyAuto, ""},
		{VLLM, StandbySleep1, ""},
		{VLLM, StandbySleep2, ""},
		{VLLM, StandbyUnload, `"unload" is not a standby mode for vllm (one of: off, auto, sleep1, sleep2)`},
		{Ollama, StandbyUnload, ""},
		{Ollama, StandbyAuto, ""},
		{Ollama, StandbySleep1, `"sleep1" is not a standby mode for ollama (one of: off, auto, unload)`},
		{VLLM, "sleep3", `"sleep3" is not a standby mode`},
	}
	for _, tt := range tests {
		p := Profile{Backend: tt.backend, Model: "m", Port: 8000, Standby: tt.mode}
		var got string
		for _, fe := range p.Validate() {
			if fe.Key == "standby" {
				got = fe.Msg
			}
		}
		if tt.wantErr == "" && got != "" || tt.wantErr != "" && !strings.Contains(got, tt.wantErr) {
			t.Errorf("%s standby %q: error %q, want %q", tt.backend, tt.mode, got, tt.wantErr)
		}
	}
}

func TestStandbyArgsAndEnv(t *testing.T) {
	p := Profile{Name: "coder", Backend: VLLM, Model: "org/m", Port: 8000, Standby: StandbyAuto}
	args := strings.Join(VLLMArgs(p), " ")
	if !strings.Contains(args, "--enable-sleep-mode --host 127.0.0.1") {
		t.Errorf("standby profile's argv lacks sleep mode on loopback: %s", args)
	}
	if env := EnvFile(p, false); !strings.Contains(env, EnvVLLMDevMode+"=1\n") {
		t.Errorf("standby profile's env file lacks %s=1:\n%s", EnvVLLMDevMode, env)
	}
	p.VLLM.ExtraArgs = []string{"--host=::1"}
	if args := strings.Join(VLLMArgs(p), " "); strings.Contains(args, "127.0.0.1") {
		t.Errorf("an explicit --host is overridden: %s", args)
	}
	p.Standby = StandbyOff
	if args, env := strings.Join(VLLMArgs(p), " "), EnvFile(p, false); strings.Contains(args, "sleep") || strings.Contains(env, EnvVLLMDevMode) {
		t.Errorf("standby off still enables sleep mode: %s / %s", args, env)
	}
}

func TestStandbyFit(t *testing.T) {
	gpu := GPUFacts{TotalMiB: 24564, Name: "NVIDIA GeForce RTX 4090", ReservedMiB: 1024}
	p := Profile{Name: "coder", Backend: VLLM, Model: "org/m", Port: 8000}
	p.VLLM.GPUMemoryUtilization = 0.92
	cs := standbyFitChecks(p, gpu)
	if len(cs) != 1 || cs[0].Severity != SeverityOK {
		t.Fatalf("0.92 of 24564 MiB leaves 1965 MiB for a 1024 MiB residual: %+v", cs)
	}
	gpu.ReservedMiB = 4864 // the largest residual reported for a sleeping vLLM
	cs = standbyFitChecks(p, gpu)
	if len(cs) != 1 || cs[0].Severity != SeverityFail || !strings.Contains(cs[0].Fix, "gpu_memory_utilization to at most 0.") {
		t.Fatalf("0.92 with a 4864 MiB residual must fail with a fix: %+v", cs)
	}
	if cs := standbyFitChecks(p, GPUFacts{TotalMiB: 24564}); cs != nil {
		t.Errorf("no residual, no check: %+v", cs)
	}
}
