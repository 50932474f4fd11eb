package benchapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"gpuhost/bench"
	"gpuhost/nvml"
	"gpuhost/units"
)

// Daemon is what the bench service needs of the daemon's Supervisor. It is
// defined here, where it is used, so that benchapi does not import the
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
//	benchapi.DaemonFuncs{
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
	Store  *bench.Store
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
	// Target says where a profile is measured; default bench.ProfileTarget(p, ""),
	// the backend itself on loopback (the proxy's own overhead is measured
	// by its benchmark, not here).
	Target func(p *units.Profile) bench.Target
	// Defaults are the run options requests start from (lengths, repeats);
	// zero fields take the package defaults.
	Defaults bench.Options
	// MinPublishInterval throttles progress messages; default 1s, negative
	// publishes every one.
	MinPublishInterval time.Duration
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
	current *bench.RunStatus
}

// NewService builds the service; Close stops a run in progress.
func NewService(o ServiceOptions) *Service {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Target == nil {
		o.Target = func(p *units.Profile) bench.Target { return bench.ProfileTarget(p, "") }
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

// Start begins a run on the active profile and returns at once; the result
// is stored when the run ends. It refuses (ErrBusy, ErrSwitching,
// ErrNoProfile) rather than queue: a bench measures a quiet box.
func (s *Service) Start(ctx context.Context, req bench.StartRequest) (bench.RunStatus, error) {
	if s.ctx.Err() != nil {
		return bench.RunStatus{}, errors.New("the bench service is shutting down")
	}
	if cur := s.Current(); cur != nil && cur.Status == "running" {
		return *cur, fmt.Errorf("%w (%s)", ErrBusy, cur.ID)
	}
	if s.o.Daemon == nil {
		return bench.RunStatus{}, fmt.Errorf("%w: the bench service has no supervisor", ErrNoProfile)
	}
	if s.o.Daemon.Switching() {
		return bench.RunStatus{}, ErrSwitching
	}
	// AwaitActive returns at once when a backend is active; it only waits
	// when a switch started in between, which is then the answer.
	actx, cancel := context.WithTimeout(ctx, 2*time.Second)
	p, err := s.o.Daemon.AwaitActive(actx)
	cancel()
	if err != nil {
		if s.o.Daemon.Switching() || errors.Is(err, context.DeadlineExceeded) {
			return bench.RunStatus{}, ErrSwitching
		}
		return bench.RunStatus{}, fmt.Errorf("%w: %v", ErrNoProfile, err)
	}
	opts := s.o.Defaults
	opts.Target = s.o.Target(p)
	opts.ProfileName, opts.Profile = p.Name, p
	opts.GPU, opts.GpuhostVersion, opts.GpuhostCommit = s.o.GPU, s.o.GpuhostVersion, s.o.GpuhostCommit
	opts.Log = s.log
	opts, err = req.Apply(opts)
	if err != nil {
		return bench.RunStatus{}, err
	}
	opts.Started = time.Now()
	id := bench.NewID(opts.Started, p.Name)
	st := &bench.RunStatus{ID: id, Profile: p.Name, Status: "running", StartedAt: opts.Started.UTC(), Result: "/api/bench/" + id}
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
	opts.Progress = func(pr bench.Progress) {
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

func (s *Service) run(opts bench.Options, st *bench.RunStatus, keepFailed bool) {
	defer s.wg.Done()
	r, err := bench.Run(s.ctx, opts)
	id := st.ID
	r.ID = id
	var saveErr error
	saved := r.Status != bench.StatusFailed || keepFailed
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
func (s *Service) Current() *bench.RunStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.current == nil {
		return nil
	}
	c := *s.current
	return &c
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
	var req bench.StartRequest
	body := http.MaxBytesReader(c.Response(), c.Request().Body, 1<<16)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil && !errors.Is(err, io.EOF) {
		return c.JSON(http.StatusBadRequest, apiError{Error: "bad request", Detail: "body must be empty or JSON like {\"repeats\": 3}: " + err.Error()})
	}
	st, err := s.Start(c.Request().Context(), req)
	var re *bench.RequestError
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
	resp := bench.ListResponse{Results: []bench.Summary{}, Warnings: []bench.Warning{}, Running: s.Current()}
	for _, r := range all {
		resp.Results = append(resp.Results, bench.Summarize(r))
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
	case errors.Is(err, bench.ErrNotFound):
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
	rs := make([]bench.Result, len(all))
	for i, r := range all {
		rs[i] = *r
	}
	c.Response().Header().Set("Cache-Control", "no-cache")
	return c.Blob(http.StatusOK, "image/svg+xml", bench.ChartSVG(rs))
}
