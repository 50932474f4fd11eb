package units

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Severity grades a Check. Doctor exits non-zero on any fail.
type Severity string

// The severities, from good to bad.
const (
	SeverityOK   Severity = "ok"
	SeverityWarn Severity = "warn"
	SeverityFail Severity = "fail"
)

// Check is one known-good-settings verdict about a profile. Message always
// states the measured value, so an ok line is evidence, not just silence.
type Check struct {
	ID       string   `json:"id"`
	Severity Severity `json:"severity"`
	Message  string   `json:"message"`
	Fix      string   `json:"fix,omitempty"`
	Value    string   `json:"value,omitempty"`
}

// The check IDs ProfileChecks emits, one Check per ID per profile.
const (
	CheckGPUMemoryUtilization = "profile.gpu_memory_utilization"
	CheckMaxNumSeqs           = "profile.max_num_seqs"
	CheckToolParser           = "profile.tool_parser"
	CheckQwen3CoderParser     = "profile.qwen3_coder_parser"
	CheckQuantization         = "profile.quantization"
	CheckVRAMFit              = "profile.vram_fit"
)

// GPUFacts are what the rules need to know about the GPU. TotalMiB 0 means
// unknown (no NVML), which turns GPU-dependent checks into warnings.
type GPUFacts struct {
	TotalMiB uint64
	Name     string
	// ReservedMiB is what the other backend keeps while it is in standby
	// (its measured residual), which this profile cannot have.
	ReservedMiB uint64
	// Count is how many such GPUs the profile spreads over (its gpus);
	// 0 or 1 is one. Weights and KV cache are split over them.
	Count int
}

// Policy is the configurable table of known-good ceilings. Rules are tried in
// order; the first that matches the GPU (and model kind) applies. No match
// means no ceiling.
type Policy struct {
	UtilCeiling       []UtilRule `yaml:"util_ceiling" json:"util_ceiling"`
	MaxNumSeqsCeiling []SeqRule  `yaml:"max_num_seqs_ceiling" json:"max_num_seqs_ceiling"`
}

// UtilRule caps --gpu-memory-utilization for GPUs with total memory in
// [MinTotalMiB, MaxTotalMiB] (MaxTotalMiB 0 = no upper bound) and, when MoE
// is set, only for MoE (true) or dense (false) models.
type UtilRule struct {
	MinTotalMiB uint64  `yaml:"min_total_mib" json:"min_total_mib"` // The smallest GPU (total MiB) the rule applies to.
	MaxTotalMiB uint64  `yaml:"max_total_mib" json:"max_total_mib"` // The largest GPU (total MiB) the rule applies to; 0 = no bound.
	MoE         *bool   `yaml:"moe" json:"moe,omitempty"`           // Only MoE (true) or only dense (false) models; unset = both.
	Ceiling     float64 `yaml:"ceiling" json:"ceiling"`             // The highest --gpu-memory-utilization allowed.
}

// SeqRule caps --max-num-seqs on GPUs with at most MaxTotalMiB (0 = any).
type SeqRule struct {
	MaxTotalMiB uint64 `yaml:"max_total_mib" json:"max_total_mib"` // The largest GPU (total MiB) the rule applies to; 0 = any.
	Ceiling     int    `yaml:"ceiling" json:"ceiling"`             // The highest --max-num-seqs allowed.
}

// Card24GBMaxMiB is the upper bound of the "24 GB card" class (an RTX 4090
// reports 24564 MiB).
const Card24GBMaxMiB = 25000

