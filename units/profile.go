package units

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"gpuhost/internal/loopback"
)

// Backend names the kind of inference server a profile runs. Only one backend
// runs on the GPU at a time; each kind has its own systemd unit.
type Backend string

// The supported backends.
const (
	VLLM   Backend = "vllm"
	Ollama Backend = "ollama"
)

// Defaults that the rest of gpuhost and the checks rely on. They are the
// backends' own defaults, written down so that a profile that leaves a field
// unset is judged by what the backend will really do.
const (
	// DefaultKeepAlive keeps an Ollama model loaded forever: gpuhost owns the
	// GPU and decides when a model goes, not an idle timer.
	DefaultKeepAlive = "-1"
	// VLLMDefaultGPUMemoryUtilization is what vLLM uses when
	// --gpu-memory-utilization is not given.
	VLLMDefaultGPUMemoryUtilization = 0.9
	// VLLMDefaultPort is what vLLM listens on when --port is not given.
	VLLMDefaultPort = 8000
	// OllamaDefaultNumCtx is the context Ollama allocates when neither the
	// request nor OLLAMA_CONTEXT_LENGTH sets one (Ollama ≥ 0.6).
	OllamaDefaultNumCtx = 4096
)

// Profile is one named, switchable model setup (from the YAML config, key `profiles.<name>`).
type Profile struct {
	Name       string  `yaml:"-"`
	Backend    Backend `yaml:"backend"`     // Vllm or ollama.
	Model      string  `yaml:"model"`       // HF repo id for vllm, tag for ollama (e.g. llama3.1:8b)
	ServedName string  `yaml:"served_name"` // Name clients use (default = model); no `{`, `}` or `$`, which coding agents expand in their config files.
	// Aliases are further model names clients may use for this profile
	// (the /v1 proxy maps them to the served name).
	Aliases []string `yaml:"aliases"`
	Port    int      `yaml:"port"` // The port the backend listens on (loopback).
	// Standby is what a switch away does with the backend (standby.go).
	Standby Standby `yaml:"standby"`
	// Network is "offline" (default: the backend is told it has no network,
	// units.OfflineEnv) or "open" (it is not, so it may download the model
	// at start); "open" needs backends.<kind>.network: open, since a fenced
	// unit has no network to download over.
	Network Network     `yaml:"network"`
	VLLM    VLLMFlags   `yaml:"vllm"`
	Ollama  OllamaOpts  `yaml:"ollama"`
	Params  ModelParams `yaml:"model_params"` // for the VRAM fit estimate; zero = unknown
	// GPUs is where the profile runs: NVML indices such as [0], [1] or
	// [0, 1] (vLLM tensor parallel over them), or auto (the first GPU set
	// where it fits, single GPUs first); unset is GPU 0.
	GPUs GPUSet  `yaml:"gpus"`
	Sim  SimOpts `yaml:"sim"` // only used when the backend exec is the simulator
}

// VLLMFlags are the vLLM server flags gpuhost manages. A zero value means
// "do not pass the flag", so vLLM's own default applies.
type VLLMFlags struct {
	GPUMemoryUtilization float64  `yaml:"gpu_memory_utilization"`  // vLLM --gpu-memory-utilization
	MaxNumSeqs           int      `yaml:"max_num_seqs"`            // VLLM --max-num-seqs.
	MaxModelLen          int      `yaml:"max_model_len"`           // VLLM --max-model-len: the context the doctor checks the live server against.
	EnableAutoToolChoice bool     `yaml:"enable_auto_tool_choice"` // VLLM --enable-auto-tool-choice (tool calls need it and a parser).
	ToolCallParser       string   `yaml:"tool_call_parser"`        // VLLM --tool-call-parser, one of vLLM's parser names (Qwen3-Coder needs qwen3_xml); another name only with --tool-parser-plugin in extra_args.
	Quantization         string   `yaml:"quantization"`            // VLLM --quantization (awq_marlin or none on Ada, not awq).
	KVCacheDtype         string   `yaml:"kv_cache_dtype"`          // VLLM --kv-cache-dtype.
	ExtraArgs            []string `yaml:"extra_args"`              // Further vLLM arguments, passed word for word: no shell and no systemd expansion, so `$`, `%`, backticks and `;` are refused.
}

