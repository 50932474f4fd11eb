package bench

import (
	"fmt"
	"maps"
	"math"
	"strconv"
	"time"
)

// SchemaVersion is the version of the result JSON written by this code. It
// grows when a field changes meaning or disappears; adding fields does not
// bump it. Readers skip files with a newer version (with a warning) rather
// than misread them.
const SchemaVersion = 1

// Result is one `gpuhost bench run`, stored as one JSON file (see Store).
//
// Schema (schema_version 1). Times are RFC 3339; durations are
// milliseconds; rates are tokens (or requests) per second. Every repeated
// figure is a Stat {samples, mean, stddev, n} with one sample per repeat.
//
//	schema_version  int        always 1 for this layout
//	id              string     "<UTC timestamp>-<profile>", the file name without .json
//	status          string     "ok" | "partial" (some measurements failed) | "failed" (nothing measured)
//	started_at, finished_at
//	fingerprint     Fingerprint   what was measured on what
//	config          RunConfig     what was asked for
//	prefill[]       {target_tokens, prompt_tokens, calibration, ttft_ms, tok_s, errors}
//	decode[]        {tokens, api, length ("forced" | "capped"), min_tokens,
//	                 produced_tokens, short, tok_s, server_tok_s, errors}
//	serving[]       {concurrency, requests, input_tokens, output_tokens,
//	                 ttft_ms, tpot_ms, itl_ms, e2e_ms ({mean, p50, p90, p99} of Stat),
//	                 output_tok_s, req_s, total_tok_s, duration_s, total_input_tokens,
//	                 total_output_tokens, completed, failed, failures{reason: count}}
//	roofline        {bandwidth_gbs, params_b, weight_bits, kv_bytes_per_token,
//	                 context_tokens, bytes_per_token, ceiling_tok_s, decode[]{tokens, tok_s, pct_of_ceiling}}
//	cross_checks[]  {name, client, server, unit, disagreement_pct, note}
//	switch          SwitchBench: only in a `bench switch` result, whose
//	                prefill, decode and serving are empty (see SwitchBench)
//	capacity        CapacityBench: only in a `bench capacity` result, whose
//	                prefill, decode and serving are empty (see CapacityBench)
//	errors[]        {phase, message, count}
//	notes[]         string
//
// Definitions follow vLLM's `bench serve`: TTFT is request start to the
// first generated token; TPOT = (E2E − TTFT)/(output tokens − 1); ITL is
// each gap between token-carrying chunks; prefill tok/s = prompt tokens /
// TTFT (max_tokens 1); decode tok/s = (output tokens − 1)/(t_last − t_first).
// Token counts are the server's own (usage, eval_count), never re-tokenised.
type Result struct {
	SchemaVersion int         `json:"schema_version"`
	ID            string      `json:"id"`
	Status        string      `json:"status"`
	StartedAt     time.Time   `json:"started_at"`
	FinishedAt    time.Time   `json:"finished_at"`
	Fingerprint   Fingerprint `json:"fingerprint"`
	Config        RunConfig   `json:"config"`
	Prefill       []Prefill   `json:"prefill"`
	Decode        []Decode    `json:"decode"`
	Serving       []Serving   `json:"serving"`
	Roofline      *Roofline   `json:"roofline,omitempty"`
	CrossChecks   []Cross     `json:"cross_checks"`
	// Switch is set on the result of `gpuhost bench switch`, nil on a run.
	Switch *SwitchBench `json:"switch,omitempty"`
	// Capacity is set on the result of `gpuhost bench capacity`.
	Capacity *CapacityBench `json:"capacity,omitempty"`
	Errors   []RunError     `json:"errors"`
	Notes    []string       `json:"notes"`
}

// Kind is "switch" for a `bench switch` result, "capacity" for a `bench
// capacity` result, "run" for the others.
func (r *Result) Kind() string {
	switch {
	case r.Switch != nil:
		return KindSwitch
	case r.Capacity != nil:
		return KindCapacity
	}
	return KindRun
}

// Result kinds.
const (
	KindRun      = "run"
	KindSwitch   = "switch"
	KindCapacity = "capacity"
)

// Result statuses.
const (
	StatusOK      = "ok"
	StatusPartial = "partial"
	StatusFailed  = "failed"
)

