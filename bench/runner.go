package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"gpuhost/nvml"
	"gpuhost/units"
)

// Defaults of a run: the prompt lengths an agent's requests span, decode
// lengths short and long, and the concurrencies of one user up to a small
// team, as in the issue.
var (
	DefaultPrefillTokens = []int{512, 2048, 8192}
	DefaultDecodeTokens  = []int{128, 512}
	DefaultConcurrency   = []int{1, 4, 16, 32}
)

// Defaults for the scalar options.
const (
	DefaultRepeats             = 5
	DefaultServingInputTokens  = 512
	DefaultServingOutputTokens = 128
	DefaultRequestTimeout      = 10 * time.Minute
	DefaultPreflightTimeout    = 10 * time.Second
	DefaultDecodeMinTokens     = 32
	// maxRepeats and the length bounds keep a typo from starting a run that
	// never ends.
	maxRepeats     = 100
	maxTokensAsked = 1 << 20
	// ConcurrencyLimit is the highest concurrency a run or a capacity
	// search takes (exported so that the commands name it in their flag
	// errors).
	ConcurrencyLimit = 1024
	// abortAfterTransport consecutive connection failures end the run: the
	// endpoint is down and every further request would fail the same way.
	abortAfterTransport = 3
)

// Phases of a run, in the order they run.
const (
	PhasePrefill = "prefill"
	PhaseDecode  = "decode"
	PhaseServing = "serving"
)

// The APIs a serving sweep can use (Options.ServingAPI).
const (
	ServingV1     = "v1"
	ServingNative = "native"
)

// AllPhases lists every phase.
var AllPhases = []string{PhasePrefill, PhaseDecode, PhaseServing}

// Progress is one step of a run, for a progress bar or the event bus.
type Progress struct {
	Phase   string `json:"phase"`
	Done    int    `json:"done"`
	Total   int    `json:"total"`
	Message string `json:"message"`
}

// Options configure one run. Zero values take the defaults above.
type Options struct {
	Target Target
	// ProfileName and Profile describe the gpuhost profile measured, if
	// any: fingerprint, file name, and the model size for the roofline.
	ProfileName string
	Profile     *units.Profile
	// Params overrides the profile's model_params for the roofline.
	Params units.ModelParams

	PrefillTokens []int
	DecodeTokens  []int
	Concurrency   []int
	// RequestRates are open-loop serving levels next to the closed-loop
	// concurrency sweep: requests arrive as a Poisson process at each rate
	// (req/s), whether or not earlier ones have finished, as vLLM's
	// `bench serve --request-rate`. Empty: none.
	RequestRates []float64
	// ArrivalSeed seeds the arrival times, so that two runs send the same
	// schedule; 0 is a valid seed.
	ArrivalSeed uint64
	// ServingRequests is the number of requests per concurrency level and
	// repeat; 0 means max(2×concurrency, 4).
	ServingRequests     int
	ServingInputTokens  int
	ServingOutputTokens int
	// ServingAPI is the API the serving sweep sends its requests to:
	// ServingV1 (default, what OpenAI clients use) or ServingNative
	// (Ollama's /api/chat, whose last line carries the server's own
	// timing of each request, so the sweep gets a server-side cross-check;
	// Ollama's /v1 reports none).
	ServingAPI string
	Repeats    int
	// Phases selects what to run (see AllPhases); empty runs all.
	Phases []string
	// RequestTimeout bounds one request; default 10 minutes.
	RequestTimeout time.Duration
	// DecodeMinTokens is the fewest tokens a decode request must produce
	// for its rate to count where the length is only capped (Ollama's
	// num_predict; the model may stop early): below it the request is an
	// error. Lengths shorter than it need their full length. Default 32.
	DecodeMinTokens int
	// PreflightTimeout bounds the one probe (GET /v1/models) that decides
	// whether the endpoint answers at all, before anything else is asked;
	// default 10 seconds.
	PreflightTimeout time.Duration

	// GPU returns the GPU facts for the fingerprint and the roofline; nil
	// leaves them out.
	GPU            func(ctx context.Context) (nvml.Snapshot, error)
	GpuhostVersion string
	GpuhostCommit  string
	// Progress, when set, is called after each measured request (from
	// several goroutines during the serving phase, serialised).
	Progress func(Progress)
	Log      *slog.Logger
	// HTTPClient replaces the default client (tests).
	HTTPClient *http.Client
	// Dial replaces the default client's TCP dial: the daemon passes the
	// loopback.Dialer that reaches a backend through its unix socket under
	// systemd (the backend's own port is in a private network there).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Started, when set, fixes the start time and thereby the result ID
	// (the daemon announces the ID before the run starts).
	Started time.Time
}

// RunConfig is the part of Options stored with a result.
type RunConfig struct {
	PrefillTokens       []int     `json:"prefill_tokens"`
	DecodeTokens        []int     `json:"decode_tokens"`
	Concurrency         []int     `json:"concurrency"`
	RequestRates        []float64 `json:"request_rates,omitempty"`
	ServingRequests     int       `json:"serving_requests"`
	ServingInputTokens  int       `json:"serving_input_tokens"`
	ServingOutputTokens int       `json:"serving_output_tokens"`
	ServingAPI          string    `json:"serving_api,omitempty"`
	Repeats             int       `json:"repeats"`
	Phases              []string  `json:"phases"`
	RequestTimeoutS     float64   `json:"request_timeout_s"`
	DecodeMinTokens     int       `json:"decode_min_tokens,omitempty"`
}

// Check reports the error Run would refuse the options with (after the
// defaults are filled in), naming the bad option, so that a command can
// refuse a bad flag as a usage error before anything starts.
func (o Options) Check() error {
	_, err := o.withDefaults()
	return err
}