// OllamaOpts are the Ollama server settings gpuhost passes as environment.
type OllamaOpts struct {
	NumCtx    int    `yaml:"num_ctx"`    // Ollama context length (OLLAMA_CONTEXT_LENGTH; Ollama's default 4096 when unset).
	KeepAlive string `yaml:"keep_alive"` // default "-1" (keep loaded)
}

// ModelParams describe the model's size so the VRAM fit can be estimated
// before anything is started. All zero means "unknown"; the fit check is then
// skipped rather than guessed.
type ModelParams struct {
	TotalParamsB  float64 `yaml:"total_params_b"`  // billions
	ActiveParamsB float64 `yaml:"active_params_b"` // MoE: active per token; 0 = dense
	WeightBits    float64 `yaml:"weight_bits"`     // 4 for AWQ/INT4, 16 for bf16
	Layers        int     `yaml:"layers"`          // Transformer layers (KV cache size).
	KVHeads       int     `yaml:"kv_heads"`        // Key/value heads (KV cache size).
	HeadDim       int     `yaml:"head_dim"`        // Head dimension (KV cache size).
	// AttentionHeads is the model's attention (query) head count; vLLM's
	// tensor parallel size (the number of GPUs) must divide it.
	AttentionHeads int     `yaml:"attention_heads"`
	KVBytes        float64 `yaml:"kv_bytes"` // per element, default 2 (bf16); 1 for fp8
}

// SimOpts are passed to `gpuhost simulate` as flags.
type SimOpts struct {
	LoadTime   string  `yaml:"load_time"`   // Go duration, e.g. "1.5s"
	PrefillTPS float64 `yaml:"prefill_tps"` // Simulated prefill rate, tokens/s.
	DecodeTPS  float64 `yaml:"decode_tps"`  // Simulated decode rate, tokens/s.
	VRAMMiB    int     `yaml:"vram_mib"`    // The simulated VRAM the backend claims while running.
	// Sleep mode (vLLM) of the simulator: the VRAM it keeps asleep, the
	// weights it offloads or reloads, and the bandwidths that time a wake.
	SleepResidualMiB int     `yaml:"sleep_residual_mib"`
	WeightsMiB       int     `yaml:"weights_mib"` // The weights sleep level 1 moves to host RAM.
	H2DGBps          float64 `yaml:"h2d_gbps"`    // Host-to-device bandwidth that times a level-1 wake.
	ReloadGBps       float64 `yaml:"reload_gbps"` // The weight reload rate that times a level-2 wake.
}

// IsMoE reports whether the parameters describe a mixture-of-experts model
// (fewer parameters active per token than in total). The utilisation rules
// may differ for MoE models because their memory spikes differ.
func (m ModelParams) IsMoE() bool {
	return m.ActiveParamsB > 0 && m.ActiveParamsB < m.TotalParamsB
}

// ServedModelName is the model name clients send: ServedName, or Model when
// that is unset (the same default vLLM applies).
func (p Profile) ServedModelName() string {
	if p.ServedName != "" {
		return p.ServedName
	}
	return p.Model
}

// EffectiveKeepAlive is the OLLAMA_KEEP_ALIVE gpuhost sets: KeepAlive, or
// DefaultKeepAlive when unset.
func (o OllamaOpts) EffectiveKeepAlive() string {
	if o.KeepAlive != "" {
		return o.KeepAlive
	}
	return DefaultKeepAlive
}

// FieldError is one problem with a profile. Key is relative to the profile
// (e.g. `vllm.gpu_memory_utilization`) so the config loader can prefix it with
// `profiles.<name>.` and the operator sees exactly which line to fix.
type FieldError struct{ Key, Msg string }

// Error implements error as "key: message".
func (e FieldError) Error() string {
	if e.Key == "" {
		return e.Msg
	}
	return e.Key + ": " + e.Msg
}

