package simulator

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"
)

// Flavor selects which inference server the simulator imitates.
type Flavor string

const (
	// FlavorVLLM imitates `vllm serve` (OpenAI-compatible server, vLLM extras,
	// Prometheus metrics, listens only after the engine is loaded).
	FlavorVLLM Flavor = "vllm"
	// FlavorOllama imitates `ollama serve` (native /api, OpenAI-compatible /v1,
	// listens at once, loads models on demand and unloads them after keep_alive).
	FlavorOllama Flavor = "ollama"
)

// Defaults that mirror the real servers or the reference box (RTX 4090).
const (
	defaultHost          = "127.0.0.1"
	defaultVLLMPort      = 8000
	defaultOllamaPort    = 11434
	defaultPrefillTPS    = 2500
	defaultDecodeTPS     = 150
	defaultVLLMVRAM      = 20000
	defaultOllamaVRAM    = 6000
	defaultVLLMMaxLen    = 32768
	defaultOllamaCtx     = 4096
	defaultVLLMSeqs      = 256
	defaultOllamaSeqs    = 1
	defaultNaturalTokens = 64
	defaultKeepAlive     = 5 * time.Minute
	defaultVLLMVersion   = "0.11.0"
	defaultOllamaVersion = "0.17.4"
	// referenceGPUMiB is the total memory of the reference box's RTX 4090;
	// --gpu-memory-utilization is a fraction of the whole card.
	referenceGPUMiB = 24564
	// defaultGPUMemoryUtilization is vLLM's own default, reported in
	// vllm:cache_config_info when no flag was given.
	defaultGPUMemoryUtilization = 0.9
	// defaultSleepResidualMiB is what a sleeping vLLM keeps on the GPU (CUDA
	// context, CUDA graphs, the allocator's own bookkeeping); capped at the
	// VRAM claim.
	defaultSleepResidualMiB = 512
	// defaultH2DGBps is a PCIe 4.0 x16 host-to-device copy in practice
	// (GB/s, 10^9 bytes): how fast sleep level 1 offloads the weights and
	// wake_up copies them back.
	defaultH2DGBps = 25
	// defaultReloadGBps is how fast collective_rpc reload_weights reads the
	// weights again after sleep level 2 (page cache or NVMe, then the copy).
	defaultReloadGBps = 3
)

