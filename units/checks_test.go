package units

import (
	"strings"
	"testing"
)

var (
	rtx4090 = GPUFacts{TotalMiB: 24564, Name: "NVIDIA GeForce RTX 4090"}
	h100    = GPUFacts{TotalMiB: 81559, Name: "NVIDIA H100 80GB HBM3"}
	noGPU   = GPUFacts{}
)

func TestEstimateVRAMQwen3Coder(t *testing.T) {
	p := qwenCoder()
	weights, perTok, total := EstimateVRAM(p)
	// 48 layers × 4 KV heads × 128 head dim × 2 bytes (bf16) × 2 (K and V).
	if perTok != 96*1024 {
		t.Errorf("KV per token = %v bytes, want exactly 96 KiB (98304)", perTok)
	}
	if total != 96*1024*32768 {
		t.Errorf("KV for one 32768-token sequence = %v, want 3 GiB", total)
	}
	if weights != 30.5e9*4/8 {
		t.Errorf("weights = %v, want 15.25e9 bytes (30.5B × 4 bit)", weights)
	}

	p.VLLM.KVCacheDtype = "fp8_e4m3"
	if _, perTok, _ := EstimateVRAM(p); perTok != 48*1024 {
		t.Errorf("fp8 KV per token = %v, want 48 KiB", perTok)
	}
	p.Params.KVBytes = 2 // an explicit kv_bytes wins over the dtype guess
	if _, perTok, _ := EstimateVRAM(p); perTok != 96*1024 {
		t.Errorf("explicit kv_bytes 2: KV per token = %v, want 96 KiB", perTok)
	}
	p.Params.WeightBits = 0
	if w, _, _ := EstimateVRAM(p); w != 30.5e9*2 {
		t.Errorf("weights with weight_bits unset = %v, want bf16 (61e9)", w)
	}

	o := llamaOllama()
	o.Params = ModelParams{TotalParamsB: 8, WeightBits: 4.5, Layers: 32, KVHeads: 8, HeadDim: 128}
	if _, _, kv := EstimateVRAM(o); kv != 2*32*8*128*2*8192 {
		t.Errorf("Ollama KV = %v, want per-token × num_ctx 8192", kv)
	}
	o.Ollama.NumCtx = 0
	if _, _, kv := EstimateVRAM(o); kv != 2*32*8*128*2*OllamaDefaultNumCtx {
		t.Errorf("Ollama KV with num_ctx unset = %v, want per-token × %d", kv, OllamaDefaultNumCtx)
	}
}

func TestDefaultPolicy(t *testing.T) {
	pol := DefaultPolicy()
	if err := pol.Validate(); err != nil {
		t.Fatalf("DefaultPolicy().Validate() = %v", err)
	}
	for _, tc := range []struct {
		total uint64
		moe   bool
		want  float64
	}{{24564, true, 0.92}, {24564, false, 0.92}, {25000, true, 0.92}, {81559, true, 0.95}, {81559, false, 0.95}} {
		r, ok := pol.utilRule(tc.total, tc.moe)
		if !ok || r.Ceiling != tc.want {
			t.Errorf("util ceiling for %d MiB (moe %v) = %v (%v), want %v", tc.total, tc.moe, r.Ceiling, ok, tc.want)
		}
	}
	if r, ok := pol.seqRule(24564); !ok || r.Ceiling != 32 {
		t.Errorf("max_num_seqs ceiling on a 4090 = %v (%v), want 32", r.Ceiling, ok)
	}
	if _, ok := pol.seqRule(81559); ok {
		t.Error("max_num_seqs ceiling on an 80 GB card: want none")
	}
}

func TestPolicyValidate(t *testing.T) {
	for _, bad := range []Policy{
		{UtilCeiling: []UtilRule{{Ceiling: 0}}},
		{UtilCeiling: []UtilRule{{Ceiling: 1.5}}},
		{UtilCeiling: []UtilRule{{MinTotalMiB: 30000, MaxTotalMiB: 20000, Ceiling: 0.9}}},
		{MaxNumSeqsCeiling: []SeqRule{{Ceiling: 0}}},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil, want an error", bad)
		}
	}
}

