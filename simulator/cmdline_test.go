package simulator

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// env is a getenv over a fixed map, so the tests do not depend on (or set)
// the process environment.
func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func TestParseArgsFromUnitArgv(t *testing.T) {
	noEnv := env(nil)
	tests := []struct {
		name   string
		flavor string
		args   []string
		check  func(o Options) bool
	}{
		{"vllm argv with sim flags first", "vllm",
			[]string{"--sim-dir", "/x", "serve", "Qwen/Q", "--gpu-memory-utilization", "0.92", "--port", "8001", "--load-time", "1.5s", "--served-model-name", "q"},
			func(o Options) bool {
				return o.Model == "Qwen/Q" && o.GPUMemoryUtilization == 0.92 && o.Port == 8001 && o.LoadTime == 1500*time.Millisecond && o.SimDir == "/x" && o.ServedName == "q"
			}},
		{"= forms", "vllm", []string{"serve", "M", "--load-time=10ms", "--decode-tps=99", "--max-num-seqs=4"},
			func(o Options) bool {
				return o.LoadTime == 10*time.Millisecond && o.DecodeTPS == 99 && o.MaxNumSeqs == 4
			}},
		{"ollama models", "ollama", []string{"serve", "--model", "llama3.1:8b", "--vram-mib", "6200", "--port", "18434"},
			func(o Options) bool {
				return reflect.DeepEqual(o.Models, []string{"llama3.1:8b"}) && o.VRAMMiB == 6200 && o.Port == 18434
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := ParseArgs(tt.flavor, tt.args, noEnv)
			if err != nil || !tt.check(o) {
				t.Errorf("options = %+v, err %v", o, err)
			}
		})
	}
	if o, err := ParseArgs("ollama", []string{"serve"}, env(map[string]string{"OLLAMA_HOST": "127.0.0.1:19999"})); err != nil || o.Port != 19999 || o.Host != "127.0.0.1" {
		t.Errorf("OLLAMA_HOST not honoured: %+v %v", o, err)
	}
	if o, err := ParseArgs("ollama", []string{"serve", "--port", "1234"}, env(map[string]string{"OLLAMA_HOST": "http://0.0.0.0:19999"})); err != nil || o.Port != 1234 || o.Host != "0.0.0.0" {
		t.Errorf("--port over OLLAMA_HOST: %+v %v", o, err)
	}
	if o, err := ParseArgs("ollama", []string{"serve"}, env(map[string]string{"OLLAMA_CONTEXT_LENGTH": "8192"})); err != nil || o.MaxModelLen != 8192 {
		t.Errorf("OLLAMA_CONTEXT_LENGTH not honoured: %+v %v", o, err)
	}
	if o, err := ParseArgs("vllm", []string{"serve", "M"}, env(map[string]string{"OLLAMA_HOST": "nonsense", "OLLAMA_CONTEXT_LENGTH": "x"})); err != nil || o.Port != 0 || o.MaxModelLen != 0 {
		t.Errorf("vllm read Ollama's variables: %+v %v", o, err)
	}
	for _, bad := range []struct {
		flavor string
		args   []string
		env    map[string]string
		want   string
	}{
		{"llama.cpp", nil, nil, `want vllm or ollama`},
		{"vllm", []string{"serve", "M", "--load-time", "soon"}, nil, "load-time"},
		{"vllm", []string{"serve", "M", "--max-num-seqs", "many"}, nil, "--max-num-seqs"},
		{"ollama", []string{"serve", "--vram-mib", "lots"}, nil, "vram-mib"},
		{"ollama", []string{"serve"}, map[string]string{"OLLAMA_HOST": "nohost"}, "OLLAMA_HOST"},
		{"ollama", []string{"serve"}, map[string]string{"OLLAMA_HOST": "h:port"}, "OLLAMA_HOST"},
		{"ollama", []string{"serve"}, map[string]string{"OLLAMA_CONTEXT_LENGTH": "0"}, "OLLAMA_CONTEXT_LENGTH"},
		{"vllm", []string{"serve", "M"}, map[string]string{"VLLM_SERVER_DEV_MODE": "yes"}, "VLLM_SERVER_DEV_MODE"},
		{"vllm", []string{"serve", "M", "--h2d-gbps", "fast"}, nil, "h2d-gbps"},
		{"vllm", []string{"serve", "M", "--weights-mib", "1.5"}, nil, "weights-mib"},
	} {
		if _, err := ParseArgs(bad.flavor, bad.args, env(bad.env)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("simulate %s %v (env %v): err %v, want it to name %q", bad.flavor, bad.args, bad.env, err, bad.want)
		}
	}
}