// Fingerprint says what was measured on what, so that two results are only
// compared knowingly: a driver update or a different backend version is
// usually the explanation of a difference.
type Fingerprint struct {
	GPUName      string `json:"gpu_name,omitempty"`
	GPUMemoryMiB uint64 `json:"gpu_memory_mib,omitempty"`
	// GPUs is the GPU set the profile ran on when it names one ("[1]",
	// "[0, 1]", "auto"; empty: GPU 0, no gpus key), and GPUUUIDs the
	// cards of a fixed set, so a result from another placement is told
	// apart.
	GPUs           string   `json:"gpus,omitempty"`
	GPUUUIDs       []string `json:"gpu_uuids,omitempty"`
	Driver         string   `json:"driver,omitempty"`
	CUDA           string   `json:"cuda,omitempty"`
	GPUBackend     string   `json:"gpu_backend,omitempty"` // "nvml" or "sim"
	Backend        string   `json:"backend"`               // vllm, ollama or openai (unknown server)
	BackendVersion string   `json:"backend_version,omitempty"`
	Profile        string   `json:"profile,omitempty"`
	// ProfileFlags is the backend's command line of the profile, so a flag
	// change shows up in compare.
	ProfileFlags    []string `json:"profile_flags,omitempty"`
	Model           string   `json:"model"`
	URL             string   `json:"url"`
	GpuhostVersion  string   `json:"gpuhost_version,omitempty"`
	GpuhostCommit   string   `json:"gpuhost_commit,omitempty"`
	Host            string   `json:"host,omitempty"`
	MaxModelLen     int      `json:"max_model_len,omitempty"`
	FingerprintNote []string `json:"fingerprint_notes,omitempty"`
	// Server is what the server reveals of its settings, so that compare
	// can name a server-side change (a --url run has no profile flags):
	// Ollama's /api/show parameters ("ollama.param.num_ctx", num_thread,
	// stop …) and details (quantization, parameter size, family) and
	// /api/ps ("ollama.ps.context_length", size_vram); vLLM's
	// vllm:cache_config_info labels ("vllm.cache_config.block_size", …).
	Server map[string]string `json:"server_settings,omitempty"`
}

func (f *Fingerprint) addServer(kv map[string]string) {
	if len(kv) == 0 {
		return
	}
	if f.Server == nil {
		f.Server = map[string]string{}
	}
	maps.Copy(f.Server, kv)
}

// Prefill is the prompt-processing measurement at one prompt length.
type Prefill struct {
	// TargetTokens is the asked prompt length (after capping to the
	// model's context), PromptTokens the mean length the server reported.
	TargetTokens int     `json:"target_tokens"`
	PromptTokens float64 `json:"prompt_tokens"`
	// Calibration is how the prompt was sized: "tokenize" (the server's
	// /tokenize) or "usage" (usage.prompt_tokens feedback).
	Calibration string   `json:"calibration"`
	TTFTms      Stat     `json:"ttft_ms"`
	TokS        Stat     `json:"tok_s"`
	Errors      []string `json:"errors,omitempty"`
}

// Decode is the generation measurement at one output length.
type Decode struct {
	// Tokens is the asked length.
	Tokens int `json:"tokens"`
	// API is "openai" (/v1/chat/completions with ignore_eos and min_tokens)
	// or "ollama" (/api/generate with num_predict).
	API string `json:"api"`
	// Length is "forced" (ignore_eos + min_tokens: every counted request
	// produced Tokens) or "capped" (Ollama's num_predict: the model may
	// stop early; a request counts when it produced at least MinTokens,
	// and its rate is over the tokens it produced).
	Length    string `json:"length,omitempty"`
	MinTokens int    `json:"min_tokens,omitempty"`
	// Produced is the tokens each counted request produced; Short how
	// many of them stopped before Tokens.
	Produced Stat `json:"produced_tokens"`
	Short    int  `json:"short,omitempty"`
	TokS     Stat `json:"tok_s"`
	// ServerTokS is the server's own figure where it reports one (Ollama:
	// eval_count / eval_duration).
	ServerTokS *Stat    `json:"server_tok_s,omitempty"`
	Errors     []string `json:"errors,omitempty"`
}

// Decode lengths.
const (
	LengthForced = "forced"
	LengthCapped = "capped"
)

// Serving is the load measurement at one concurrency.
type Serving struct {
	// Concurrency is the closed-loop level (requests in flight); 0 for an
	// open-loop level, which has RequestRate (Poisson arrivals per second).
	Concurrency  int     `json:"concurrency"`
	RequestRate  float64 `json:"request_rate,omitempty"`
	Requests     int     `json:"requests"` // per repeat
	InputTokens  int     `json:"input_tokens"`
	OutputTokens int     `json:"output_tokens"`
	// Latencies (ms): each field of the distribution is a Stat across
	// repeats, e.g. TTFT.P99.Mean is the mean over repeats of each repeat's
	// p99.
	TTFT      DistStat `json:"ttft_ms"`
	TPOT      DistStat `json:"tpot_ms"`
	ITL       DistStat `json:"itl_ms"`
	E2E       DistStat `json:"e2e_ms"`
	OutputTPS Stat     `json:"output_tok_s"`
	ReqPerS   Stat     `json:"req_s"`
	// TotalTPS is (prompt + output tokens) / duration per repeat, as
	// vLLM's "total token throughput"; DurationS the wall time of each
	// repeat of this level; the totals are over all repeats (server
	// counts).
	TotalTPS          Stat `json:"total_tok_s"`
	DurationS         Stat `json:"duration_s"`
	TotalInputTokens  int  `json:"total_input_tokens"`
	TotalOutputTokens int  `json:"total_output_tokens"`
	Completed         int  `json:"completed"` // over all repeats
	Failed            int  `json:"failed"`
	// Failures counts failed requests by reason.
	Failures map[string]int `json:"failures,omitempty"`
	// Short counts requests that ended before the asked output length (a
	// server that cannot force the length, such as Ollama's /v1).
	Short int `json:"short,omitempty"`
}