// Validate reports every problem with the profile, not just the first, so an
// operator fixes a config in one pass. It returns nil for a valid profile.
//
// Besides ranges it enforces the one rule the unit design needs: anything that
// becomes a backend argument (model, served_name, parser names, extra_args,
// …) must be a single plain word, because the argv travels through a systemd
// EnvironmentFile and is split by `$GPUHOST_ARGS` at whitespace, with quotes
// and backslashes interpreted on the way.
//
// The profile's Name (the YAML key) is checked only when set, under key "name".
func (p Profile) Validate() []FieldError {
	var errs []FieldError
	add := func(key, format string, a ...any) {
		errs = append(errs, FieldError{Key: key, Msg: fmt.Sprintf(format, a...)})
	}
	word := func(key, v string) {
		if err := argWord(v); err != nil {
			add(key, "%v", err)
		} else if err := ClientText(v); err != nil {
			add(key, "%v", err)
		}
	}

	if p.Name != "" {
		if err := ValidProfileName(p.Name); err != nil {
			add("name", "%v", err)
		}
	}

	switch p.Backend {
	case VLLM, Ollama:
	case "":
		add("backend", "must be set to %q or %q", VLLM, Ollama)
	default:
		add("backend", "unknown backend %q: must be %q or %q", p.Backend, VLLM, Ollama)
	}

	if p.Model == "" {
		add("model", "must not be empty (a Hugging Face repo id for vllm, a tag such as llama3.1:8b for ollama)")
	} else {
		word("model", p.Model)
	}
	if p.ServedName != "" {
		word("served_name", p.ServedName)
	}
	for i, a := range p.Aliases {
		if strings.TrimSpace(a) == "" || strings.ContainsAny(a, " \t\n\"'") || strings.ContainsFunc(a, unicode.IsControl) || !utf8.ValidString(a) {
			add(fmt.Sprintf("aliases[%d]", i), "%q must be a non-empty UTF-8 name without spaces, quotes or control characters", a)
		} else if err := ClientText(a); err != nil {
			add(fmt.Sprintf("aliases[%d]", i), "%v", err)
		}
	}
	if p.Port < 1 || p.Port > 65535 {
		add("port", "must be 1..65535, got %d", p.Port)
	}
	if msg := p.validateStandby(); msg != "" {
		add("standby", "%s", msg)
	}
	if msg := p.validateNetwork(); msg != "" {
		add("network", "%s", msg)
	}

	switch p.Backend {
	case VLLM:
		errs = append(errs, p.validateVLLM()...)
		if p.Ollama != (OllamaOpts{}) {
			add("ollama", "only applies to backend %q; this profile uses %q", Ollama, VLLM)
		}
	case Ollama:
		errs = append(errs, p.validateOllama()...)
		if !p.VLLM.isZero() {
			add("vllm", "only applies to backend %q; this profile uses %q", VLLM, Ollama)
		}
	}

	errs = append(errs, p.Params.validate()...)
	errs = append(errs, p.Sim.validate()...)
	errs = append(errs, p.GPUs.validate(p.Backend, p.Params.AttentionHeads)...)
	return errs
}

func (f VLLMFlags) isZero() bool {
	return f.GPUMemoryUtilization == 0 && f.MaxNumSeqs == 0 && f.MaxModelLen == 0 &&
		!f.EnableAutoToolChoice && f.ToolCallParser == "" && f.Quantization == "" &&
		f.KVCacheDtype == "" && len(f.ExtraArgs) == 0
}