// The sleep mode settings: --enable-sleep-mode is a `vllm serve` word,
// VLLM_SERVER_DEV_MODE is read as vLLM reads it (an integer), and the
// simulator's own sizes and rates are taken out before the serve words.
func TestParseArgsSleepMode(t *testing.T) {
	tests := []struct {
		name      string
		args      string
		env       map[string]string
		dev, mode bool
		residual  int
		weights   int
		h2d, rel  float64
	}{
		{name: "neither", args: "serve M"},
		{name: "env only", args: "serve M", env: map[string]string{"VLLM_SERVER_DEV_MODE": "1"}, dev: true},
		{name: "flag only", args: "serve M --enable-sleep-mode", mode: true},
		{name: "both, sim flags around the model", args: "--sleep-residual-mib 300 serve M --enable-sleep-mode --weights-mib=9000 --h2d-gbps 12.5 --reload-gbps=1",
			env: map[string]string{"VLLM_SERVER_DEV_MODE": " 2 "}, dev: true, mode: true, residual: 300, weights: 9000, h2d: 12.5, rel: 1},
		{name: "dev mode 0 is off", args: "serve M --enable-sleep-mode=false", env: map[string]string{"VLLM_SERVER_DEV_MODE": "0"}},
		{name: "no- form", args: "serve M --enable-sleep-mode --no-enable-sleep-mode"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := ParseArgs("vllm", strings.Fields(tt.args), env(tt.env))
			if err != nil {
				t.Fatal(err)
			}
			if o.Model != "M" || o.DevMode != tt.dev || o.EnableSleepMode != tt.mode || o.SleepResidualMiB != tt.residual ||
				o.WeightsMiB != tt.weights || o.H2DGBps != tt.h2d || o.ReloadGBps != tt.rel {
				t.Errorf("options = %+v", o)
			}
		})
	}
}

func FuzzParseArgs(f *testing.F) {
	f.Add("vllm", "--sim-dir /x serve M --port 8000 --load-time 1s")
	f.Add("ollama", "serve --model a:b --vram-mib 10")
	f.Add("vllm", "--model= --served-name")
	f.Fuzz(func(t *testing.T, flavor, argv string) {
		_, _ = ParseArgs(flavor, strings.Fields(argv), env(nil)) // must not panic
	})
}

func TestParseArgsFaultFlags(t *testing.T) {
	tests := []struct {
		flavor, argv    string
		schema, transcr string
		err             string
	}{
		{"vllm", "serve qwen3-coder --schema-fault prose-once --transcription-fault=error --port 8001", "prose-once", "error", ""},
		{"vllm", "--schema-fault invalid serve M", "invalid", "", ""},
		{"ollama", "serve --schema-fault=prose", "prose", "", ""},
		{"vllm", "serve M", "", "", ""},
		{"vllm", "serve M --tool-call-fault content --enable-auto-tool-choice", "", "", ""},
	}
	for _, tt := range tests {
		o, err := ParseArgs(tt.flavor, strings.Fields(tt.argv), env(nil))
		if err != nil {
			t.Fatalf("%s %s: %v", tt.flavor, tt.argv, err)
		}
		if o.SchemaFault != tt.schema || o.TranscriptionFault != tt.transcr {
			t.Errorf("%s %s: faults %q/%q, want %q/%q", tt.flavor, tt.argv, o.SchemaFault, o.TranscriptionFault, tt.schema, tt.transcr)
		}
		if want := strings.Contains(tt.argv, "--tool-call-fault content"); want != (o.ToolCallFault == "content") || (want && !o.EnableAutoToolChoice) {
			t.Errorf("%s: tool call fault %q, auto tool choice %v", tt.argv, o.ToolCallFault, o.EnableAutoToolChoice)
		}
		if tt.flavor == "vllm" && o.Model != strings.Fields(strings.SplitN(tt.argv, "serve ", 2)[1])[0] {
			t.Errorf("%s: model %q swallowed by a fault flag", tt.argv, o.Model)
		}
	}
}