func TestProfileChecks(t *testing.T) {
	mod := func(base func() Profile, f func(*Profile)) Profile {
		p := base()
		f(&p)
		return p
	}
	dense := func(p *Profile) { p.Params.ActiveParamsB = 0 }

	tests := []struct {
		name    string
		p       Profile
		gpu     GPUFacts
		pol     *Policy // nil = DefaultPolicy
		id      string
		want    Severity
		inMsg   string // substring the message must contain
		wantFix bool
	}{
		// gpu_memory_utilization
		{"util 0.92 on a 4090", qwenCoder(), rtx4090, nil, CheckGPUMemoryUtilization, SeverityOK, "0.92", false},
		{"util 0.96 on a 4090 (MoE crash)", mod(qwenCoder, func(p *Profile) { p.VLLM.GPUMemoryUtilization = 0.96 }), rtx4090, nil, CheckGPUMemoryUtilization, SeverityFail, "0.96", true},
		{"util 0.96 dense on a 4090", mod(qwenCoder, func(p *Profile) { p.VLLM.GPUMemoryUtilization = 0.96; dense(p) }), rtx4090, nil, CheckGPUMemoryUtilization, SeverityFail, "dense", true},
		{"util unset is vLLM's 0.9", mod(qwenCoder, func(p *Profile) { p.VLLM.GPUMemoryUtilization = 0 }), rtx4090, nil, CheckGPUMemoryUtilization, SeverityOK, "0.9 (vLLM default)", false},
		{"util 0.95 on an H100", mod(qwenCoder, func(p *Profile) { p.VLLM.GPUMemoryUtilization = 0.95 }), h100, nil, CheckGPUMemoryUtilization, SeverityOK, "0.95", false},
		{"util 0.97 on an H100", mod(qwenCoder, func(p *Profile) { p.VLLM.GPUMemoryUtilization = 0.97 }), h100, nil, CheckGPUMemoryUtilization, SeverityFail, "0.97", true},
		{"util without GPU facts", qwenCoder(), noGPU, nil, CheckGPUMemoryUtilization, SeverityWarn, "unknown", true},
		{"util with no matching rule", mod(qwenCoder, func(p *Profile) { p.VLLM.GPUMemoryUtilization = 1 }), rtx4090, &Policy{}, CheckGPUMemoryUtilization, SeverityOK, "no ceiling", false},

		// max_num_seqs
		{"seqs 32 on a 4090", qwenCoder(), rtx4090, nil, CheckMaxNumSeqs, SeverityOK, "32", false},
		{"seqs 64 on a 4090", mod(qwenCoder, func(p *Profile) { p.VLLM.MaxNumSeqs = 64 }), rtx4090, nil, CheckMaxNumSeqs, SeverityFail, "64", true},
		{"seqs unset on a 4090", mod(qwenCoder, func(p *Profile) { p.VLLM.MaxNumSeqs = 0 }), rtx4090, nil, CheckMaxNumSeqs, SeverityFail, "unset", true},
		{"seqs 256 on an H100", mod(qwenCoder, func(p *Profile) { p.VLLM.MaxNumSeqs = 256 }), h100, nil, CheckMaxNumSeqs, SeverityOK, "256", false},
		{"seqs without GPU facts", qwenCoder(), noGPU, nil, CheckMaxNumSeqs, SeverityWarn, "unknown", true},

		// tool_parser
		{"auto tool choice with parser", qwenCoder(), rtx4090, nil, CheckToolParser, SeverityOK, "qwen3_xml", false},
		{"auto tool choice without parser", mod(qwenCoder, func(p *Profile) { p.VLLM.ToolCallParser = "" }), rtx4090, nil, CheckToolParser, SeverityFail, "without tool_call_parser", true},
		{"auto tool choice off", mod(qwenCoder, func(p *Profile) { p.VLLM.EnableAutoToolChoice = false; p.VLLM.ToolCallParser = "" }), rtx4090, nil, CheckToolParser, SeverityOK, "off", false},

		// qwen3_coder_parser
		{"qwen3-coder with qwen3_xml", qwenCoder(), rtx4090, nil, CheckQwen3CoderParser, SeverityOK, "qwen3_xml", false},
		{"qwen3-coder with the regex parser", mod(qwenCoder, func(p *Profile) { p.VLLM.ToolCallParser = "qwen3_coder" }), rtx4090, nil, CheckQwen3CoderParser, SeverityFail, "< and >", true},
		{"qwen3-coder with hermes, upper case id", mod(qwenCoder, func(p *Profile) { p.Model = "QWEN/QWEN3-CODER-480B"; p.VLLM.ToolCallParser = "hermes" }), rtx4090, nil, CheckQwen3CoderParser, SeverityFail, "hermes", true},
		{"qwen3-coder only in the served name", mod(qwenCoder, func(p *Profile) { p.Model = "/models/local"; p.ServedName = "qwen3_coder"; p.VLLM.ToolCallParser = "" }), rtx4090, nil, CheckQwen3CoderParser, SeverityFail, "(unset)", true},
		{"not a coder model", mod(qwenCoder, func(p *Profile) { p.Model = "Qwen/Qwen3-32B"; p.VLLM.ToolCallParser = "hermes" }), rtx4090, nil, CheckQwen3CoderParser, SeverityOK, "not a Qwen3-Coder", false},

		// quantization
		{"quantization unset", qwenCoder(), rtx4090, nil, CheckQuantization, SeverityOK, "not set", false},
		{"quantization awq_marlin", mod(qwenCoder, func(p *Profile) { p.VLLM.Quantization = "awq_marlin" }), rtx4090, nil, CheckQuantization, SeverityOK, "awq_marlin", false},
		{"quantization awq", mod(qwenCoder, func(p *Profile) { p.VLLM.Quantization = "AWQ" }), rtx4090, nil, CheckQuantization, SeverityWarn, "awq", true},

		// vram_fit
		{"coder AWQ 32k fits a 4090", qwenCoder(), rtx4090, nil, CheckVRAMFit, SeverityOK, "fits", false},
		{"coder AWQ 64k is tight", mod(qwenCoder, func(p *Profile) { p.VLLM.MaxModelLen = 65536 }), rtx4090, nil, CheckVRAMFit, SeverityWarn, "tight", true},
		{"coder AWQ 128k does not fit", mod(qwenCoder, func(p *Profile) { p.VLLM.MaxModelLen = 131072 }), rtx4090, nil, CheckVRAMFit, SeverityFail, "does not fit", true},
		{"coder bf16 does not fit", mod(qwenCoder, func(p *Profile) { p.Params.WeightBits = 16 }), rtx4090, nil, CheckVRAMFit, SeverityFail, "weights 56.8 GiB", true},
		{"coder bf16 fits an H100", mod(qwenCoder, func(p *Profile) { p.Params.WeightBits = 16; p.VLLM.GPUMemoryUtilization = 0.95 }), h100, nil, CheckVRAMFit, SeverityOK, "fits", false},
		{"unknown parameters", mod(qwenCoder, func(p *Profile) { p.Params = ModelParams{} }), rtx4090, nil, CheckVRAMFit, SeverityOK, "unknown parameters", true},
		{"fit without GPU facts", qwenCoder(), noGPU, nil, CheckVRAMFit, SeverityWarn, "unknown", true},
		{"max_model_len unset", mod(qwenCoder, func(p *Profile) { p.VLLM.MaxModelLen = 0 }), rtx4090, nil, CheckVRAMFit, SeverityWarn, "max_model_len unset", true},
		{"KV dimensions missing", mod(qwenCoder, func(p *Profile) { p.Params.Layers = 0 }), rtx4090, nil, CheckVRAMFit, SeverityWarn, "KV cache size unknown", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pol := DefaultPolicy()
			if tc.pol != nil {
				pol = *tc.pol
			}
			checks := ProfileChecks(tc.p, tc.gpu, pol)
			var c *Check
			for i := range checks {
				if checks[i].ID == tc.id {
					if c != nil {
						t.Fatalf("two checks with id %s", tc.id)
					}
					c = &checks[i]
				}
			}
			if c == nil {
				t.Fatalf("no check %s in %+v", tc.id, checks)
			}
			if c.Severity != tc.want {
				t.Errorf("severity = %s, want %s; message %q", c.Severity, tc.want, c.Message)
			}
			if !strings.Contains(c.Message, tc.inMsg) {
				t.Errorf("message %q does not contain %q", c.Message, tc.inMsg)
			}
			if (c.Fix != "") != tc.wantFix {
				t.Errorf("fix = %q, want a fix: %v", c.Fix, tc.wantFix)
			}
		})
	}
}