// DefaultPolicy is what was measured on the reference box (RTX 4090, 24 GB):
// 0.96 started but crashed under load with the MoE model (Qwen3-Coder-30B-A3B),
// 0.92 held, so 24 GB cards get 0.92 for MoE and dense alike (the two rules
// are kept separate so either can be tuned); max_num_seqs above 32 ran out of
// KV cache there. Larger cards keep vLLM's margin at 0.95.
func DefaultPolicy() Policy {
	moe, dense := true, false
	return Policy{
		UtilCeiling: []UtilRule{
			{MaxTotalMiB: Card24GBMaxMiB, MoE: &moe, Ceiling: 0.92},
			{MaxTotalMiB: Card24GBMaxMiB, MoE: &dense, Ceiling: 0.92},
			{MinTotalMiB: Card24GBMaxMiB + 1, Ceiling: 0.95},
		},
		MaxNumSeqsCeiling: []SeqRule{
			{MaxTotalMiB: Card24GBMaxMiB, Ceiling: 32},
		},
	}
}

// Validate checks a Policy from the config; keys are relative to the policy.
func (pol Policy) Validate() error {
	var errs []error
	for i, r := range pol.UtilCeiling {
		if math.IsNaN(r.Ceiling) || r.Ceiling <= 0 || r.Ceiling > 1 {
			errs = append(errs, fmt.Errorf("util_ceiling[%d].ceiling: must be in (0, 1], got %v", i, r.Ceiling))
		}
		if r.MaxTotalMiB != 0 && r.MinTotalMiB > r.MaxTotalMiB {
			errs = append(errs, fmt.Errorf("util_ceiling[%d]: min_total_mib %d is above max_total_mib %d", i, r.MinTotalMiB, r.MaxTotalMiB))
		}
	}
	for i, r := range pol.MaxNumSeqsCeiling {
		if r.Ceiling < 1 {
			errs = append(errs, fmt.Errorf("max_num_seqs_ceiling[%d].ceiling: must be >= 1, got %d", i, r.Ceiling))
		}
	}
	return errors.Join(errs...)
}

func (pol Policy) utilRule(totalMiB uint64, moe bool) (UtilRule, bool) {
	for _, r := range pol.UtilCeiling {
		if totalMiB < r.MinTotalMiB || r.MaxTotalMiB != 0 && totalMiB > r.MaxTotalMiB {
			continue
		}
		if r.MoE != nil && *r.MoE != moe {
			continue
		}
		return r, true
	}
	return UtilRule{}, false
}

func (pol Policy) seqRule(totalMiB uint64) (SeqRule, bool) {
	for _, r := range pol.MaxNumSeqsCeiling {
		if r.MaxTotalMiB == 0 || totalMiB <= r.MaxTotalMiB {
			return r, true
		}
	}
	return SeqRule{}, false
}

// Estimate constants.
const (
	// VRAMOverheadBytes is set aside for activations, CUDA graphs and the
	// CUDA context on top of weights and KV cache.
	VRAMOverheadBytes = 1.5 * (1 << 30)
	// vramTightFraction: less headroom than this share of the budget is a
	// warning, since fragmentation and long prompts eat it.
	vramTightFraction = 0.10
)

// EstimateVRAM returns the model's memory needs as the fit check sees them:
// weights = TotalParamsB·1e9·WeightBits/8 bytes (WeightBits 0 = 16, bf16);
// kvPerToken = 2 (K and V)·Layers·KVHeads·HeadDim·KVBytes (KVBytes 0 = 1 when
// the vLLM kv-cache dtype is fp8*, else 2); kvTotal = kvPerToken × the
// context of one full sequence (vLLM max_model_len, 0 if unset; Ollama
// num_ctx or its default 4096).
func EstimateVRAM(p Profile) (weightsBytes, kvPerToken, kvTotal float64) {
	m := p.Params
	bits := m.WeightBits
	if bits == 0 {
		bits = 16
	}
	weightsBytes = m.TotalParamsB * 1e9 * bits / 8
	kvBytes := m.KVBytes
	if kvBytes == 0 {
		kvBytes = 2
		if p.Backend == VLLM && strings.HasPrefix(strings.ToLower(p.VLLM.KVCacheDtype), "fp8") {
			kvBytes = 1
		}
	}
	kvPerToken = 2 * float64(m.Layers) * float64(m.KVHeads) * float64(m.HeadDim) * kvBytes
	kvTotal = kvPerToken * float64(contextTokens(p))
	return weightsBytes, kvPerToken, kvTotal
}

