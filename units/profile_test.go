package units

import (
	"math"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// qwenCoder is the reference profile from the reference box (RTX 4090).
func qwenCoder() Profile {
	return Profile{
		Name:    "coder",
		Backend: VLLM,
		Model:   "cpatonn/Qwen3-Coder-30B-A3B-Instruct-AWQ-4bit",
		Port:    8000,
		VLLM: VLLMFlags{
			GPUMemoryUtilization: 0.92,
			MaxNumSeqs:           32,
			MaxModelLen:          32768,
			EnableAutoToolChoice: true,
			ToolCallParser:       "qwen3_xml",
		},
		Params: ModelParams{TotalParamsB: 30.5, ActiveParamsB: 3.3, WeightBits: 4, Layers: 48, KVHeads: 4, HeadDim: 128},
	}
}

func llamaOllama() Profile {
	return Profile{
		Name:    "llama",
		Backend: Ollama,
		Model:   "llama3.1:8b",
		Port:    11434,
		Ollama:  OllamaOpts{NumCtx: 8192},
	}
}

func TestProfileYAMLTags(t *testing.T) {
	const doc = `
backend: vllm
model: Qwen/Qwen3-Coder-30B-A3B-Instruct
served_name: coder
port: 8000
vllm:
  gpu_memory_utilization: 0.92
  max_num_seqs: 32
  max_model_len: 32768
  enable_auto_tool_choice: true
  tool_call_parser: qwen3_xml
  quantization: awq_marlin
  kv_cache_dtype: fp8
  extra_args: [--enable-prefix-caching]
ollama:
  num_ctx: 4096
  keep_alive: 5m
model_params:
  total_params_b: 30.5
  active_params_b: 3.3
  weight_bits: 4
  layers: 48
  kv_heads: 4
  head_dim: 128
  kv_bytes: 1
sim:
  load_time: 1.5s
  prefill_tps: 2500
  decode_tps: 60
  vram_mib: 20000
`
	var p Profile
	dec := yaml.NewDecoder(strings.NewReader(doc))
	dec.KnownFields(true)
	if err := dec.Decode(&p); err != nil {
		t.Fatalf("decoding profile YAML: %v", err)
	}
	want := Profile{
		Backend: VLLM, Model: "Qwen/Qwen3-Coder-30B-A3B-Instruct", ServedName: "coder", Port: 8000,
		VLLM: VLLMFlags{GPUMemoryUtilization: 0.92, MaxNumSeqs: 32, MaxModelLen: 32768, EnableAutoToolChoice: true,
			ToolCallParser: "qwen3_xml", Quantization: "awq_marlin", KVCacheDtype: "fp8", ExtraArgs: []string{"--enable-prefix-caching"}},
		Ollama: OllamaOpts{NumCtx: 4096, KeepAlive: "5m"},
		Params: ModelParams{TotalParamsB: 30.5, ActiveParamsB: 3.3, WeightBits: 4, Layers: 48, KVHeads: 4, HeadDim: 128, KVBytes: 1},
		Sim:    SimOpts{LoadTime: "1.5s", PrefillTPS: 2500, DecodeTPS: 60, VRAMMiB: 20000},
	}
	if !profilesEqual(p, want) {
		t.Errorf("decoded %+v\nwant    %+v", p, want)
	}
}

func profilesEqual(a, b Profile) bool {
	return a.Name == b.Name && a.Backend == b.Backend && a.Model == b.Model && a.ServedName == b.ServedName &&
		a.Port == b.Port && flagsEqual(a.VLLM, b.VLLM) && a.Ollama == b.Ollama && a.Params == b.Params && a.Sim == b.Sim
}

func flagsEqual(a, b VLLMFlags) bool {
	return a.GPUMemoryUtilization == b.GPUMemoryUtilization && a.MaxNumSeqs == b.MaxNumSeqs &&
		a.MaxModelLen == b.MaxModelLen && a.EnableAutoToolChoice == b.EnableAutoToolChoice &&
		a.ToolCallParser == b.ToolCallParser && a.Quantization == b.Quantization &&
		a.KVCacheDtype == b.KVCacheDtype && slices.Equal(a.ExtraArgs, b.ExtraArgs)
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name    string
		mod     func(*Profile)
		base    func() Profile
		wantKey []string // nil = valid
	}{
		{name: "reference vllm profile", base: qwenCoder},
		{name: "reference ollama profile", base: llamaOllama},
		{name: "vllm defaults left to vLLM", base: qwenCoder, mod: func(p *Profile) { p.VLLM = VLLMFlags{} }},
		{name: "unknown backend", base: qwenCoder, mod: func(p *Profile) { p.Backend = "tgi" }, wantKey: []string{"backend"}},
		{name: "missing backend", base: qwenCoder, mod: func(p *Profile) { p.Backend = ""; p.VLLM = VLLMFlags{} }, wantKey: []string{"backend"}},
		{name: "empty model", base: qwenCoder, mod: func(p *Profile) { p.Model = "" }, wantKey: []string{"model"}},
		{name: "model with space", base: qwenCoder, mod: func(p *Profile) { p.Model = "my model" }, wantKey: []string{"model"}},
		{name: "model with quote", base: qwenCoder, mod: func(p *Profile) { p.Model = `a"b` }, wantKey: []string{"model"}},
		{name: "model looks like a flag", base: qwenCoder, mod: func(p *Profile) { p.Model = "--x" }, wantKey: []string{"model"}},
		{name: "served name with tab", base: qwenCoder, mod: func(p *Profile) { p.ServedName = "a\tb" }, wantKey: []string{"served_name"}},
		{name: "served name looks like a flag", base: qwenCoder, mod: func(p *Profile) { p.ServedName = "-c" }, wantKey: []string{"served_name"}},
		{name: "port zero", base: qwenCoder, mod: func(p *Profile) { p.Port = 0 }, wantKey: []string{"port"}},
		{name: "port too big", base: llamaOllama, mod: func(p *Profile) { p.Port = 70000 }, wantKey: []string{"port"}},
		{name: "util above one", base: qwenCoder, mod: func(p *Profile) { p.VLLM.GPUMemoryUtilization = 1.2 }, wantKey: []string{"vllm.gpu_memory_utilization"}},
		{name: "util negative", base: qwenCoder, mod: func(p *Profile) { p.VLLM.GPUMemoryUtilization = -0.1 }, wantKey: []string{"vllm.gpu_memory_utilization"}},
		{name: "util NaN", base: qwenCoder, mod: func(p *Profile) { p.VLLM.GPUMemoryUtilization = math.NaN() }, wantKey: []string{"vllm.gpu_memory_utilization"}},
		{name: "util exactly one", base: qwenCoder, mod: func(p *Profile) { p.VLLM.GPUMemoryUtilization = 1 }},
		{name: "negative seqs and len", base: qwenCoder, mod: func(p *Profile) { p.VLLM.MaxNumSeqs = -1; p.VLLM.MaxModelLen = -2 },
			wantKey: []string{"vllm.max_num_seqs", "vllm.max_model_len"}},
		{name: "parser with space", base: qwenCoder, mod: func(p *Profile) { p.VLLM.ToolCallParser = "qwen3 xml" }, wantKey: []string{"vllm.tool_call_parser"}},
		{name: "extra arg with space", base: qwenCoder, mod: func(p *Profile) { p.VLLM.ExtraArgs = []string{"--foo", "a b"} }, wantKey: []string{"vllm.extra_args[1]"}},
		{name: "extra arg with backslash", base: qwenCoder, mod: func(p *Profile) { p.VLLM.ExtraArgs = []string{`--x\y`} }, wantKey: []string{"vllm.extra_args[0]"}},
		{name: "extra arg empty", base: qwenCoder, mod: func(p *Profile) { p.VLLM.ExtraArgs = []string{"--a", ""} }, wantKey: []string{"vllm.extra_args[1]"}},
		{name: "extra args start with a plain word", base: qwenCoder, mod: func(p *Profile) { p.VLLM.ExtraArgs = []string{"foo"} }, wantKey: []string{"vllm.extra_args[0]"}},
		{name: "extra args set a managed flag", base: qwenCoder, mod: func(p *Profile) { p.VLLM.ExtraArgs = []string{"--enforce-eager", "--port=9"} }, wantKey: []string{"vllm.extra_args[1]"}},
		{name: "extra args set a managed flag with underscores", base: qwenCoder, mod: func(p *Profile) { p.VLLM.ExtraArgs = []string{"--max_num_seqs", "4"} }, wantKey: []string{"vllm.extra_args[0]"}},
		{name: "extra args set quantization by alias", base: qwenCoder, mod: func(p *Profile) { p.VLLM.ExtraArgs = []string{"-q", "awq"} }, wantKey: []string{"vllm.extra_args[0]"}},
		{name: "extra args fine", base: qwenCoder, mod: func(p *Profile) {
			p.VLLM.ExtraArgs = []string{"--enable-prefix-caching", "--tensor-parallel-size", "1", "--host=127.0.0.1"}
		}},
		{name: "extra args bind every interface", base: qwenCoder, mod: func(p *Profile) { p.VLLM.ExtraArgs = []string{"--enforce-eager", "--host", "0.0.0.0"} }, wantKey: []string{"vllm.extra_args[1]"}},
		{name: "extra args bind a LAN address", base: qwenCoder, mod: func(p *Profile) { p.VLLM.ExtraArgs = []string{"--host=192.168.1.5"} }, wantKey: []string{"vllm.extra_args[0]"}},
		{name: "extra args --host without value", base: qwenCoder, mod: func(p *Profile) { p.VLLM.ExtraArgs = []string{"--host"} }, wantKey: []string{"vllm.extra_args[0]"}},
		{name: "extra args --host ::1 and localhost", base: qwenCoder, mod: func(p *Profile) { p.VLLM.ExtraArgs = []string{"--host", "::1", "--host=localhost"} }},
		{name: "extra args with shell or systemd syntax", base: qwenCoder, mod: func(p *Profile) {
			p.VLLM.ExtraArgs = []string{"--a=$(id)", "--b=`id`", "--c=$HOME", "--d=x;y", "--e=%n", "--f=ok"}
		}, wantKey: []string{"vllm.extra_args[0]", "vllm.extra_args[1]", "vllm.extra_args[2]", "vllm.extra_args[3]", "vllm.extra_args[4]"}},
		{name: "parser not vLLM's", base: qwenCoder, mod: func(p *Profile) { p.VLLM.ToolCallParser = "qwen3_xml;id" }, wantKey: []string{"vllm.tool_call_parser"}},
		{name: "parser unknown", base: qwenCoder, mod: func(p *Profile) { p.VLLM.ToolCallParser = "qwen4" }, wantKey: []string{"vllm.tool_call_parser"}},
		{name: "parser from a plugin", base: qwenCoder, mod: func(p *Profile) {
			p.VLLM.ToolCallParser = "my_parser"
			p.VLLM.ExtraArgs = []string{"--tool-parser-plugin=/opt/p.py"}
		}},
		{name: "plugin parser still a plain name", base: qwenCoder, mod: func(p *Profile) {
			p.VLLM.ToolCallParser = "a/b"
			p.VLLM.ExtraArgs = []string{"--tool-parser-plugin", "/opt/p.py"}
		}, wantKey: []string{"vllm.tool_call_parser"}},
		{name: "served name a client would expand", base: qwenCoder, mod: func(p *Profile) { p.ServedName = "{env:HOME}" }, wantKey: []string{"served_name"}},
		{name: "served name with $ and %", base: qwenCoder, mod: func(p *Profile) { p.ServedName = "${PATH}%n" }, wantKey: []string{"served_name"}},
		{name: "model a client would expand", base: llamaOllama, mod: func(p *Profile) { p.Model = "{file:/etc/shadow}" }, wantKey: []string{"model"}},
		{name: "alias a client would expand", base: llamaOllama, mod: func(p *Profile) { p.Aliases = []string{"fast", "{env:X}"} }, wantKey: []string{"aliases[1]"}},
		{name: "ollama options on a vllm profile", base: qwenCoder, mod: func(p *Profile) { p.Ollama.NumCtx = 4096 }, wantKey: []string{"ollama"}},
		{name: "vllm flags on an ollama profile", base: llamaOllama, mod: func(p *Profile) { p.VLLM.MaxNumSeqs = 4 }, wantKey: []string{"vllm"}},
		{name: "negative num_ctx", base: llamaOllama, mod: func(p *Profile) { p.Ollama.NumCtx = -1 }, wantKey: []string{"ollama.num_ctx"}},
		{name: "keep_alive seconds", base: llamaOllama, mod: func(p *Profile) { p.Ollama.KeepAlive = "3600" }},
		{name: "keep_alive duration", base: llamaOllama, mod: func(p *Profile) { p.Ollama.KeepAlive = "30m" }},
		{name: "keep_alive garbage", base: llamaOllama, mod: func(p *Profile) { p.Ollama.KeepAlive = "forever" }, wantKey: []string{"ollama.keep_alive"}},
		{name: "bad sim duration", base: qwenCoder, mod: func(p *Profile) { p.Sim.LoadTime = "1.5" }, wantKey: []string{"sim.load_time"}},
		{name: "negative sim duration", base: qwenCoder, mod: func(p *Profile) { p.Sim.LoadTime = "-1s" }, wantKey: []string{"sim.load_time"}},
		{name: "negative sim rates and vram", base: qwenCoder, mod: func(p *Profile) { p.Sim.PrefillTPS = -1; p.Sim.DecodeTPS = math.Inf(1); p.Sim.VRAMMiB = -5 },
			wantKey: []string{"sim.prefill_tps", "sim.decode_tps", "sim.vram_mib"}},
		{name: "active above total", base: qwenCoder, mod: func(p *Profile) { p.Params.ActiveParamsB = 40 }, wantKey: []string{"model_params.active_params_b"}},
		{name: "weight bits absurd", base: qwenCoder, mod: func(p *Profile) { p.Params.WeightBits = 64 }, wantKey: []string{"model_params.weight_bits"}},
		{name: "negative layers", base: qwenCoder, mod: func(p *Profile) { p.Params.Layers = -48 }, wantKey: []string{"model_params.layers"}},
		{name: "bad profile name", base: qwenCoder, mod: func(p *Profile) { p.Name = "my coder" }, wantKey: []string{"name"}},
		{name: "several problems reported together", base: qwenCoder, mod: func(p *Profile) { p.Model = ""; p.Port = -1; p.VLLM.GPUMemoryUtilization = 2 },
			wantKey: []string{"model", "port", "vllm.gpu_memory_utilization"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.base()
			if tc.mod != nil {
				tc.mod(&p)
			}
			errs := p.Validate()
			var keys []string
			for _, e := range errs {
				keys = append(keys, e.Key)
				if e.Msg == "" || !strings.HasPrefix(e.Error(), e.Key+": ") {
					t.Errorf("error %#v: want a message and Error() prefixed with the key, got %q", e, e.Error())
				}
			}
			if !slices.Equal(keys, tc.wantKey) {
				t.Errorf("Validate() keys = %q, want %q; errors: %v", keys, tc.wantKey, errs)
			}
		})
	}
}

