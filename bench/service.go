package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"gpuhost/nvml"
	"gpuhost/units"
)

// Daemon is what the bench service needs of the daemon's Supervisor. It is
// defined here, where it is used, so that bench does not import the
// appliance package (which imports bench for the panel's chart).
type Daemon interface {
	// Switching reports whether a switch is under way; runs are refused
	// then, because the backend is about to change under them.
	Switching() bool
	// AwaitActive returns the active profile (appliance.Supervisor's
	// method, which returns api.ErrNoBackend when idle).
	AwaitActive(ctx context.Context) (*units.Profile, error)
}

// DaemonFuncs adapts two functions to Daemon, e.g.
//
//	bench.DaemonFuncs{
//		SwitchingFunc:   func() bool { return sup.State().Phase == api.PhaseSwitching },
//		AwaitActiveFunc: sup.AwaitActive,
//	}
type DaemonFuncs struct {
	SwitchingFunc   func() bool
	AwaitActiveFunc func(ctx context.Context) (*units.Profile, error)
}

// Switching implements Daemon.
func (d DaemonFuncs) Switching() bool { return d.SwitchingFunc != nil && d.SwitchingFunc() }

// AwaitActive implements Daemon.
func (d DaemonFuncs) AwaitActive(ctx context.Context) (*units.Profile, error) {
	if d.AwaitActiveFunc == nil {
		return nil, errors.New("no supervisor wired")
	}
	return d.AwaitActiveFunc(ctx)
}

// ServiceOptions wire the daemon's bench service.
type ServiceOptions struct {
	Store  *Store
	Daemon Daemon
	// GPU gives the fingerprint and the roofline their GPU facts.
	GPU            func(ctx context.Context) (nvml.Snapshot, error)
	GpuhostVersion string
	GpuhostCommit  string
	// Publish receives progress lines ("bench 2026…-coder: decode 128
	// tokens, repeat 2/5 (7/40)"), at most about one a second plus every
	// phase change, start and end; the daemon puts them on its event bus.
	Publish func(msg string)
	Log     *slog.Logger
	// Target says where a profile is measured; default ProfileTarget(p, ""),
	// the backend itself on loopback (the proxy's own overhead is measured
	// by its benchmark, not here).
	Target func(p *units.Profile) Target
	// Defaults are the run options requests start from (lengths, repeats);
	// zero fields take the package defaults.
	Defaults Options
	// MinPublishInterval throttles progress messages; default 1s, negative
	// publishes every one.
	MinPublishInterval time.Duration
}

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

