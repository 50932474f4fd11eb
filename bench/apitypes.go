package bench

// The bodies of the daemon's /api/bench routes, shared by the service that
// serves them (gpuhost/bench/benchapi), the commands that read them
// (gpuhost/bench/benchcmd) and the panel and MCP pages that show them; they
// live in the core so that none of those readers links the others' HTTP
// server or command line.

import (
	"net"
	"strconv"
	"time"

	"gpuhost/units"
)

// ProfileTarget is the endpoint of a profile's backend: the OpenAI API at
// 127.0.0.1:<port> (or proxyURL, e.g. the daemon's /v1, with the backend
// still reached directly for the extras), its served model name and flavour.
func ProfileTarget(p *units.Profile, proxyURL string) Target {
	direct := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(p.Port))
	t := Target{URL: direct, Model: p.ServedModelName(), Flavor: Flavor(p.Backend)}
	if proxyURL != "" {
		t.URL, t.ServerURL = proxyURL, direct
	}
	return t
}

// RunStatus is the state of the run in progress (or just finished).
type RunStatus struct {
	ID        string    `json:"id"`
	Profile   string    `json:"profile"`
	Status    string    `json:"status"` // running, ok, partial, failed
	StartedAt time.Time `json:"started_at"`
	Progress  Progress  `json:"progress"`
	Error     string    `json:"error,omitempty"`
	// Result is where the stored result is served once finished; empty
	// for a failed run that was not stored (see StartRequest.KeepFailed).
	Result string `json:"result"`
}

// StartRequest is the optional body of POST /api/bench: overrides of the
// run's lengths and repeats. Omitted fields keep the defaults.
type StartRequest struct {
	Repeats         int      `json:"repeats,omitempty"`
	PrefillTokens   []int    `json:"prefill_tokens,omitempty"`
	DecodeTokens    []int    `json:"decode_tokens,omitempty"`
	Concurrency     []int    `json:"concurrency,omitempty"`
	ServingRequests int      `json:"serving_requests,omitempty"`
	Phases          []string `json:"phases,omitempty"`
	// KeepFailed stores the result even when nothing was measured; by
	// default a failed run is only reported (status and error), so that
	// list, chart and compare hold measurements only.
	KeepFailed bool `json:"keep_failed,omitempty"`
}

// Apply returns opts with the request's overrides, checked as Run checks
// its options; a request the options refuse is a *RequestError (HTTP 400).
// It is exported for the daemon's service (benchapi), which starts runs
// from requests.
func (req StartRequest) Apply(opts Options) (Options, error) {
	if req.Repeats != 0 {
		opts.Repeats = req.Repeats
	}
	if req.PrefillTokens != nil {
		opts.PrefillTokens = req.PrefillTokens
	}
	if req.DecodeTokens != nil {
		opts.DecodeTokens = req.DecodeTokens
	}
	if req.Concurrency != nil {
		opts.Concurrency = req.Concurrency
	}
	if req.ServingRequests != 0 {
		opts.ServingRequests = req.ServingRequests
	}
	if req.Phases != nil {
		opts.Phases = req.Phases
	}
	if _, err := opts.withDefaults(); err != nil {
		return opts, &RequestError{Err: err}
	}
	return opts, nil
}

// RequestError is a StartRequest the run options refuse (HTTP 400).
type RequestError struct{ Err error }

func (e *RequestError) Error() string { return e.Err.Error() }
func (e *RequestError) Unwrap() error { return e.Err }

// Summary is one line of GET /api/bench and `gpuhost bench list`.
type Summary struct {
	ID string `json:"id"`
	// Kind is "run" (bench run), "switch" (bench switch: Profile is
	// "A,B", Backend and Model the two profiles' joined the same way, and
	// there are no tok/s figures) or "capacity" (bench capacity: Capacity
	// is set, no tok/s figures).
	Kind           string    `json:"kind"`
	Status         string    `json:"status"`
	StartedAt      time.Time `json:"started_at"`
	DurationS      float64   `json:"duration_s"`
	Profile        string    `json:"profile,omitempty"`
	Model          string    `json:"model"`
	Backend        string    `json:"backend"`
	BackendVersion string    `json:"backend_version,omitempty"`
	GPU            string    `json:"gpu,omitempty"`
	Driver         string    `json:"driver,omitempty"`
	// PrefillTokS and DecodeTokS map lengths to mean tok/s.
	PrefillTokS map[int]float64 `json:"prefill_tok_s"`
	DecodeTokS  map[int]float64 `json:"decode_tok_s"`
	// Capacity is the answer of a capacity result (kind "capacity").
	Capacity *CapacitySummary `json:"capacity,omitempty"`
	Errors   int              `json:"errors"`
	// Outliers counts a switch result's samples over OutlierFactor × their
	// group's median (see SwitchBench.Outliers).
	Outliers int `json:"outliers,omitempty"`
}

// CapacitySummary is a capacity result's answer on its list line.
type CapacitySummary struct {
	Users      int     `json:"users"`
	AtMax      bool    `json:"at_max_concurrency,omitempty"`
	Low        int     `json:"low"`
	High       int     `json:"high"`
	Confidence float64 `json:"confidence"`
	// SLO is the SLO in words ("TTFT p95 ≤ 1000 ms, ≥ 20 tok/s per user").
	SLO string `json:"slo"`
}

// Summarize reduces a result to its list line.
func Summarize(r *Result) Summary {
	s := Summary{ID: r.ID, Kind: r.Kind(), Status: r.Status, StartedAt: r.StartedAt, Profile: r.Fingerprint.Profile,
		Model: r.Fingerprint.Model, Backend: r.Fingerprint.Backend, BackendVersion: r.Fingerprint.BackendVersion,
		GPU: r.Fingerprint.GPUName, Driver: r.Fingerprint.Driver,
		PrefillTokS: map[int]float64{}, DecodeTokS: map[int]float64{}}
	if !r.FinishedAt.IsZero() {
		s.DurationS = r.FinishedAt.Sub(r.StartedAt).Seconds()
	}
	for _, p := range r.Prefill {
		if p.TokS.N > 0 {
			s.PrefillTokS[p.TargetTokens] = p.TokS.Mean
		}
	}
	for _, d := range r.Decode {
		if d.TokS.N > 0 {
			s.DecodeTokS[d.Tokens] = d.TokS.Mean
		}
	}
	if cb := r.Capacity; cb != nil {
		s.Capacity = &CapacitySummary{Users: cb.Users, AtMax: cb.AtMax, Low: cb.Low, High: cb.High, Confidence: cb.Confidence, SLO: cb.slo()}
	}
	for _, e := range r.Errors {
		s.Errors += e.Count
	}
	if r.Switch != nil {
		s.Outliers = len(r.Switch.Outliers)
	}
	return s
}

// ListResponse is the body of GET /api/bench.
type ListResponse struct {
	Results  []Summary  `json:"results"`
	Warnings []Warning  `json:"warnings"`
	Running  *RunStatus `json:"running"`
}

// UploadResponse is the answer of POST /api/bench/results: the ID the
// daemon stored the result under (a collision suffix may have been added)
// and where it is served.
type UploadResponse struct {
	ID     string `json:"id"`
	Result string `json:"result"`
}