func TestValidProfileName(t *testing.T) {
	for _, ok := range []string{"coder", "qwen3-coder_30b.awq", "A1"} {
		if err := ValidProfileName(ok); err != nil {
			t.Errorf("ValidProfileName(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{"", "-x", ".x", "a b", "a/b", "ä", strings.Repeat("a", 65)} {
		if err := ValidProfileName(bad); err == nil {
			t.Errorf("ValidProfileName(%q) = nil, want an error", bad)
		}
	}
}

func TestDefaults(t *testing.T) {
	p := qwenCoder()
	if got := p.ServedModelName(); got != p.Model {
		t.Errorf("ServedModelName() with no served_name = %q, want the model %q", got, p.Model)
	}
	p.ServedName = "coder"
	if got := p.ServedModelName(); got != "coder" {
		t.Errorf("ServedModelName() = %q, want coder", got)
	}
	if got := (OllamaOpts{}).EffectiveKeepAlive(); got != "-1" {
		t.Errorf("default keep alive = %q, want -1", got)
	}
	if got := (OllamaOpts{KeepAlive: "5m"}).EffectiveKeepAlive(); got != "5m" {
		t.Errorf("keep alive = %q, want 5m", got)
	}
	if !p.Params.IsMoE() {
		t.Error("Qwen3-Coder-30B-A3B (3.3B of 30.5B active) should count as MoE")
	}
	if (ModelParams{TotalParamsB: 27}).IsMoE() {
		t.Error("a model without active_params_b should count as dense")
	}
}