// Options configures one simulated server. Zero values mean "the default of the
// imitated server"; Run fills them in (see each field).
type Options struct {
	// Flavor is the server to imitate; required.
	Flavor Flavor
	// Host is the interface to listen on; default 127.0.0.1.
	Host string
	// Port is the TCP port; default 8000 (vLLM) or 11434 (Ollama).
	Port int
	// Addr, when set, is the listen address ("host:port") and overrides Host and
	// Port. Tests use "127.0.0.1:0" and learn the bound port through Ready.
	Addr string
	// Model is the vLLM model id (`vllm serve MODEL`) or an Ollama tag that is
	// "pulled". Required for vLLM.
	Model string
	// Models are further Ollama tags that are "pulled" (Ollama only).
	Models []string
	// ServedName is vLLM's --served-model-name; default Model.
	ServedName string
	// ServedNameAliases are further --served-model-name values; vLLM answers
	// to each of them and lists each in /v1/models.
	ServedNameAliases []string
	// LoadTime is, for vLLM, the engine start-up time before the HTTP server
	// listens (real vLLM binds only after the weights are loaded); for Ollama,
	// the time a request for an unloaded model spends loading it.
	LoadTime time.Duration
	// PrefillTPS is the prompt processing rate in tokens/s; default 2500.
	PrefillTPS float64
	// DecodeTPS is the per-sequence generation rate in tokens/s; default 150.
	DecodeTPS float64
	// Jitter is the relative standard deviation of each request's prefill
	// and decode rates (0: none; at most 0.3), drawn from JitterSeed: the
	// request-to-request scatter of a real server, so that tests of the
	// bench's statistics see noise that they must not call a change.
	Jitter     float64
	JitterSeed uint64
	// NaturalTokens is how many tokens a reply has when nothing caps it (the
	// point where the simulated model "emits EOS"); default 64.
	NaturalTokens int
	// VRAMMiB is the simulated GPU memory claimed while a model is loaded.
	// Default for vLLM: GPUMemoryUtilization × 24564 (the reference RTX 4090)
	// when the utilisation is set, else 20000; for Ollama: 6000 per model.
	VRAMMiB int
	// GPUMemoryUtilization is vLLM's --gpu-memory-utilization (0 < x ≤ 1).
	GPUMemoryUtilization float64
	// MaxModelLen is vLLM's --max-model-len (default 32768) or Ollama's default
	// num_ctx (default 4096).
	MaxModelLen int
	// MaxNumSeqs is how many requests generate at once; the rest wait.
	// Default 256 (vLLM --max-num-seqs) or 1 (OLLAMA_NUM_PARALLEL).
	MaxNumSeqs int
	// KeepAlive is Ollama's default keep_alive (OLLAMA_KEEP_ALIVE); default 5m,
	// negative keeps models loaded forever.
	KeepAlive time.Duration
	// EnableAutoToolChoice is vLLM's --enable-auto-tool-choice. Without it a
	// request with tool_choice "auto" (the default when tools are sent) is
	// refused with vLLM's 400, as the real server does.
	EnableAutoToolChoice bool
	// ToolCallParser is vLLM's --tool-call-parser; vLLM refuses to start with
	// --enable-auto-tool-choice but no parser, and so does Run.
	ToolCallParser string
	// ScriptedTools turns on the scripted tool-use mode (tooluse.go,
	// `--scripted-tools`): offered tools are called as a question names them,
	// a failed call is retried once with corrected arguments, and tool
	// results are answered in prose labelled "[simulated model]", so the
	// demo shows an agent loop honestly. Off, replies are the filler words.
	ScriptedTools bool
	// Quantization is vLLM's --quantization (recorded, shown in logs).
	Quantization string
	// KVCacheDType is vLLM's --kv-cache-dtype (reported in cache_config_info).
	KVCacheDType string
	// DevMode is VLLM_SERVER_DEV_MODE=1: vLLM mounts its development routes
	// (/sleep, /wake_up, /is_sleeping, /collective_rpc, /reset_prefix_cache)
	// only then; without it they answer 404 like any unknown route.
	DevMode bool
	// EnableSleepMode is vLLM's --enable-sleep-mode (allocations go through
	// vLLM's CuMem pool so /sleep can release them). Without it the
	// simulator's /sleep answers 500 (see sleepmode.go).
	EnableSleepMode bool
	// SleepResidualMiB is the VRAM a sleeping vLLM still holds
	// (`--sleep-residual-mib`); default 512, at most VRAMMiB.
	SleepResidualMiB int
	// WeightsMiB is the size of the model weights within VRAMMiB
	// (`--weights-mib`): what sleep level 1 offloads to host memory, what
	// wake_up copies back and what reload_weights reads again. Default:
	// three quarters of VRAMMiB less the residual, since the simulated KV
	// cache is the remaining quarter (see newServer). WeightsMiB +
	// SleepResidualMiB must fit in VRAMMiB; the rest is the KV cache.
	WeightsMiB int
	// H2DGBps is the host-device copy rate in GB/s (`--h2d-gbps`, default
	// 25, PCIe 4.0 x16): sleep level 1 and its wake_up take WeightsMiB at
	// this rate.
	H2DGBps float64
	// ReloadGBps is the weight reload rate in GB/s (`--reload-gbps`,
	// default 3): collective_rpc reload_weights takes WeightsMiB at it.
	ReloadGBps float64
	// SchemaFault makes structured-output replies misbehave for tests
	// (`--schema-fault`): "" answers schema-valid JSON, "prose" answers prose,
	// "invalid" answers JSON that violates the schema, "prose-once" answers
	// the first structured request of the run with prose (see fixed.go).
	SchemaFault string
	// ToolCallFault makes tool calls misbehave for tests
	// (`--tool-call-fault`, toolfault.go): "" answers structured
	// tool_calls, "content" answers them as JSON text in content, "xml" as
	// Qwen3-Coder XML text, "bad-arguments" with arguments that are not
	// valid JSON.
	ToolCallFault string
	// TranscriptionFault "error" makes /v1/audio/transcriptions answer 500
	// (`--transcription-fault`); "" transcribes.
	TranscriptionFault string
	// WakeFault makes a woken vLLM engine misbehave for tests
	// (`--wake-fault`, wakefault.go): "hang", "output", "slow" after a
	// wake_up, "residual" at every sleep after the first; "" is healthy.
	WakeFault string
	// CrashFile makes the server crash at start (exit status 3, as a
	// backend dying of a CUDA error) while that file exists
	// (`--crash-file`); the crash-loop tests create and remove it.
	CrashFile string
	// CrashAfterRequests makes the server crash (exit status 3) right
	// after answering that many inference requests (`--crash-after-requests`);
	// 0 never.
	CrashAfterRequests int
	// StopDelay is how long the server keeps running (listening, holding
	// its simulated VRAM) after its context ends, like a backend that takes
	// seconds to stop (`--stop-delay`); default 0.
	StopDelay time.Duration
	// SimDir is the simulated GPU's claims directory; empty means no claim.
	SimDir string
	// Version is the reported server version; default 0.11.0 (vLLM) or 0.17.4
	// (Ollama).
	Version string
	// Logger receives start-up, access and load/unload logs; default
	// slog.Default().
	Logger *slog.Logger
	// Ready, when set, is called once with the bound address ("host:port")
	// when the server starts accepting connections, e.g. to send sd_notify
	// READY=1 or to let a test learn an ephemeral port.
	Ready func(addr string)
}