// Service runs benchmarks inside the daemon, one at a time, and serves
// their results over HTTP.
type Service struct {
	o      ServiceOptions
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	current *RunStatus
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

// NewService builds the service; Close stops a run in progress.
func NewService(o ServiceOptions) *Service {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Target == nil {
		o.Target = func(p *units.Profile) Target { return ProfileTarget(p, "") }
	}
	if o.MinPublishInterval == 0 {
		o.MinPublishInterval = time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Service{o: o, log: o.Log, ctx: ctx, cancel: cancel}
}

// Close cancels a run in progress and waits for it to store what it has.
func (s *Service) Close() {
	s.cancel()
	s.wg.Wait()
}

// Errors Start returns; the HTTP layer maps them to 409 Conflict.
var (
	ErrBusy      = errors.New("a bench run is already in progress")
	ErrSwitching = errors.New("a model switch is in progress")
	ErrNoProfile = errors.New("no backend is active")
)

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

// Start begins a run on the active profile and returns at once; the result
// is stored when the run ends. It refuses (ErrBusy, ErrSwitching,
// ErrNoProfile) rather than queue: a bench measures a quiet box.
func (s *Service) Start(ctx context.Context, req StartRequest) (RunStatus, error) {
	if s.ctx.Err() != nil {
		return RunStatus{}, errors.New("the bench service is shutting down")
	}
	if cur := s.Current(); cur != nil && cur.Status == "running" {
		return *cur, fmt.Errorf("%w (%s)", ErrBusy, cur.ID)
	}
	if s.o.Daemon == nil {
		return RunStatus{}, fmt.Errorf("%w: the bench service has no supervisor", ErrNoProfile)
	}
	if s.o.Daemon.Switching() {
		return RunStatus{}, ErrSwitching
	}
	// AwaitActive returns at once when a backend is active; it only waits
	// when a switch started in between, which is then the answer.
	actx, cancel := context.WithTimeout(ctx, 2*time.Second)
	p, err := s.o.Daemon.AwaitActive(actx)
	cancel()
	if err != nil {
		if s.o.Daemon.Switching() || errors.Is(err, context.DeadlineExceeded) {
			return RunStatus{}, ErrSwitching
		}
		return RunStatus{}, fmt.Errorf("%w: %v", ErrNoProfile, err)
	}
	opts := s.o.Defaults
	opts.Target = s.o.Target(p)
	opts.ProfileName, opts.Profile = p.Name, p
	opts.GPU, opts.GpuhostVersion, opts.GpuhostCommit = s.o.GPU, s.o.GpuhostVersion, s.o.GpuhostCommit
	opts.Log = s.log
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
		return RunStatus{}, &RequestError{Err: err}
	}
	opts.Started = time.Now()
	id := NewID(opts.Started, p.Name)
	st := &RunStatus{ID: id, Profile: p.Name, Status: "running", StartedAt: opts.Started.UTC(), Result: "/api/bench/" + id}
	s.mu.Lock()
	if s.current != nil && s.current.Status == "running" { // lost a race with another Start
		cur := *s.current
		s.mu.Unlock()
		return cur, fmt.Errorf("%w (%s)", ErrBusy, cur.ID)
	}
	s.current = st
	started := *st
	s.mu.Unlock()
	var lastPub time.Time
	lastPhase := ""
	opts.Progress = func(pr Progress) {
		s.mu.Lock()
		st.Progress = pr
		s.mu.Unlock()
		if now := time.Now(); pr.Phase != lastPhase || now.Sub(lastPub) >= s.o.MinPublishInterval || pr.Done == pr.Total {
			lastPhase, lastPub = pr.Phase, now
			s.publish(fmt.Sprintf("bench %s: %s (%d/%d)", id, pr.Message, pr.Done, pr.Total))
		}
	}
	s.publish(fmt.Sprintf("bench %s: started on profile %s (%s)", id, p.Name, opts.Target.URL))
	s.wg.Add(1)
	go s.run(opts, st, req.KeepFailed)
	return started, nil
}

// RequestError is a StartRequest the run options refuse (HTTP 400).
type RequestError struct{ Err error }

func (e *RequestError) Error() string { return e.Err.Error() }
func (e *RequestError) Unwrap() error { return e.Err }

func (s *Service) run(opts Options, st *RunStatus, keepFailed bool) {
	defer s.wg.Done()
	r, err := Run(s.ctx, opts)
	id := st.ID
	r.ID = id
	var saveErr error
	saved := r.Status != StatusFailed || keepFailed
	if saved {
		_, saveErr = s.o.Store.Save(r)
	}
	s.mu.Lock()
	st.Status = r.Status
	st.ID = r.ID
	st.Result = ""
	if saved && saveErr == nil {
		st.Result = "/api/bench/" + r.ID
	}
	switch {
	case saveErr != nil:
		st.Error = saveErr.Error()
	case err != nil:
		st.Error = err.Error()
	}
	s.mu.Unlock()
	if saveErr != nil {
		s.log.Error("store bench result", "id", r.ID, "err", saveErr)
	}
	// The run's own ID leads the line even when the store renamed the
	// result (a collision suffix): followers filter on it.
	msg := fmt.Sprintf("bench %s: finished, %s", id, r.Status)
	if r.ID != id {
		msg += " (stored as " + r.ID + ")"
	}
	if st.Error != "" {
		msg += ": " + st.Error
	}
	s.publish(msg)
	s.log.Info("bench run finished", "id", r.ID, "status", r.Status, "err", err)
}

func (s *Service) publish(msg string) {
	if s.o.Publish != nil {
		s.o.Publish(msg)
	}
}

// Current returns the run in progress or the last one, nil before any.
func (s *Service) Current() *RunStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.current == nil {
		return nil
	}
	c := *s.current
	return &c
}

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
	return s
}

// ListResponse is the body of GET /api/bench.
type ListResponse struct {
	Results  []Summary  `json:"results"`
	Warnings []Warning  `json:"warnings"`
	Running  *RunStatus `json:"running"`
}