// contextTokens is the length of one full sequence the backend must hold.
func contextTokens(p Profile) int {
	switch p.Backend {
	case VLLM:
		if p.VLLM.MaxModelLen > 0 {
			return p.VLLM.MaxModelLen
		}
	case Ollama:
		if p.Ollama.NumCtx > 0 {
			return p.Ollama.NumCtx
		}
		return OllamaDefaultNumCtx
	}
	return 0
}

// ProfileChecks applies the known-good settings rules to one profile on one
// GPU. vLLM profiles get every check; Ollama profiles only the VRAM fit (the
// other settings do not exist there). The order is fixed.
func ProfileChecks(p Profile, gpu GPUFacts, pol Policy) []Check {
	if p.Backend == Ollama {
		return append([]Check{vramFitCheck(p, gpu)}, standbyFitChecks(p, gpu)...)
	}
	return append([]Check{
		utilCheck(p, gpu, pol),
		seqsCheck(p, gpu, pol),
		toolParserCheck(p),
		qwen3CoderCheck(p),
		quantizationCheck(p),
		vramFitCheck(p, gpu),
	}, standbyFitChecks(p, gpu)...)
}

func effectiveUtil(p Profile) float64 {
	if p.Backend == Ollama {
		return 1 // Ollama has no such knob; it uses what is free
	}
	if u := p.VLLM.GPUMemoryUtilization; u > 0 {
		return u
	}
	return VLLMDefaultGPUMemoryUtilization
}