// withDefaults returns a copy of o with defaults filled in, or an error naming
// the first invalid field.
func (o Options) withDefaults() (Options, error) {
	switch o.Flavor {
	case FlavorVLLM, FlavorOllama:
	case "":
		return o, errors.New("simulator options: flavor is required (vllm or ollama)")
	default:
		return o, fmt.Errorf("simulator options: unknown flavor %q (want vllm or ollama)", o.Flavor)
	}
	vllm := o.Flavor == FlavorVLLM
	if err := o.addressDefaults(vllm); err != nil {
		return o, err
	}
	if err := o.modelDefaults(vllm); err != nil {
		return o, err
	}
	if err := o.timingDefaults(); err != nil {
		return o, err
	}
	if err := o.memoryDefaults(vllm); err != nil {
		return o, err
	}
	if err := o.limitDefaults(vllm); err != nil {
		return o, err
	}
	if err := validateFaults(o); err != nil {
		return o, err
	}
	if o.Version == "" {
		o.Version = pickS(vllm, defaultVLLMVersion, defaultOllamaVersion)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, nil
}

// addressDefaults fills in and checks the host and port.
func (o *Options) addressDefaults(vllm bool) error {
	if o.Host == "" {
		o.Host = defaultHost
	}
	if o.Port == 0 {
		o.Port = pick(vllm, defaultVLLMPort, defaultOllamaPort)
	}
	if o.Port < 0 || o.Port > 65535 {
		return fmt.Errorf("simulator options: port %d out of range 1-65535", o.Port)
	}
	return nil
}

// modelDefaults checks the model (required for vLLM), gathers Ollama's
// pulled tags, normalized and without repeats, and defaults the served name.
func (o *Options) modelDefaults(vllm bool) error {
	o.Model = strings.TrimSpace(o.Model)
	if vllm && o.Model == "" {
		return errors.New("simulator options: vllm needs a model (vllm serve MODEL)")
	}
	if !vllm {
		var tags []string
		seen := map[string]bool{}
		for _, m := range append([]string{o.Model}, o.Models...) {
			m = strings.TrimSpace(m)
			if m == "" {
				continue
			}
			t := normalizeTag(m)
			if !seen[t] {
				seen[t] = true
				tags = append(tags, t)
			}
		}
		o.Models = tags
		if len(tags) > 0 {
			o.Model = tags[0]
		}
	}
	if o.ServedName == "" {
		o.ServedName = o.Model
	}
	return nil
}

// timingDefaults checks the delays and fills in the rates and the natural
// reply length.
func (o *Options) timingDefaults() error {
	if o.StopDelay < 0 {
		return fmt.Errorf("simulator options: negative stop delay %s", o.StopDelay)
	}
	if o.LoadTime < 0 {
		return fmt.Errorf("simulator options: negative load time %s", o.LoadTime)
	}
	if err := positiveRate("prefill rate", &o.PrefillTPS, defaultPrefillTPS); err != nil {
		return err
	}
	if err := positiveRate("decode rate", &o.DecodeTPS, defaultDecodeTPS); err != nil {
		return err
	}
	if !(o.Jitter >= 0 && o.Jitter <= maxJitter) {
		return fmt.Errorf("simulator options: rate jitter %v: want 0 to %v", o.Jitter, maxJitter)
	}
	if o.NaturalTokens == 0 {
		o.NaturalTokens = defaultNaturalTokens
	}
	if o.NaturalTokens < 0 {
		return fmt.Errorf("simulator options: natural reply length %d must be positive", o.NaturalTokens)
	}
	return nil
}

// memoryDefaults checks the GPU memory utilization, fills in the VRAM claim
// and, for vLLM, the sleep mode sizes and rates.
func (o *Options) memoryDefaults(vllm bool) error {
	if o.GPUMemoryUtilization != 0 && !(o.GPUMemoryUtilization > 0 && o.GPUMemoryUtilization <= 1) {
		return fmt.Errorf("simulator options: gpu memory utilization %v must be in (0, 1]", o.GPUMemoryUtilization)
	}
	if o.VRAMMiB == 0 {
		switch {
		case !vllm:
			o.VRAMMiB = defaultOllamaVRAM
		case o.GPUMemoryUtilization > 0:
			o.VRAMMiB = int(math.Round(o.GPUMemoryUtilization * referenceGPUMiB))
		default:
			o.VRAMMiB = defaultVLLMVRAM
		}
	}
	if o.VRAMMiB < 0 {
		return fmt.Errorf("simulator options: negative VRAM claim %d MiB", o.VRAMMiB)
	}
	if vllm {
		if err := o.sleepDefaults(); err != nil {
			return err
		}
	}
	return nil
}

// limitDefaults fills in and checks the context length, the sequence
// limit and the keep-alive, and vLLM's tool choice flags.
func (o *Options) limitDefaults(vllm bool) error {
	if o.MaxModelLen == 0 {
		o.MaxModelLen = pick(vllm, defaultVLLMMaxLen, defaultOllamaCtx)
	}
	if o.MaxModelLen < 0 {
		return fmt.Errorf("simulator options: max model length %d must be positive", o.MaxModelLen)
	}
	if o.MaxNumSeqs == 0 {
		o.MaxNumSeqs = pick(vllm, defaultVLLMSeqs, defaultOllamaSeqs)
	}
	if o.MaxNumSeqs < 0 {
		return fmt.Errorf("simulator options: max num seqs %d must be positive", o.MaxNumSeqs)
	}
	if o.KeepAlive == 0 {
		o.KeepAlive = defaultKeepAlive
	}
	if vllm && o.EnableAutoToolChoice && o.ToolCallParser == "" {
		// vLLM's own start-up check (cli_args.validate_parsed_serve_args).
		return errors.New("simulator options: --enable-auto-tool-choice requires --tool-call-parser")
	}
	return nil
}

// sleepDefaults fills in and checks the sleep mode sizes and rates (vLLM).
func (o *Options) sleepDefaults() error {
	if o.SleepResidualMiB < 0 || o.SleepResidualMiB > o.VRAMMiB {
		return fmt.Errorf("simulator options: sleep residual %d MiB must be within the VRAM claim of %d MiB", o.SleepResidualMiB, o.VRAMMiB)
	}
	if o.SleepResidualMiB == 0 {
		o.SleepResidualMiB = min(defaultSleepResidualMiB, o.VRAMMiB)
	}
	if o.WeightsMiB < 0 {
		return fmt.Errorf("simulator options: negative weights size %d MiB", o.WeightsMiB)
	}
	if o.WeightsMiB == 0 {
		o.WeightsMiB = max(o.VRAMMiB*3/4-o.SleepResidualMiB, 0)
	}
	if o.WeightsMiB+o.SleepResidualMiB > o.VRAMMiB {
		return fmt.Errorf("simulator options: weights %d MiB plus sleep residual %d MiB exceed the VRAM claim of %d MiB",
			o.WeightsMiB, o.SleepResidualMiB, o.VRAMMiB)
	}
	for _, r := range []struct {
		what string
		v    *float64
		def  float64
	}{{"host-to-device rate", &o.H2DGBps, defaultH2DGBps}, {"weight reload rate", &o.ReloadGBps, defaultReloadGBps}} {
		if *r.v == 0 {
			*r.v = r.def
		}
		if math.IsNaN(*r.v) || math.IsInf(*r.v, 0) || *r.v <= 0 {
			return fmt.Errorf("simulator options: %s %v GB/s must be a positive number", r.what, *r.v)
		}
	}
	return nil
}

func positiveRate(what string, v *float64, def float64) error {
	if *v == 0 {
		*v = def
	}
	if math.IsNaN(*v) || math.IsInf(*v, 0) || *v <= 0 {
		return fmt.Errorf("simulator options: %s %v tokens/s must be a positive number", what, *v)
	}
	return nil
}

func pick(cond bool, a, b int) int {
	if cond {
		return a
	}
	return b
}

func pickS(cond bool, a, b string) string {
	if cond {
		return a
	}
	return b
}

// normalizeTag gives an Ollama model name its implicit ":latest" tag, the way
// Ollama resolves "qwen3" to "qwen3:latest".
func normalizeTag(name string) string {
	name = strings.TrimSpace(name)
	if name == "" {
		return ""
	}
	slash := strings.LastIndexByte(name, '/')
	if !strings.Contains(name[slash+1:], ":") {
		return name + ":latest"
	}
	return name
}