// DistStat is a latency distribution across repeats.
type DistStat struct {
	Mean Stat `json:"mean"`
	P50  Stat `json:"p50"`
	P90  Stat `json:"p90"`
	P99  Stat `json:"p99"`
}

func newDistStat(ds []Dist) DistStat {
	var m, p50, p90, p99 []float64
	for _, d := range ds {
		if d.N == 0 {
			continue
		}
		m, p50, p90, p99 = append(m, d.Mean), append(p50, d.P50), append(p90, d.P90), append(p99, d.P99)
	}
	return DistStat{Mean: NewStat(m), P50: NewStat(p50), P90: NewStat(p90), P99: NewStat(p99)}
}

// Cross is a cross-check of the client's figure against the server's own.
type Cross struct {
	Name   string  `json:"name"`
	Client float64 `json:"client"`
	Server float64 `json:"server"`
	Unit   string  `json:"unit"`
	// DisagreementPct is (client − server) / server × 100.
	DisagreementPct float64 `json:"disagreement_pct"`
	Note            string  `json:"note,omitempty"`
}

func newCross(name, unit string, client, server float64, note string) Cross {
	c := Cross{Name: name, Unit: unit, Client: client, Server: server, Note: note}
	switch {
	case server != 0 && !math.IsNaN(client) && !math.IsNaN(server):
		c.DisagreementPct = (client - server) / server * 100
	case c.Note == "":
		c.Note = "the server's figure is zero; no disagreement computed"
	}
	return c
}

// RunError is a problem recorded during a run: which phase, what happened,
// and how often (identical messages are counted, not repeated).
type RunError struct {
	Phase   string `json:"phase"`
	Message string `json:"message"`
	Count   int    `json:"count"`
}

// Metric is one comparable figure of a result, flattened for compare and
// the chart.
type Metric struct {
	Name string `json:"name"`
	Unit string `json:"unit"`
	// HigherIsBetter says which direction is an improvement.
	HigherIsBetter bool `json:"higher_is_better"`
	Stat           Stat `json:"stat"`
}

// Metrics flattens the result into named figures in a stable order:
// prefill.<len>.tok_s, decode.<len>.tok_s, then per concurrency
// serving.c<N>.{output_tok_s, req_s, total_tok_s, ttft_p50_ms, ttft_p99_ms, tpot_p50_ms,
// itl_p50_ms, e2e_p50_ms}; a switch result has
// switch.<from>-><to>.<path>_path.<mode>.{first_token_ms, switch_ms}
// instead, a capacity result capacity.users. Figures without samples are
// left out.
func (r *Result) Metrics() []Metric {
	var out []Metric
	if r.Switch != nil {
		out = append(out, r.Switch.metrics()...)
	}
	if r.Capacity != nil {
		out = append(out, r.Capacity.metrics()...)
	}
	add := func(name, unit string, higher bool, s Stat) {
		if s.N > 0 {
			out = append(out, Metric{Name: name, Unit: unit, HigherIsBetter: higher, Stat: s})
		}
	}
	for _, p := range r.Prefill {
		add("prefill."+strconv.Itoa(p.TargetTokens)+".tok_s", "tok/s", true, p.TokS)
		add("prefill."+strconv.Itoa(p.TargetTokens)+".ttft_ms", "ms", false, p.TTFTms)
	}
	for _, d := range r.Decode {
		add("decode."+strconv.Itoa(d.Tokens)+".tok_s", "tok/s", true, d.TokS)
	}
	for _, s := range r.Serving {
		pre := fmt.Sprintf("serving.c%d.", s.Concurrency)
		if s.RequestRate > 0 {
			pre = fmt.Sprintf("serving.r%g.", s.RequestRate)
		}
		add(pre+"output_tok_s", "tok/s", true, s.OutputTPS)
		add(pre+"req_s", "req/s", true, s.ReqPerS)
		add(pre+"total_tok_s", "tok/s", true, s.TotalTPS)
		add(pre+"ttft_p50_ms", "ms", false, s.TTFT.P50)
		add(pre+"ttft_p99_ms", "ms", false, s.TTFT.P99)
		add(pre+"tpot_p50_ms", "ms", false, s.TPOT.P50)
		add(pre+"itl_p50_ms", "ms", false, s.ITL.P50)
		add(pre+"e2e_p50_ms", "ms", false, s.E2E.P50)
	}
	return out
}

// addError records a problem, counting repeats of the same message.
func (r *Result) addError(phase, msg string) {
	for i := range r.Errors {
		if r.Errors[i].Phase == phase && r.Errors[i].Message == msg {
			r.Errors[i].Count++
			return
		}
	}
	r.Errors = append(r.Errors, RunError{Phase: phase, Message: msg, Count: 1})
}