func fmtFloat(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

func gpuLabel(gpu GPUFacts) string {
	if gpu.Name != "" {
		return fmt.Sprintf("%s (%d MiB)", gpu.Name, gpu.TotalMiB)
	}
	return fmt.Sprintf("a %d MiB GPU", gpu.TotalMiB)
}

func utilCheck(p Profile, gpu GPUFacts, pol Policy) Check {
	u := effectiveUtil(p)
	c := Check{ID: CheckGPUMemoryUtilization, Value: fmtFloat(u)}
	shown := fmtFloat(u)
	if p.VLLM.GPUMemoryUtilization == 0 {
		shown += " (vLLM default)"
	}
	if gpu.TotalMiB == 0 {
		c.Severity = SeverityWarn
		c.Message = fmt.Sprintf("gpu_memory_utilization %s not checked: GPU memory unknown", shown)
		c.Fix = "run doctor on the GPU host so NVML can report total memory"
		return c
	}
	moe := p.Params.IsMoE()
	kind := "dense model"
	if moe {
		kind = "MoE model"
	}
	r, ok := pol.utilRule(gpu.TotalMiB, moe)
	if !ok {
		c.Severity = SeverityOK
		c.Message = fmt.Sprintf("gpu_memory_utilization %s; no ceiling configured for %s", shown, gpuLabel(gpu))
		return c
	}
	if u > r.Ceiling+1e-9 {
		c.Severity = SeverityFail
		c.Message = fmt.Sprintf("gpu_memory_utilization %s is above the %s ceiling for %s with a %s: it may start, then crash under load",
			shown, fmtFloat(r.Ceiling), gpuLabel(gpu), kind)
		c.Fix = fmt.Sprintf("set vllm.gpu_memory_utilization to %s or lower", fmtFloat(r.Ceiling))
		return c
	}
	c.Severity = SeverityOK
	c.Message = fmt.Sprintf("gpu_memory_utilization %s is within the %s ceiling for %s with a %s",
		shown, fmtFloat(r.Ceiling), gpuLabel(gpu), kind)
	return c
}

func seqsCheck(p Profile, gpu GPUFacts, pol Policy) Check {
	n := p.VLLM.MaxNumSeqs
	c := Check{ID: CheckMaxNumSeqs, Value: strconv.Itoa(n)}
	shown := strconv.Itoa(n)
	if n == 0 {
		shown = "unset (vLLM's default, 256 or more)"
		c.Value = "default"
	}
	if gpu.TotalMiB == 0 {
		c.Severity = SeverityWarn
		c.Message = fmt.Sprintf("max_num_seqs %s not checked: GPU memory unknown", shown)
		c.Fix = "run doctor on the GPU host so NVML can report total memory"
		return c
	}
	r, ok := pol.seqRule(gpu.TotalMiB)
	if !ok {
		c.Severity = SeverityOK
		c.Message = fmt.Sprintf("max_num_seqs %s; no ceiling configured for %s", shown, gpuLabel(gpu))
		return c
	}
	if n == 0 || n > r.Ceiling {
		c.Severity = SeverityFail
		c.Message = fmt.Sprintf("max_num_seqs %s is above the ceiling %d for %s: concurrent sequences run out of KV cache",
			shown, r.Ceiling, gpuLabel(gpu))
		c.Fix = fmt.Sprintf("set vllm.max_num_seqs to %d or lower", r.Ceiling)
		return c
	}
	c.Severity = SeverityOK
	c.Message = fmt.Sprintf("max_num_seqs %s is within the ceiling %d for %s", shown, r.Ceiling, gpuLabel(gpu))
	return c
}

func toolParserCheck(p Profile) Check {
	f := p.VLLM
	c := Check{ID: CheckToolParser, Value: f.ToolCallParser}
	switch {
	case f.EnableAutoToolChoice && f.ToolCallParser == "":
		c.Severity = SeverityFail
		c.Message = "enable_auto_tool_choice is on without tool_call_parser: vLLM refuses to start"
		c.Fix = "set vllm.tool_call_parser (qwen3_xml for Qwen3-Coder, hermes for Qwen2.5/Qwen3, llama3_json for Llama 3.x)"
	case f.EnableAutoToolChoice:
		c.Severity = SeverityOK
		c.Message = fmt.Sprintf("auto tool choice on with tool_call_parser %s", f.ToolCallParser)
	default:
		c.Severity = SeverityOK
		c.Message = "auto tool choice off; no parser needed"
	}
	return c
}

// isQwen3Coder matches Qwen3-Coder model ids and their quantised re-uploads
// (e.g. "cpatonn/Qwen3-Coder-30B-A3B-Instruct-AWQ-4bit").
func isQwen3Coder(p Profile) bool {
	for _, s := range []string{p.Model, p.ServedName} {
		s = strings.ReplaceAll(strings.ToLower(s), "_", "-")
		if strings.Contains(s, "qwen3-coder") {
			return true
		}
	}
	return false
}

func qwen3CoderCheck(p Profile) Check {
	c := Check{ID: CheckQwen3CoderParser, Value: p.VLLM.ToolCallParser}
	switch {
	case !isQwen3Coder(p):
		c.Severity = SeverityOK
		c.Message = fmt.Sprintf("%s is not a Qwen3-Coder model", p.Model)
	case p.VLLM.ToolCallParser == "qwen3_xml":
		c.Severity = SeverityOK
		c.Message = "Qwen3-Coder model uses tool_call_parser qwen3_xml"
	default:
		parser := p.VLLM.ToolCallParser
		if parser == "" {
			parser = "(unset)"
		}
		c.Severity = SeverityFail
		c.Message = fmt.Sprintf("Qwen3-Coder model with tool_call_parser %s: regex parsers break on < and > in code, so tool calls with code fail", parser)
		c.Fix = "set vllm.tool_call_parser: qwen3_xml (with vllm.enable_auto_tool_choice: true)"
	}
	return c
}

func quantizationCheck(p Profile) Check {
	q := p.VLLM.Quantization
	c := Check{ID: CheckQuantization, Value: q}
	switch {
	case strings.EqualFold(q, "awq"):
		c.Severity = SeverityWarn
		c.Message = "quantization awq forces vLLM's slow AWQ kernel; on Ada GPUs the Marlin kernel is much faster"
		c.Fix = "set vllm.quantization: awq_marlin or omit it (vLLM then picks Marlin for AWQ checkpoints)"
	case q == "":
		c.Severity = SeverityOK
		c.Message = "quantization not set: vLLM detects it from the checkpoint"
	default:
		c.Severity = SeverityOK
		c.Message = "quantization " + q
	}
	return c
}

const gib = 1 << 30

func vramFitCheck(p Profile, gpu GPUFacts) Check {
	c := Check{ID: CheckVRAMFit}
	if p.Params.TotalParamsB == 0 {
		c.Severity = SeverityOK
		c.Message = "unknown parameters: VRAM fit not estimated"
		c.Fix = "set model_params (total_params_b, weight_bits, layers, kv_heads, head_dim) to check the fit before starting"
		return c
	}
	if gpu.TotalMiB == 0 {
		c.Severity = SeverityWarn
		c.Message = "VRAM fit not checked: GPU memory unknown"
		c.Fix = "run doctor on the GPU host so NVML can report total memory"
		return c
	}
	weights, perTok, kv := EstimateVRAM(p)
	ctx := contextTokens(p)
	u := effectiveUtil(p)
	budget := u * float64(gpu.TotalMiB) * (1 << 20)
	if gpu.Count > 1 {
		weights, kv = weights/float64(gpu.Count), kv/float64(gpu.Count)
	}
	need := weights + kv + VRAMOverheadBytes
	c.Value = fmt.Sprintf("%.1f/%.1f GiB", need/gib, budget/gib)
	budgetText := fmt.Sprintf("%.1f GiB budget (%s × %d MiB)", budget/gib, fmtFloat(u), gpu.TotalMiB)
	kvText := "KV unknown"
	if perTok > 0 && ctx > 0 {
		kvText = fmt.Sprintf("KV %.1f GiB for %d tokens at %.0f KiB/token", kv/gib, ctx, perTok/1024)
	}
	detail := fmt.Sprintf("needs ~%.1f GiB (weights %.1f GiB + %s + %.1f GiB overhead) of a %s",
		need/gib, weights/gib, kvText, VRAMOverheadBytes/gib, budgetText)
	if gpu.Count > 1 {
		detail = fmt.Sprintf("on each of %d GPUs ", gpu.Count) + detail
	}

	switch {
	case need > budget:
		c.Severity = SeverityFail
		c.Message = "does not fit: " + detail
		if p.Backend == Ollama {
			c.Message += "; Ollama would offload layers to the CPU and run far slower"
			c.Fix = "use a smaller quantisation or lower ollama.num_ctx"
		} else {
			c.Message += "; vLLM refuses to start when one full sequence's KV cache does not fit"
			c.Fix = "lower vllm.max_model_len, use a 4-bit checkpoint, or set vllm.kv_cache_dtype: fp8"
		}
	case perTok == 0:
		c.Severity = SeverityWarn
		c.Message = "weights fit, KV cache size unknown: " + detail
		c.Fix = "set model_params.layers, kv_heads and head_dim to size the KV cache"
	case ctx == 0:
		c.Severity = SeverityWarn
		c.Message = "max_model_len unset, so vLLM sizes for the model's full context, which may not fit: " + detail
		c.Fix = "set vllm.max_model_len to the context you need"
	case budget-need < vramTightFraction*budget:
		c.Severity = SeverityWarn
		c.Message = fmt.Sprintf("tight, under %.0f%% headroom: %s", vramTightFraction*100, detail)
		c.Fix = "lower vllm.max_model_len (or ollama.num_ctx) or use a smaller quantisation"
	default:
		c.Severity = SeverityOK
		c.Message = "fits: " + detail
	}
	return c
}