// withDefaults fills in defaults and validates, naming the bad option.
func (o Options) withDefaults() (Options, error) {
	if o.PrefillTokens == nil {
		o.PrefillTokens = DefaultPrefillTokens
	}
	if o.DecodeTokens == nil {
		o.DecodeTokens = DefaultDecodeTokens
	}
	if o.Concurrency == nil {
		o.Concurrency = DefaultConcurrency
	}
	if o.Repeats == 0 {
		o.Repeats = DefaultRepeats
	}
	if o.ServingInputTokens == 0 {
		o.ServingInputTokens = DefaultServingInputTokens
	}
	if o.ServingOutputTokens == 0 {
		o.ServingOutputTokens = DefaultServingOutputTokens
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = DefaultRequestTimeout
	}
	if o.PreflightTimeout == 0 {
		o.PreflightTimeout = DefaultPreflightTimeout
	}
	if o.DecodeMinTokens == 0 {
		o.DecodeMinTokens = DefaultDecodeMinTokens
	}
	if len(o.Phases) == 0 {
		o.Phases = AllPhases
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Repeats < 1 || o.Repeats > maxRepeats {
		return o, fmt.Errorf("repeats %d: want 1 to %d", o.Repeats, maxRepeats)
	}
	for _, l := range [][2]any{{"prefill", o.PrefillTokens}, {"decode", o.DecodeTokens}} {
		for _, n := range l[1].([]int) {
			if n < 1 || n > maxTokensAsked {
				return o, fmt.Errorf("%s length %d tokens: want 1 to %d", l[0], n, maxTokensAsked)
			}
		}
	}
	for _, n := range o.DecodeTokens {
		if n < 2 {
			return o, fmt.Errorf("decode length %d tokens: want at least 2 (the rate needs two token times)", n)
		}
	}
	for _, rate := range o.RequestRates {
		if !(rate > 0 && rate <= 10000) {
			return o, fmt.Errorf("request rate %v: want more than 0 and at most 10000 requests per second", rate)
		}
	}
	for _, c := range o.Concurrency {
		if c < 1 || c > ConcurrencyLimit {
			return o, fmt.Errorf("concurrency %d: want 1 to %d", c, ConcurrencyLimit)
		}
	}
	if o.ServingRequests < 0 || o.ServingRequests > 100000 {
		return o, fmt.Errorf("serving requests %d: want 0 (automatic) to 100000", o.ServingRequests)
	}
	if o.ServingInputTokens < 1 || o.ServingInputTokens > maxTokensAsked {
		return o, fmt.Errorf("serving input length %d tokens: want 1 to %d", o.ServingInputTokens, maxTokensAsked)
	}
	if o.ServingOutputTokens < 1 || o.ServingOutputTokens > maxTokensAsked {
		return o, fmt.Errorf("serving output length %d tokens: want 1 to %d", o.ServingOutputTokens, maxTokensAsked)
	}
	if o.RequestTimeout < 0 {
		return o, fmt.Errorf("request timeout %s: must be positive", o.RequestTimeout)
	}
	if o.DecodeMinTokens < 2 {
		return o, fmt.Errorf("decode minimum %d tokens: want at least 2 (the rate needs two token times)", o.DecodeMinTokens)
	}
	if o.PreflightTimeout < 0 {
		return o, fmt.Errorf("pre-flight timeout %s: must be positive", o.PreflightTimeout)
	}
	if o.ServingAPI != "" && o.ServingAPI != ServingV1 && o.ServingAPI != ServingNative {
		return o, fmt.Errorf("serving API %q: want %s or %s", o.ServingAPI, ServingV1, ServingNative)
	}
	for _, p := range o.Phases {
		if !slices.Contains(AllPhases, p) {
			return o, fmt.Errorf("phase %q: want one of %s", p, strings.Join(AllPhases, ", "))
		}
	}
	return o, nil
}

// servingLevel is one level of the serving sweep: closed loop at a
// concurrency, or open loop at a request rate.
type servingLevel struct {
	c    int
	rate float64
}

func (o Options) servingLevels() []servingLevel {
	var ls []servingLevel
	for _, c := range o.Concurrency {
		ls = append(ls, servingLevel{c: c})
	}
	for _, r := range o.RequestRates {
		ls = append(ls, servingLevel{rate: r})
	}
	return ls
}

func (l servingLevel) String() string {
	if l.rate > 0 {
		return fmt.Sprintf("rate=%g/s", l.rate)
	}
	return fmt.Sprintf("c=%d", l.c)
}

// requests is how many requests a level sends per repeat: ServingRequests,
// else max(2×concurrency, 4) or max(2 s of arrivals, 4).
func (o Options) levelRequests(l servingLevel) int {
	if l.rate > 0 {
		if o.ServingRequests > 0 {
			return o.ServingRequests
		}
		return max(int(math.Ceil(2*l.rate)), 4)
	}
	return o.servingRequests(l.c)
}

// arrivals returns n arrival offsets of a Poisson process at rate per
// second (exponential gaps), the first at 0.
func arrivals(n int, rate float64, seed uint64) []time.Duration {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	out := make([]time.Duration, n)
	t := 0.0
	for i := 1; i < n; i++ {
		t += rng.ExpFloat64() / rate
		out[i] = time.Duration(t * float64(time.Second))
	}
	return out
}

func (o Options) servingRequests(c int) int {
	if o.ServingRequests > 0 {
		return o.ServingRequests
	}
	return max(2*c, 4)
}

func (o Options) runConfig() RunConfig {
	return RunConfig{
		PrefillTokens: o.PrefillTokens, DecodeTokens: o.DecodeTokens, Concurrency: o.Concurrency, RequestRates: o.RequestRates,
		ServingRequests: o.ServingRequests, ServingInputTokens: o.ServingInputTokens,
		ServingOutputTokens: o.ServingOutputTokens, ServingAPI: o.ServingAPI, Repeats: o.Repeats, Phases: o.Phases,
		RequestTimeoutS: o.RequestTimeout.Seconds(), DecodeMinTokens: o.DecodeMinTokens,
	}
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// NewID is the ID (and file stem) of a run started at t for a profile:
// "20260102T150405Z-coder". The name is reduced to file-safe characters;
// empty gives "run".
func NewID(t time.Time, name string) string {
	name = strings.Trim(unsafeName.ReplaceAllString(name, "_"), "._-")
	if len(name) > 64 {
		name = name[:64]
	}
	if name == "" {
		name = "run"
	}
	return t.UTC().Format("20060102T150405Z") + "-" + name
}

// Run measures the target and returns the result. The result is never nil:
// when the run cannot start or the endpoint fails, it carries the reasons
// (Errors, Status "failed" or "partial") so that it can be stored and shown;
// the error is then the reason the run stopped.
func Run(ctx context.Context, opts Options) (*Result, error) {
	ru, cfgErr := newRunner(opts, "")
	r := ru.r
	defer func() { r.FinishedAt = time.Now().UTC() }()
	if cfgErr != nil {
		return r, cfgErr
	}
	err := ru.run(ctx)
	measured := 0
	for _, m := range r.Metrics() {
		measured += m.Stat.N
	}
	switch {
	case measured == 0:
		r.Status = StatusFailed
	case err != nil || len(r.Errors) > 0:
		r.Status = StatusPartial
	default:
		r.Status = StatusOK
	}
	if err == nil && measured == 0 {
		err = errors.New("nothing was measured; see the recorded errors")
	}
	return r, err
}

// newRunner completes opts and starts the result: status failed until
// something is measured, the ID and the fingerprint's known part. An
// invalid option is recorded in the result and returned (the runner is
// still usable for its result only). idPrefix starts the name part of
// the ID ("capacity-").
func newRunner(opts Options, idPrefix string) (*runner, error) {
	started := opts.Started
	if started.IsZero() {
		started = time.Now()
	}
	o, cfgErr := opts.withDefaults()
	r := &Result{
		SchemaVersion: SchemaVersion, Status: StatusFailed, StartedAt: started.UTC(),
		Config: o.runConfig(), Prefill: []Prefill{}, Decode: []Decode{}, Serving: []Serving{},
		CrossChecks: []Cross{}, Errors: []RunError{}, Notes: []string{},
	}
	name := o.ProfileName
	if name == "" {
		name = o.Target.Model
	}
	r.ID = NewID(started, idPrefix+name)
	r.Fingerprint = Fingerprint{Profile: o.ProfileName, Model: o.Target.Model, URL: o.Target.URL,
		GpuhostVersion: o.GpuhostVersion, GpuhostCommit: o.GpuhostCommit}
	r.Fingerprint.Host, _ = os.Hostname()
	if o.Profile != nil {
		r.Fingerprint.ProfileFlags = units.BackendArgs(*o.Profile, false)
	}
	ru := &runner{o: o, r: r, idPrefix: idPrefix}
	if cfgErr != nil {
		err := fmt.Errorf("bench options: %w", cfgErr)
		r.addError("config", err.Error())
		return ru, err
	}
	return ru, nil
}

// runner holds one run's state.
type runner struct {
	o        Options
	r        *Result
	idPrefix string // of the ID's name part (newRunner)
	ep       *endpoint
	maxLen   int // the model's context; 0 unknown

	mu       sync.Mutex // guards r.Errors and progress
	done     int
	total    int
	cancel   context.CancelCauseFunc
	failRun  atomic.Int32 // consecutive transport failures
	prompt   atomic.Int64 // server-reported tokens of all requests, for the cross-check
	gen      atomic.Int64
	noUsage  atomic.Int64
	calCache map[int]calibrated

	bandwidth          float64 // GB/s from NVML; 0 unknown
	decodePromptTokens int     // server-reported length of the decode prompt
}

var errEndpointDown = errors.New("the endpoint stopped answering")

func (ru *runner) run(parent context.Context) error {
	return ru.session(parent, func(ctx context.Context, before []byte) error {
		runErr := ru.phases(ctx)
		if before != nil && runErr == nil {
			ru.vllmCrossCheck(ctx, before)
		}
		ru.roofline(ctx)
		return runErr
	})
}

// session connects to the target (pre-flight, warm-up, vLLM's metrics
// before) and runs body on it, under a context that the endpoint-down
// detector cancels; before is the metrics read (nil when not read).
func (ru *runner) session(parent context.Context, body func(ctx context.Context, before []byte) error) error {
	o, r := ru.o, ru.r
	ctx, cancel := context.WithCancelCause(parent)
	defer cancel(nil)
	ru.cancel = cancel
	api, root, err := o.Target.normalize()
	if err != nil {
		r.addError("preflight", err.Error())
		return err
	}
	r.Fingerprint.URL = api
	hc := o.HTTPClient
	if hc == nil {
		hc = newRunClient(o.Concurrency, o.Dial)
		defer hc.CloseIdleConnections()
	}
	ru.ep = &endpoint{hc: hc, api: api, root: root, key: o.Target.APIKey}
	if err := ru.preflight(ctx); err != nil {
		return err
	}
	before, err := ru.prepare(ctx)
	if err != nil {
		return err
	}
	return body(ctx, before)
}

// newRunClient is the HTTP client of a run without Options.HTTPClient:
// enough idle connections for the largest concurrency, no proxy and no
// compression.
func newRunClient(concurrency []int, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *http.Client {
	maxC := 1
	for _, c := range concurrency {
		maxC = max(maxC, c)
	}
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		DialContext:         dial, // nil: net.Dialer
		MaxIdleConnsPerHost: maxC + 4,
		DisableCompression:  true, // a gzip layer would buffer the stream
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   false,
	}}
}

// preflight checks that the endpoint answers, then fills in the GPU facts,
// the server's flavor and version and the model to measure.
func (ru *runner) preflight(ctx context.Context) error {
	o, r := ru.o, ru.r
	// Pre-flight: one bounded probe decides whether the endpoint is an
	// answering OpenAI-compatible server before anything else is asked.
	served, err := ru.ep.models(ctx, o.PreflightTimeout)
	if err != nil {
		r.addError("preflight", err.Error())
		return err
	}
	ru.gpuFacts(ctx)
	dctx, dcancel := context.WithTimeout(ctx, o.PreflightTimeout)
	flavor, version := ru.ep.detect(dctx, o.Target.Flavor)
	dcancel()
	ru.ep.flavor = flavor
	r.Fingerprint.Backend, r.Fingerprint.BackendVersion = string(flavor), version
	m, err := resolveModel(o.Target.Model, served)
	if err != nil {
		err = fmt.Errorf("%s: %w", ru.ep.api, err)
		r.addError("preflight", err.Error())
		return err
	}
	ru.ep.model, r.Fingerprint.Model, ru.maxLen = m.ID, m.ID, m.MaxModelLen
	if o.ProfileName == "" && o.Target.Model == "" {
		r.ID = NewID(r.StartedAt, ru.idPrefix+m.ID) // name the file after the model found
	}
	return nil
}

// prepare reads vLLM's metrics before the run (returned for the
// cross-check; nil when not read), warms the model up, learns Ollama's
// context length and plans the steps.
func (ru *runner) prepare(ctx context.Context) ([]byte, error) {
	o, r := ru.o, ru.r
	flavor := ru.ep.flavor
	if o.ServingAPI == ServingNative && flavor != FlavorOllama && slices.Contains(o.Phases, PhaseServing) {
		err := fmt.Errorf("serving API %s is Ollama's /api/chat, and this server is %s: use %s", ServingNative, flavor, ServingV1)
		r.addError("preflight", err.Error())
		return nil, err
	}
	var before []byte
	if flavor == FlavorVLLM {
		var err error
		if before, err = ru.ep.getText(ctx, ru.ep.root+"/metrics"); err != nil {
			r.Notes = append(r.Notes, "no vLLM /metrics cross-check: "+err.Error())
		}
		r.Fingerprint.addServer(vllmCacheConfig(before))
	}
	if err := ru.warmup(ctx); err != nil {
		r.addError("warmup", err.Error())
		return nil, err
	}
	if flavor == FlavorOllama {
		settings := ru.ep.ollamaSettings(ctx)
		r.Fingerprint.addServer(settings)
		ru.maxLen, _ = strconv.Atoi(settings["ollama.ps.context_length"]) // 0 when /api/ps did not say
		if ru.maxLen == 0 {
			ru.maxLen = units.OllamaDefaultNumCtx
			if o.Profile != nil && o.Profile.Ollama.NumCtx > 0 {
				ru.maxLen = o.Profile.Ollama.NumCtx
			}
			r.Notes = append(r.Notes, fmt.Sprintf("Ollama did not report the context length; assuming %d", ru.maxLen))
		}
	}
	r.Fingerprint.MaxModelLen = ru.maxLen
	ru.total = ru.plannedSteps()
	return before, nil
}

// phases runs the chosen phases in order and returns why the run stopped
// early, if it did.
func (ru *runner) phases(ctx context.Context) error {
	for _, phase := range AllPhases {
		if !slices.Contains(ru.o.Phases, phase) {
			continue
		}
		ru.announce(phase)
		switch phase {
		case PhasePrefill:
			ru.prefillPhase(ctx)
		case PhaseDecode:
			ru.decodePhase(ctx)
		case PhaseServing:
			ru.servingPhase(ctx)
		}
		if ctx.Err() != nil {
			runErr := context.Cause(ctx)
			if errors.Is(runErr, errEndpointDown) {
				ru.r.addError(phase, "run aborted: "+runErr.Error())
			} else {
				ru.r.addError(phase, "run stopped: "+runErr.Error())
			}
			return runErr
		}
	}
	return nil
}

// gpuFacts fills the GPU part of the fingerprint.
func (ru *runner) gpuFacts(ctx context.Context) {
	if ru.o.GPU == nil {
		return
	}
	gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	snap, err := ru.o.GPU(gctx)
	if err != nil {
		ru.r.Fingerprint.FingerprintNote = append(ru.r.Fingerprint.FingerprintNote, "GPU facts unavailable: "+err.Error())
		return
	}
	f := &ru.r.Fingerprint
	f.Driver, f.CUDA, f.GPUBackend = snap.DriverVersion, snap.CUDADriverVersion, snap.Backend
	d, ok := snap.Device0()
	// A profile without gpus (GPU 0) records none, so its results compare
	// equal to those from before placements.
	if p := ru.o.Profile; p != nil && p.GPUs.Given {
		f.GPUs = p.GPUs.String()
		for k, i := range p.GPUs.Resolved() {
			dev, present := snap.Device(i)
			if !present {
				continue
			}
			f.GPUUUIDs = append(f.GPUUUIDs, dev.UUID)
			if k == 0 { // the card the profile's first rank runs on
				d, ok = dev, true
			}
		}
	}
	if ok {
		f.GPUName, f.GPUMemoryMiB = d.Name, d.MemoryTotalMiB
		ru.bandwidth = d.BandwidthGBs
	}
}

// plannedSteps is the number of measured requests, for progress.
func (ru *runner) plannedSteps() int {
	o := ru.o
	n := 0
	if slices.Contains(o.Phases, PhasePrefill) {
		n += o.Repeats * len(ru.prefillLengths())
	}
	if slices.Contains(o.Phases, PhaseDecode) {
		n += o.Repeats * len(o.DecodeTokens)
	}
	if slices.Contains(o.Phases, PhaseServing) {
		for _, l := range o.servingLevels() {
			n += o.Repeats * o.levelRequests(l)
		}
	}
	return n
}

func (ru *runner) step(phase, msg string) {
	ru.mu.Lock()
	defer ru.mu.Unlock()
	ru.done++
	if ru.o.Progress != nil {
		ru.o.Progress(Progress{Phase: phase, Done: ru.done, Total: ru.total, Message: msg})
	}
}

// announce reports the start of a phase (progress unchanged), so a
// watcher sees the phase before its first, possibly long, request ends.
func (ru *runner) announce(phase string) {
	ru.mu.Lock()
	defer ru.mu.Unlock()
	if ru.o.Progress != nil {
		ru.o.Progress(Progress{Phase: phase, Done: ru.done, Total: ru.total, Message: "starting " + phase})
	}
}

func (ru *runner) addError(phase, msg string) {
	ru.mu.Lock()
	defer ru.mu.Unlock()
	ru.r.addError(phase, msg)
}

// observe does the bookkeeping every request shares: token totals for the
// cross-check and the endpoint-down detector.
func (ru *runner) observe(s *sample, err error) {
	if s != nil && s.prompt >= 0 {
		ru.prompt.Add(int64(s.prompt))
		ru.gen.Add(int64(max(s.completion, 0)))
	} else if s != nil {
		ru.noUsage.Add(1)
	}
	if err != nil && isTransport(err) {
		if ru.failRun.Add(1) >= abortAfterTransport {
			ru.cancel(fmt.Errorf("%w: %d requests in a row failed, the last with: %v", errEndpointDown, abortAfterTransport, err))
		}
		return
	}
	ru.failRun.Store(0)
}

// request runs one chat request under the per-request timeout.
func (ru *runner) chat(ctx context.Context, content string, maxTokens int, force bool) (*sample, error) {
	rctx, cancel := context.WithTimeout(ctx, ru.o.RequestTimeout)
	defer cancel()
	req := chatRequest{Messages: []chatMessage{{Role: "user", Content: content}}, MaxTokens: maxTokens}
	if force && ru.ep.flavor != FlavorOllama {
		req.MinTokens, req.IgnoreEOS = maxTokens, true
	}
	s, err := ru.ep.chatStream(rctx, req)
	if err == nil && s.prompt < 0 {
		err = &StreamError{Msg: "the server sent no usage (stream_options.include_usage ignored); token counts must come from the server"}
	}
	ru.observe(s, err)
	return s, err
}

// warmup sends one short request of each kind, unmeasured, so that model
// loading, CUDA graphs and connection set-up do not land in the figures.
func (ru *runner) warmup(ctx context.Context) error {
	// Unforced: a generic server that rejects vLLM's extras still warms up
	// (and its decode errors then say why).
	if _, err := ru.chat(ctx, promptText(64), 8, false); err != nil {
		return fmt.Errorf("warm-up request: %w", err)
	}
	if ru.ep.flavor == FlavorOllama && slices.Contains(ru.o.Phases, PhaseDecode) {
		rctx, cancel := context.WithTimeout(ctx, ru.o.RequestTimeout)
		defer cancel()
		s, err := ru.ep.ollamaGenerate(rctx, promptText(64), 8)
		ru.observe(s, err)
		if err != nil {
			return fmt.Errorf("warm-up request (native API): %w", err)
		}
	}
	return nil
}

// calibration finds (once per length) the prompt size of target tokens.
func (ru *runner) calibration(ctx context.Context, target int) (calibrated, error) {
	if c, ok := ru.calCache[target]; ok {
		return c, nil
	}
	method, iters := "usage", 12
	useTokenize := ru.ep.flavor == FlavorVLLM
	count := func(ctx context.Context, chars int) (int, error) {
		text := promptText(chars)
		if useTokenize {
			n, ok, err := ru.ep.tokenize(ctx, text)
			if err != nil {
				return 0, fmt.Errorf("calibrate a %d-token prompt: %w", target, err)
			}
			if ok {
				method = "tokenize"
				return n, nil
			}
			useTokenize = false // no /tokenize: fall back to usage feedback
		}
		s, err := ru.chat(ctx, text, 1, false)
		if err != nil {
			return 0, fmt.Errorf("calibrate a %d-token prompt: %w", target, err)
		}
		return s.prompt, nil
	}
	if useTokenize {
		iters = 40
	}
	c, err := calibrate(ctx, target, iters, count)
	c.method = method
	if err == nil {
		if ru.calCache == nil {
			ru.calCache = map[int]calibrated{}
		}
		ru.calCache[target] = c
		if c.tokens != target {
			ru.r.Notes = append(ru.r.Notes, fmt.Sprintf("a %d-token prompt could not be built exactly; closest below: %d tokens", target, c.tokens))
		}
	}
	return c, err
}

// prefillLengths are the asked prompt lengths capped to the context (one
// token must still be generated), without duplicates.
func (ru *runner) prefillLengths() []int {
	var out []int
	for _, n := range ru.o.PrefillTokens {
		if ru.maxLen > 0 && n > ru.maxLen-1 {
			n = ru.maxLen - 1
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

func (ru *runner) prefillPhase(ctx context.Context) {
	o, r := ru.o, ru.r
	lengths := ru.prefillLengths()
	if ru.maxLen > 0 {
		for _, n := range o.PrefillTokens {
			if n > ru.maxLen-1 {
				r.Notes = append(r.Notes, fmt.Sprintf("prefill length %d capped to %d (the model's context is %d)", n, ru.maxLen-1, ru.maxLen))
			}
		}
	}
	type acc struct {
		cal        calibrated
		calErr     error
		ttft, tps  []float64
		promptSeen []float64
		errs       []string
	}
	accs := make([]*acc, len(lengths))
	for i, n := range lengths {
		a := &acc{}
		a.cal, a.calErr = ru.calibration(ctx, n)
		accs[i] = a
		if ctx.Err() != nil {
			return
		}
	}
	ttftBefore := ru.scrape(ctx)
	var clientTTFT []float64
	for rep := 0; rep < o.Repeats; rep++ {
		for i, n := range lengths {
			a := accs[i]
			msg := fmt.Sprintf("prefill %d tokens, repeat %d/%d", n, rep+1, o.Repeats)
			if a.calErr != nil {
				ru.step(PhasePrefill, msg)
				continue
			}
			s, err := ru.chat(ctx, promptText(a.cal.chars), 1, false)
			if ctx.Err() != nil {
				return
			}
			switch {
			case err != nil:
				a.errs = append(a.errs, err.Error())
			case len(s.tokenAt) == 0:
				a.errs = append(a.errs, "the server generated no token (empty answer)")
			case s.prompt <= 0:
				a.errs = append(a.errs, fmt.Sprintf("the server reported %d prompt tokens", s.prompt))
			default:
				ttft := s.ttft()
				a.ttft = append(a.ttft, ms(ttft))
				clientTTFT = append(clientTTFT, ms(ttft))
				a.tps = append(a.tps, float64(s.prompt)/ttft.Seconds())
				a.promptSeen = append(a.promptSeen, float64(s.prompt))
			}
			ru.step(PhasePrefill, msg)
		}
	}
	ru.ttftCrossCheck(ctx, ttftBefore, clientTTFT)
	for i, n := range lengths {
		a := accs[i]
		p := Prefill{TargetTokens: n, Calibration: a.cal.method, TTFTms: NewStat(a.ttft), TokS: NewStat(a.tps)}
		p.PromptTokens, _ = MeanStddev(a.promptSeen)
		if a.calErr != nil {
			a.errs = append(a.errs, a.calErr.Error())
		}
		p.Errors = dedupe(a.errs)
		for _, e := range p.Errors {
			ru.addError(PhasePrefill, fmt.Sprintf("%d tokens: %s", n, e))
		}
		r.Prefill = append(r.Prefill, p)
	}
}

// decodePrompt is the short prompt decode runs on.
const decodePromptChars = 64

func (ru *runner) decodePhase(ctx context.Context) {
	o, r := ru.o, ru.r
	native := ru.ep.flavor == FlavorOllama
	api := "openai"
	if native {
		api = "ollama"
	}
	type acc struct {
		tps, server, produced []float64
		pairs                 []crossPair // native: the client's and the server's rate of each request
		errs                  []string
		short                 int // counted requests that stopped before the asked length
	}
	lengths := slices.Clone(o.DecodeTokens)
	for i, n := range lengths {
		// The short prompt (≤ ~64 tokens) and the output must fit the context.
		if ru.maxLen > 0 && n > ru.maxLen-80 && ru.maxLen > 100 {
			lengths[i] = ru.maxLen - 80
			r.Notes = append(r.Notes, fmt.Sprintf("decode length %d capped to %d (the model's context is %d)", n, lengths[i], ru.maxLen))
		}
	}
	accs := make([]acc, len(lengths))
	for rep := 0; rep < o.Repeats; rep++ {
		for i, n := range lengths {
			msg := fmt.Sprintf("decode %d tokens, repeat %d/%d", n, rep+1, o.Repeats)
			var s *sample
			var err error
			if native {
				rctx, cancel := context.WithTimeout(ctx, o.RequestTimeout)
				s, err = ru.ep.ollamaGenerate(rctx, longOutputPrompt(), n)
				cancel()
				ru.observe(s, err)
			} else {
				s, err = ru.chat(ctx, promptText(decodePromptChars), n, true)
			}
			if ctx.Err() != nil {
				return
			}
			if s != nil && s.prompt > 0 {
				ru.decodePromptTokens = s.prompt
			}
			tps, serverTPS, err := decodeRate(s, n, min(n, o.DecodeMinTokens), native, err)
			if err != nil {
				accs[i].errs = append(accs[i].errs, err.Error())
			} else {
				accs[i].tps = append(accs[i].tps, tps)
				accs[i].produced = append(accs[i].produced, float64(s.completion))
				if s.completion < n {
					accs[i].short++
				}
				if native {
					accs[i].server = append(accs[i].server, serverTPS)
					accs[i].pairs = append(accs[i].pairs, crossPair{client: tps, server: serverTPS})
				}
			}
			ru.step(PhaseDecode, msg)
		}
	}
	for i, n := range lengths {
		d := Decode{Tokens: n, API: api, Length: LengthForced, TokS: NewStat(accs[i].tps), Produced: NewStat(accs[i].produced),
			Short: accs[i].short, Errors: dedupe(accs[i].errs)}
		if native {
			d.Length, d.MinTokens = LengthCapped, min(n, o.DecodeMinTokens)
			if d.Short > 0 {
				r.Notes = append(r.Notes, fmt.Sprintf("decode %d on Ollama: %d of %d counted requests stopped early (num_predict is a cap, not forced); "+
					"their rate is over the tokens produced (mean %.0f, min %.0f; requests under %d tokens are errors)",
					n, d.Short, d.TokS.N, d.Produced.Mean, slices.Min(d.Produced.Samples), d.MinTokens))
			}
			st := NewStat(accs[i].server)
			d.ServerTokS = &st
			if c, ok := decodeCross(n, accs[i].pairs); ok {
				r.CrossChecks = append(r.CrossChecks, c)
			}
		}
		for _, e := range d.Errors {
			ru.addError(PhaseDecode, fmt.Sprintf("%d tokens: %s", n, e))
		}
		r.Decode = append(r.Decode, d)
	}
}

// crossPair is one request's figure as the client measured it and as the
// server reported it (e.g. a decode rate and Ollama's eval_count /
// eval_duration).
type crossPair struct{ client, server float64 }

// scoredPair is a client/server pair with its disagreement,
// (client − server) / server × 100.
type scoredPair struct {
	crossPair
	pct float64
}

// byDisagreement scores the pairs that have a server figure and sorts them
// by disagreement. The cross-checks show all[(len−1)/2]: the request with
// the median disagreement (the lower one of an even count: a real
// request), so one request the client was descheduled in does not move
// the verdict.
func byDisagreement(pairs []crossPair) []scoredPair {
	var all []scoredPair
	for _, p := range pairs {
		if p.server <= 0 || math.IsNaN(p.client) || math.IsNaN(p.server) {
			continue
		}
		all = append(all, scoredPair{p, (p.client - p.server) / p.server * 100})
	}
	slices.SortStableFunc(all, func(a, b scoredPair) int { return cmp.Compare(a.pct, b.pct) })
	return all
}

// decodeCross compares the client's decode rate with the server's like with
// like: each request with its own eval_duration, so that a request slowed
// down by the machine's load moves both figures, not only the client's
// mean; the figure shown is byDisagreement's median.
func decodeCross(tokens int, pairs []crossPair) (Cross, bool) {
	all := byDisagreement(pairs)
	if len(all) == 0 {
		return Cross{}, false
	}
	each := make([]string, len(all))
	for i, s := range all {
		each[i] = fmt.Sprintf("%+.2f %%", s.pct)
	}
	mid := all[(len(all)-1)/2]
	note := fmt.Sprintf("per request (client vs the same request's eval_duration): %s; the request with the median disagreement is shown", strings.Join(each, ", "))
	return newCross(fmt.Sprintf("decode.%d client tok/s vs Ollama eval_count/eval_duration, same request, median of %d", tokens, len(all)),
		"tok/s", mid.client, mid.server, note), true
}

// decodeRate checks one decode sample and returns the client's rate
// (out − 1)/(t_last − t_first) and, for Ollama, the server's. Where the
// length is forced (ignore_eos + min_tokens) the server must produce want
// tokens; where it is only capped (Ollama's num_predict) the rate is over
// the tokens produced, at least minTokens of them.
func decodeRate(s *sample, want, minTokens int, native bool, err error) (tps, server float64, _ error) {
	if err != nil {
		return 0, 0, err
	}
	switch {
	case native && s.completion > want:
		return 0, 0, fmt.Errorf("ollama produced %d tokens for num_predict %d", s.completion, want)
	case native && s.completion < minTokens:
		return 0, 0, fmt.Errorf("ollama produced %d of %d tokens (done reason %q): num_predict is only a cap and the model stopped early, "+
			"under the %d-token minimum for a rate (--decode-min-tokens)", s.completion, want, s.finish, minTokens)
	case !native && s.completion != want:
		return 0, 0, fmt.Errorf("the server produced %d of %d tokens (finish reason %q): it ignored ignore_eos/min_tokens, so no decode rate is recorded",
			s.completion, want, s.finish)
	}
	if len(s.tokenAt) < 2 {
		return 0, 0, fmt.Errorf("only %d token-carrying chunk(s) for %d tokens: the server does not stream per token", len(s.tokenAt), s.completion)
	}
	span := s.tokenAt[len(s.tokenAt)-1] - s.tokenAt[0]
	if span <= 0 {
		return 0, 0, fmt.Errorf("all %d tokens arrived at once: the server does not stream", s.completion)
	}
	tps = float64(s.completion-1) / span.Seconds()
	if native {
		if s.evalDuration <= 0 || s.evalCount <= 0 {
			return 0, 0, fmt.Errorf("ollama reported eval_count %d and eval_duration %s", s.evalCount, s.evalDuration)
		}
		server = float64(s.evalCount) / s.evalDuration.Seconds()
	}
	return tps, server, nil
}

// servingRun is one concurrency level of one repeat.
type servingRun struct {
	ttft, tpot, itl, e2e []float64 // ms
	server               []servingPair
	outTokens, inTokens  int
	ok, failed, short    int
	failures             map[string]int
	duration             time.Duration
}

func (ru *runner) servingPhase(ctx context.Context) {
	o, r := ru.o, ru.r
	in, out := ru.servingLengths()
	cal, calErr := ru.calibration(ctx, in)
	levels := o.servingLevels()
	runs := make([][]servingRun, len(levels))
	for rep := 0; rep < o.Repeats && ctx.Err() == nil; rep++ {
		for i, l := range levels {
			n := o.levelRequests(l)
			if calErr != nil {
				for k := 0; k < n; k++ {
					ru.step(PhaseServing, fmt.Sprintf("serving %s skipped", l))
				}
				continue
			}
			sr := ru.servingLevel(ctx, l, n, cal.chars, out, rep)
			if ctx.Err() != nil {
				return
			}
			runs[i] = append(runs[i], sr)
		}
	}
	if calErr != nil {
		ru.addError(PhaseServing, calErr.Error())
	}
	for i, l := range levels {
		s := summarizeServing(l, o.levelRequests(l), in, out, runs[i])
		for k, v := range s.Failures {
			ru.mu.Lock()
			r.addError(PhaseServing, fmt.Sprintf("%s: %s", l, k))
			r.Errors[len(r.Errors)-1].Count += v - 1
			ru.mu.Unlock()
		}
		if s.Short > 0 {
			r.Notes = append(r.Notes, fmt.Sprintf("serving %s: %d requests ended before %d output tokens (the server does not force the length)", l, s.Short, out))
		}
		r.Serving = append(r.Serving, s)
		var pairs []servingPair
		for _, sr := range runs[i] {
			pairs = append(pairs, sr.server...)
		}
		r.CrossChecks = append(r.CrossChecks, servingCross(l, pairs)...)
	}
}

// servingLengths are the serving prompt and output lengths, capped to the
// model's context (with a note).
func (ru *runner) servingLengths() (in, out int) {
	in, out = ru.o.ServingInputTokens, ru.o.ServingOutputTokens
	if ru.maxLen > 0 && in+out > ru.maxLen {
		in = max(ru.maxLen-out, 16)
		if in+out > ru.maxLen {
			out = ru.maxLen - in
		}
		ru.r.Notes = append(ru.r.Notes, fmt.Sprintf("serving lengths capped to %d in + %d out (the model's context is %d)", in, out, ru.maxLen))
	}
	return in, out
}

// summarizeServing is one serving level over its repeats: the figures per
// repeat as Stats, the totals and the failures by reason.
func summarizeServing(l servingLevel, requests, in, out int, runs []servingRun) Serving {
	s := Serving{Concurrency: l.c, RequestRate: l.rate, Requests: requests, InputTokens: in, OutputTokens: out,
		Failures: map[string]int{}}
	var ttft, tpot, itl, e2e []Dist
	var otps, rps, ttps, dur []float64
	for _, sr := range runs {
		s.Completed += sr.ok
		s.Failed += sr.failed
		s.Short += sr.short
		s.TotalInputTokens += sr.inTokens
		s.TotalOutputTokens += sr.outTokens
		if sr.duration > 0 {
			dur = append(dur, sr.duration.Seconds())
		}
		for k, v := range sr.failures {
			s.Failures[k] += v
		}
		if sr.ok == 0 || sr.duration <= 0 {
			continue
		}
		ttft, tpot = append(ttft, NewDist(sr.ttft)), append(tpot, NewDist(sr.tpot))
		itl, e2e = append(itl, NewDist(sr.itl)), append(e2e, NewDist(sr.e2e))
		otps = append(otps, float64(sr.outTokens)/sr.duration.Seconds())
		rps = append(rps, float64(sr.ok)/sr.duration.Seconds())
		ttps = append(ttps, float64(sr.inTokens+sr.outTokens)/sr.duration.Seconds())
	}
	s.TTFT, s.TPOT, s.ITL, s.E2E = newDistStat(ttft), newDistStat(tpot), newDistStat(itl), newDistStat(e2e)
	s.OutputTPS, s.ReqPerS, s.TotalTPS, s.DurationS = NewStat(otps), NewStat(rps), NewStat(ttps), NewStat(dur)
	return s
}

// servingLevel sends n requests, closed loop with at most l.c in flight
// or open loop at Poisson arrivals of l.rate, and measures them as vLLM's
// bench serve does.
func (ru *runner) servingLevel(ctx context.Context, l servingLevel, n, chars, out, rep int) servingRun {
	sr := servingRun{failures: map[string]int{}}
	var mu sync.Mutex
	jobs := make(chan struct{}, n)
	workers := min(l.c, n)
	start := time.Now()
	if l.rate > 0 {
		// Open loop: one worker per request, each released at its arrival.
		workers = n
		go func() {
			defer close(jobs)
			t := time.NewTimer(0)
			defer t.Stop()
			for _, at := range arrivals(n, l.rate, ru.o.ArrivalSeed+uint64(rep)) {
				t.Reset(time.Until(start.Add(at)))
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				jobs <- struct{}{}
			}
		}()
	} else {
		for k := 0; k < n; k++ {
			jobs <- struct{}{}
		}
		close(jobs)
	}
	var wg sync.WaitGroup
	msg := fmt.Sprintf("serving %s, repeat %d/%d", l, rep+1, ru.o.Repeats)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range jobs {
				if ctx.Err() != nil {
					return
				}
				s, err := ru.servingRequest(ctx, promptText(chars), out)
				mu.Lock()
				switch {
				case ctx.Err() != nil:
				case err != nil:
					sr.failed++
					sr.failures[err.Error()]++
				case len(s.tokenAt) == 0:
					sr.failed++
					sr.failures["no token generated"]++
				default:
					sr.ok++
					sr.outTokens += s.completion
					if s.prompt > 0 {
						sr.inTokens += s.prompt
					}
					if s.completion < out {
						sr.short++
					}
					ttft := s.ttft()
					sr.ttft = append(sr.ttft, ms(ttft))
					sr.e2e = append(sr.e2e, ms(s.end))
					if s.completion > 1 {
						sr.tpot = append(sr.tpot, ms(s.end-ttft)/float64(s.completion-1))
					}
					for k := 1; k < len(s.tokenAt); k++ {
						sr.itl = append(sr.itl, ms(s.tokenAt[k]-s.tokenAt[k-1]))
					}
					if p, ok := newServingPair(s); ok {
						sr.server = append(sr.server, p)
					}
				}
				mu.Unlock()
				ru.step(PhaseServing, msg)
			}
		}()
	}
	wg.Wait()
	sr.duration = time.Since(start)
	return sr
}

// servingRequest sends one serving request: through /v1, forced only
// where the extras are known to work (vLLM; other servers end where they
// end, counted as short), or through Ollama's native /api/chat.
func (ru *runner) servingRequest(ctx context.Context, content string, out int) (*sample, error) {
	if ru.o.ServingAPI != ServingNative {
		return ru.chat(ctx, content, out, ru.ep.flavor == FlavorVLLM)
	}
	rctx, cancel := context.WithTimeout(ctx, ru.o.RequestTimeout)
	defer cancel()
	s, err := ru.ep.ollamaChat(rctx, content, out)
	ru.observe(s, err)
	return s, err
}

// scrape reads vLLM's /metrics, nil for other servers or on failure.
func (ru *runner) scrape(ctx context.Context) []byte {
	if ru.ep.flavor != FlavorVLLM {
		return nil
	}
	b, err := ru.ep.getText(ctx, ru.ep.root+"/metrics")
	if err != nil {
		return nil
	}
	return b
}

// ttftCrossCheck compares the client's mean TTFT over the prefill requests
// with vLLM's own (vllm:time_to_first_token_seconds over the same span):
// the difference is what the network, HTTP and the client add, so it bounds
// the runner's own error.
func (ru *runner) ttftCrossCheck(ctx context.Context, before []byte, client []float64) {
	if before == nil || len(client) == 0 {
		return
	}
	after := ru.scrape(ctx)
	const h = "vllm:time_to_first_token_seconds"
	s0, ok1 := promCounter(before, h+"_sum")
	c0, ok2 := promCounter(before, h+"_count")
	s1, ok3 := promCounter(after, h+"_sum")
	c1, ok4 := promCounter(after, h+"_count")
	if !(ok1 && ok2 && ok3 && ok4) || c1-c0 <= 0 {
		return
	}
	note := ""
	if int(c1-c0) != len(client) {
		note = fmt.Sprintf("the server counted %d first tokens for %d measured requests (another client, or failed requests)", int(c1-c0), len(client))
	}
	m, _ := MeanStddev(client)
	ru.r.CrossChecks = append(ru.r.CrossChecks, newCross("prefill TTFT client vs "+h, "ms", m, (s1-s0)/(c1-c0)*1000, note))
}

// vllmCrossCheck compares the tokens the client saw in usage with the
// server's own counters over the run.
func (ru *runner) vllmCrossCheck(ctx context.Context, before []byte) {
	after, err := ru.ep.getText(ctx, ru.ep.root+"/metrics")
	if err != nil {
		ru.r.Notes = append(ru.r.Notes, "no vLLM /metrics cross-check: "+err.Error())
		return
	}
	note := "assumes no other client used the server during the run"
	if n := ru.noUsage.Load(); n > 0 {
		note += fmt.Sprintf("; %d requests failed before reporting usage", n)
	}
	for _, m := range []struct {
		name   string
		client int64
	}{
		{"vllm:prompt_tokens_total", ru.prompt.Load()},
		{"vllm:generation_tokens_total", ru.gen.Load()},
	} {
		b, ok1 := promCounter(before, m.name)
		a, ok2 := promCounter(after, m.name)
		if !ok1 || !ok2 {
			ru.r.Notes = append(ru.r.Notes, "vLLM /metrics has no "+m.name)
			continue
		}
		ru.r.CrossChecks = append(ru.r.CrossChecks, newCross(m.name+" delta vs client usage", "tokens", float64(m.client), a-b, note))
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// dedupe keeps each message once, with a count when repeated.
func dedupe(msgs []string) []string {
	if len(msgs) == 0 {
		return nil
	}
	counts := map[string]int{}
	var order []string
	for _, m := range msgs {
		if counts[m] == 0 {
			order = append(order, m)
		}
		counts[m]++
	}
	out := make([]string, len(order))
	for i, m := range order {
		if counts[m] > 1 {
			out[i] = fmt.Sprintf("%s (×%d)", m, counts[m])
		} else {
			out[i] = m
		}
	}
	return out
}