// apiError mirrors api.APIError so every gpuhost error body has one
// shape.
type apiError struct {
	Error  string `json:"error"`
	Detail string `json:"detail"`
	Extra  any    `json:"extra,omitempty"`
}

// Register adds the bench routes to the daemon's API:
//
//	POST /api/bench            start a run on the active profile (202; 409 busy/switching/idle)
//	GET  /api/bench            list results (+ skipped files, + the run in progress)
//	GET  /api/bench/chart.svg  ChartSVG of every result
//	GET  /api/bench/:id        one result ("latest" works), or the status of the run in progress
//	POST /api/bench/results    store a finished result (`gpuhost bench run` against the daemon; 201)
func (s *Service) Register(e *echo.Echo) {
	e.POST("/api/bench", s.handleStart)
	e.POST("/api/bench/results", s.handleUpload)
	e.GET("/api/bench", s.handleList)
	e.GET("/api/bench/chart.svg", s.handleChart)
	e.GET("/api/bench/:id", s.handleGet)
}

func (s *Service) handleStart(c echo.Context) error {
	var req StartRequest
	body := http.MaxBytesReader(c.Response(), c.Request().Body, 1<<16)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil && !errors.Is(err, io.EOF) {
		return c.JSON(http.StatusBadRequest, apiError{Error: "bad request", Detail: "body must be empty or JSON like {\"repeats\": 3}: " + err.Error()})
	}
	st, err := s.Start(c.Request().Context(), req)
	var re *RequestError
	switch {
	case errors.Is(err, ErrBusy):
		return c.JSON(http.StatusConflict, apiError{Error: "bench in progress", Detail: err.Error(), Extra: st})
	case errors.Is(err, ErrSwitching):
		return c.JSON(http.StatusConflict, apiError{Error: "switch in progress", Detail: "a model switch is under way; start the bench when it has finished"})
	case errors.Is(err, ErrNoProfile):
		return c.JSON(http.StatusConflict, apiError{Error: "no active backend", Detail: err.Error()})
	case errors.As(err, &re):
		return c.JSON(http.StatusBadRequest, apiError{Error: "bad request", Detail: err.Error()})
	case err != nil:
		return c.JSON(http.StatusInternalServerError, apiError{Error: "bench not started", Detail: err.Error()})
	}
	return c.JSON(http.StatusAccepted, st)
}

func (s *Service) handleList(c echo.Context) error {
	all, warns, err := s.o.Store.List()
	if err != nil {
		return c.JSON(http.StatusInternalServerError, apiError{Error: "cannot list bench results", Detail: err.Error()})
	}
	resp := ListResponse{Results: []Summary{}, Warnings: []Warning{}, Running: s.Current()}
	for _, r := range all {
		resp.Results = append(resp.Results, Summarize(r))
	}
	if warns != nil {
		resp.Warnings = warns
	}
	return c.JSON(http.StatusOK, resp)
}

func (s *Service) handleGet(c echo.Context) error {
	id := c.Param("id")
	if cur := s.Current(); cur != nil && cur.ID == id {
		switch {
		case cur.Status == "running":
			return c.JSON(http.StatusAccepted, cur)
		case cur.Result == "":
			return c.JSON(http.StatusNotFound, apiError{Error: "not stored",
				Detail: "the run " + cur.Status + " and was not stored (keep_failed stores failed runs): " + cur.Error, Extra: cur})
		}
	}
	r, err := s.o.Store.Load(id)
	switch {
	case errors.Is(err, ErrNotFound):
		return c.JSON(http.StatusNotFound, apiError{Error: "not found", Detail: err.Error()})
	case err != nil:
		return c.JSON(http.StatusInternalServerError, apiError{Error: "cannot read bench result", Detail: err.Error()})
	}
	return c.JSON(http.StatusOK, r)
}

func (s *Service) handleChart(c echo.Context) error {
	all, _, err := s.o.Store.List()
	if err != nil {
		return c.JSON(http.StatusInternalServerError, apiError{Error: "cannot list bench results", Detail: err.Error()})
	}
	rs := make([]Result, len(all))
	for i, r := range all {
		rs[i] = *r
	}
	c.Response().Header().Set("Cache-Control", "no-cache")
	return c.Blob(http.StatusOK, "image/svg+xml", ChartSVG(rs))
}