func (p Profile) validateVLLM() []FieldError {
	var errs []FieldError
	add := func(key, format string, a ...any) {
		errs = append(errs, FieldError{Key: key, Msg: fmt.Sprintf(format, a...)})
	}
	f := p.VLLM
	if u := f.GPUMemoryUtilization; math.IsNaN(u) || u < 0 || u > 1 {
		add("vllm.gpu_memory_utilization", "must be in (0, 1] (a fraction of total GPU memory) or 0 for vLLM's default %v, got %v",
			VLLMDefaultGPUMemoryUtilization, u)
	}
	if f.MaxNumSeqs < 0 {
		add("vllm.max_num_seqs", "must be >= 0 (0 = vLLM's default), got %d", f.MaxNumSeqs)
	}
	if f.MaxModelLen < 0 {
		add("vllm.max_model_len", "must be >= 0 (0 = the model's own maximum), got %d", f.MaxModelLen)
	}
	for _, kv := range []struct{ key, v string }{
		{"vllm.tool_call_parser", f.ToolCallParser},
		{"vllm.quantization", f.Quantization},
		{"vllm.kv_cache_dtype", f.KVCacheDtype},
	} {
		if kv.v != "" {
			if err := argWord(kv.v); err != nil {
				add(kv.key, "%v", err)
			} else if kv.key == "vllm.tool_call_parser" {
				if err := toolCallParser(kv.v, f.ExtraArgs); err != nil {
					add(kv.key, "%v", err)
				}
			}
		}
	}
	if p.Model != "" && strings.HasPrefix(p.Model, "-") {
		add("model", "must not start with '-' (it would be read as a flag), got %q", p.Model)
	}
	if p.ServedName != "" && strings.HasPrefix(p.ServedName, "-") {
		add("served_name", "must not start with '-' (it would be read as a flag), got %q", p.ServedName)
	}
	for i, a := range f.ExtraArgs {
		key := fmt.Sprintf("vllm.extra_args[%d]", i)
		if err := argWord(a); err != nil {
			add(key, "%v", err)
			continue
		}
		if err := literalArg(a); err != nil {
			add(key, "%v", err)
			continue
		}
		if i == 0 && !isFlagWord(a) {
			add(key, "must start with a flag (e.g. --enable-prefix-caching), got %q: a leading plain word would be read as another served model name", a)
		}
		if isFlagWord(a) {
			name, _, _ := splitFlag(a)
			if kf, ok := lookupFlag(name); ok {
				add(key, "%s is managed by gpuhost: set %s instead", a, kf.key)
			}
			if name == "host" {
				if msg := loopbackHostArg(f.ExtraArgs, i); msg != "" {
					add(key, "%s", msg)
				}
			}
		}
	}
	return errs
}

// loopbackHostArg checks the --host flag at extra_args[i]: vLLM must bind
// loopback only (its API has no auth beyond /v1 and answers any origin),
// so any other address is refused. It returns "" when the value is a
// loopback IP or localhost.
func loopbackHostArg(args []string, i int) string {
	_, val, hasVal := splitFlag(args[i])
	if !hasVal {
		if i+1 >= len(args) || isFlagWord(args[i+1]) {
			return "--host needs a value"
		}
		val = args[i+1]
	}
	if loopback.DialsLoopback(val) {
		return ""
	}
	return fmt.Sprintf("--host %q: vLLM must listen on loopback only (127.0.0.1, ::1 or localhost); gpuhost's /v1 is the way in from elsewhere", val)
}

func (p Profile) validateOllama() []FieldError {
	var errs []FieldError
	o := p.Ollama
	if o.NumCtx < 0 {
		errs = append(errs, FieldError{"ollama.num_ctx", fmt.Sprintf("must be >= 0 (0 = Ollama's default %d), got %d", OllamaDefaultNumCtx, o.NumCtx)})
	}
	if o.KeepAlive != "" {
		if err := validKeepAlive(o.KeepAlive); err != nil {
			errs = append(errs, FieldError{"ollama.keep_alive", err.Error()})
		}
	}
	if strings.HasPrefix(p.Model, "-") {
		errs = append(errs, FieldError{"model", fmt.Sprintf("must not start with '-', got %q", p.Model)})
	}
	return errs
}

// validKeepAlive accepts what Ollama accepts for OLLAMA_KEEP_ALIVE: an
// integer number of seconds (negative = forever) or a Go duration.
func validKeepAlive(v string) error {
	if _, err := strconv.ParseInt(v, 10, 64); err == nil {
		return nil
	}
	if _, err := time.ParseDuration(v); err == nil {
		return nil
	}
	return fmt.Errorf("must be seconds (e.g. -1 = forever, 3600) or a duration (e.g. 30m), got %q", v)
}