func TestProfileChecksSets(t *testing.T) {
	ids := func(cs []Check) []string {
		var out []string
		for _, c := range cs {
			out = append(out, c.ID)
			if c.Severity != SeverityOK && c.Severity != SeverityWarn && c.Severity != SeverityFail {
				t.Errorf("check %s has severity %q", c.ID, c.Severity)
			}
			if c.Message == "" {
				t.Errorf("check %s has no message", c.ID)
			}
		}
		return out
	}
	got := ids(ProfileChecks(qwenCoder(), rtx4090, DefaultPolicy()))
	want := []string{CheckGPUMemoryUtilization, CheckMaxNumSeqs, CheckToolParser, CheckQwen3CoderParser, CheckQuantization, CheckVRAMFit}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("vLLM check ids = %v, want %v", got, want)
	}

	o := llamaOllama()
	o.Params = ModelParams{TotalParamsB: 8, WeightBits: 4.5, Layers: 32, KVHeads: 8, HeadDim: 128}
	oc := ProfileChecks(o, rtx4090, DefaultPolicy())
	if got := ids(oc); len(got) != 1 || got[0] != CheckVRAMFit {
		t.Fatalf("Ollama check ids = %v, want only %s", got, CheckVRAMFit)
	}
	if oc[0].Severity != SeverityOK || !strings.Contains(oc[0].Message, "8192 tokens") || !strings.Contains(oc[0].Message, "1 × 24564 MiB") {
		t.Errorf("Ollama 8B Q4 with num_ctx 8192 on a 4090: %+v", oc[0])
	}
	o.Params.TotalParamsB, o.Params.WeightBits = 70, 4.5
	if c := ProfileChecks(o, rtx4090, DefaultPolicy())[0]; c.Severity != SeverityFail || !strings.Contains(c.Message, "offload") {
		t.Errorf("Ollama 70B on a 4090: %+v, want a fail mentioning CPU offload", c)
	}
}