func (m ModelParams) validate() []FieldError {
	var errs []FieldError
	nonNeg := func(key string, v float64) {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			errs = append(errs, FieldError{key, fmt.Sprintf("must be a finite number >= 0, got %v", v)})
		}
	}
	nonNeg("model_params.total_params_b", m.TotalParamsB)
	nonNeg("model_params.active_params_b", m.ActiveParamsB)
	nonNeg("model_params.weight_bits", m.WeightBits)
	nonNeg("model_params.kv_bytes", m.KVBytes)
	if m.WeightBits > 32 {
		errs = append(errs, FieldError{"model_params.weight_bits", fmt.Sprintf("must be at most 32 bits per weight, got %v", m.WeightBits)})
	}
	if m.KVBytes > 8 {
		errs = append(errs, FieldError{"model_params.kv_bytes", fmt.Sprintf("must be at most 8 bytes per element, got %v", m.KVBytes)})
	}
	if m.ActiveParamsB > m.TotalParamsB {
		errs = append(errs, FieldError{"model_params.active_params_b", fmt.Sprintf("must not exceed total_params_b (%v), got %v", m.TotalParamsB, m.ActiveParamsB)})
	}
	for _, kv := range []struct {
		key string
		v   int
	}{
		{"model_params.layers", m.Layers},
		{"model_params.kv_heads", m.KVHeads},
		{"model_params.head_dim", m.HeadDim},
		{"model_params.attention_heads", m.AttentionHeads},
	} {
		if kv.v < 0 {
			errs = append(errs, FieldError{kv.key, fmt.Sprintf("must be >= 0, got %d", kv.v)})
		}
	}
	return errs
}

func (s SimOpts) validate() []FieldError {
	var errs []FieldError
	if s.LoadTime != "" {
		d, err := time.ParseDuration(s.LoadTime)
		switch {
		case err != nil:
			errs = append(errs, FieldError{"sim.load_time", fmt.Sprintf("must be a Go duration such as 1.5s: %v", err)})
		case d < 0:
			errs = append(errs, FieldError{"sim.load_time", fmt.Sprintf("must not be negative, got %s", s.LoadTime)})
		}
	}
	for _, kv := range []struct {
		key string
		v   float64
	}{{"sim.prefill_tps", s.PrefillTPS}, {"sim.decode_tps", s.DecodeTPS}} {
		if math.IsNaN(kv.v) || math.IsInf(kv.v, 0) || kv.v < 0 {
			errs = append(errs, FieldError{kv.key, fmt.Sprintf("must be a finite number >= 0 tokens/s, got %v", kv.v)})
		}
	}
	if s.VRAMMiB < 0 {
		errs = append(errs, FieldError{"sim.vram_mib", fmt.Sprintf("must be >= 0, got %d", s.VRAMMiB)})
	}
	return errs
}

// ValidProfileName checks a profile name (the YAML key). Names appear in URLs,
// CLI arguments, Telegram commands and the environment file, so they are
// restricted to letters, digits, '.', '_' and '-', at most 64 bytes, not
// starting with '-' or '.'.
func ValidProfileName(name string) error {
	if name == "" {
		return fmt.Errorf("profile name must not be empty")
	}
	if len(name) > 64 {
		return fmt.Errorf("profile name %q is longer than 64 bytes", name)
	}
	if name[0] == '-' || name[0] == '.' {
		return fmt.Errorf("profile name %q must not start with %q", name, name[0])
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("profile name %q contains %q: use letters, digits, '.', '_' and '-'", name, r)
		}
	}
	return nil
}

// argWord checks that v survives the trip EnvironmentFile → `$GPUHOST_ARGS`
// splitting as exactly one argument.
func argWord(v string) error {
	if v == "" {
		return fmt.Errorf("must not be empty")
	}
	if !utf8.ValidString(v) {
		return fmt.Errorf("%q is not valid UTF-8", v)
	}
	for _, r := range v {
		switch {
		case unicode.IsSpace(r):
			return fmt.Errorf("%q contains whitespace; systemd splits $GPUHOST_ARGS at whitespace, so it would become several arguments", v)
		case unicode.IsControl(r):
			return fmt.Errorf("%q contains a control character", v)
		case r == '"' || r == '\'' || r == '\\':
			return fmt.Errorf("%q contains %q; systemd would interpret it while splitting $GPUHOST_ARGS", v, r)
		}
	}
	return nil
}

// HealthPath is the backend's cheap readiness endpoint: vLLM serves
// /health only once the engine is up; Ollama answers /api/version as soon
// as it listens (models load on demand). The Supervisor, the panel and the
// bot all ask the same one.
func HealthPath(b Backend) string {
	if b == Ollama {
		return "/api/version"
	}
	return "/health"
}
