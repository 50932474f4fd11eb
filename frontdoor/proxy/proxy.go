// Package proxy is gpuhost's OpenAI-compatible /v1 endpoint: one stable base
// URL (http://box:PORT/v1) in front of whichever backend profile is active.
//
// What a client sees:
//
//   - Requests are forwarded to the active backend (http://127.0.0.1:<port>)
//     with their bodies byte for byte; streamed answers pass through event by
//     event (each upstream read is written and flushed at once).
//   - During a switch, requests are held (never rejected for queue size) and
//     forwarded when the new backend is ready; after proxy.hold_timeout they
//     get 503 with Retry-After. With no backend at all (idle, failed) they get
//     503 saying why.
//   - "model" routes: the active served name, one of its aliases or the
//     model id (each rewritten in place to the name the backend serves) or
//     none (the active one; a "model" member is inserted, as Ollama needs
//     one) are forwarded; these two byte-level edits (see withModel) are the
//     only changes a body ever gets. Another profile's model gets 404 naming
//     the models,
//     or, with proxy.auto_switch, triggers a switch and is held until it is
//     done (subject to the anti-thrash rule below).
//   - GET /v1/models is answered by gpuhost: every profile's served name and
//     aliases, with "status" loaded / loading / not_loaded and max_model_len.
//
// Anti-thrash (auto_switch only; policy.go). A client alternating two models
// (an architect/editor pair of agents, two agents on two models) would swap
// the GPU on every request, and each swap would cut the other model's
// running answers. Three rules, which hold requests and never fail them:
//
//   - Minimum residency. A profile that became active at time A stays at
//     least until max(A, U) + proxy.min_residency, where U is the arrival of
//     its latest request that came while no request for another model was
//     waiting. A request for another model that arrives meanwhile is held
//     until then. Requests for the current model keep being served during
//     the residency, but once a request for another model waits they no
//     longer move U: a held request waits at most min_residency for the
//     residency, however busy the current model is (no starvation).
//   - Drain. When the residency is over, the earliest-waiting model's
//     request leads the switch away: it first waits for the requests
//     running on the current model to finish, at most proxy.drain_timeout
//     (after that the switch goes ahead and cuts them, as it would without
//     a drain). From the start of the drain the current model is leaving:
//     new requests for it are held too, and once the switch has started
//     they route again, as requests for a model that is not active (they
//     wait for the new model's residency and then switch back).
//   - Batching. Every request for the target joins that one drain and
//     switch and is released with the others when the target is active;
//     a request for a third model waits for the switch, then for the
//     target's residency. Targets are served in the order they were first
//     asked for. The requests a switch was made for count as the new
//     model's own until they reach it (a later drain waits for them), so a
//     switch is never undone before they are served.
//
// The policy's holds are bounded (each departure by min_residency plus
// drain_timeout, both at most hold_timeout, checked at load), count in the
// request's held time, and are not charged to proxy.hold_timeout: the hold
// budget moves back by the time the policy held the request, so it runs
// only while the request waits for a switch, as without the policy. A
// request is therefore never failed because of the policy; the failures
// are those of before (hold_timeout while a switch runs, the client leaving,
// a switch that fails or that the doctor refuses, which is known only once
// the residency is over, and answers still running when drain_timeout ends,
// which the switch cuts as it cut every running answer before the drain).
// min_residency 0 and drain_timeout 0 give the old behaviour (switch at
// once, cut what runs).
// With auto_switch off none of this runs and requests pay nothing for it.
//
// Forwarding is httputil.ReverseProxy rather than a hand-written copy: it
// already handles hop-by-hop headers, trailers, 1xx answers and upgrades,
// and for an SSE answer (and any answer of unknown length) it writes and
// flushes each upstream read at once, so an event is never held back
// (events that arrived together go out together). An answer of known
// length (a whole JSON answer) is not flushed per read: it goes out in one
// write at its end, which halves the syscalls of a small answer. The request body is read whole first (it is needed to
// route, and to hold the request during a switch) and sent upstream as the
// same bytes; a tap on the response body picks the token usage out of the
// stream as it passes (usage.go). A stream that cannot reach its API's end
// marker (the backend broke it off, or a switch cut it) ends with an error
// event in the API's shape instead (streamend.go), so a cut answer never
// looks complete.
//
// Switches. A switch drains the requests in flight on the backend it takes
// away (drain.go): they may finish up to switch.drain_timeout, then they
// are cut, while new requests are held until the switch is done.
//
// Errors are JSON in the OpenAI shape {"error":{"message","type","param",
// "code"}}, because the clients on /v1 are OpenAI SDKs that read that shape;
// extra fields (the models) sit inside "error".
//
// The bearer token is enforced for the whole echo server by the API
// middleware (httpapi.New) when the daemon listens beyond loopback;
// Register adds routes to that same server, so /v1 is covered and nothing
// here bypasses it. The token is not forwarded to the backend.
package proxy

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"gpuhost/api"
	"gpuhost/config"
	"gpuhost/internal/activity"
	"gpuhost/internal/apishape"
	"gpuhost/internal/loopback"
	"gpuhost/internal/membudget"
	"gpuhost/units"
)

// Backend is what the proxy uses of *appliance.Supervisor.
type Backend interface {
	// State is the Supervisor's current state (read on every request).
	State() api.State
	// AwaitActive returns the active profile, blocking while a switch runs.
	AwaitActive(ctx context.Context) (*units.Profile, error)
	// Switch starts a switch (auto_switch only).
	Switch(ctx context.Context, profile string, opts api.SwitchOptions) (string, <-chan error, error)
}

// Observer receives one call per forwarded /v1 request, for the metrics.
// api is the API the request spoke, from its path (its Label is one of a
// fixed few names, so it is safe as a metric label). model is always a
// configured served name or "" (unknown or no model), never the client's
// free text, so it is safe as a metric label too. status is what the
// request ended with: the HTTP status sent, 499 when the client went away
// first, 502 when the backend broke off mid-answer, 503 when a switch cut
// it. Token counts are 0 when
// the backend reported none; ttfb is 0 when no byte was sent.
type Observer interface {
	ObserveRequest(api apishape.Kind, model string, status int, promptTokens, completionTokens int, ttfb, dur time.Duration)
}

// DetailObserver is an Observer that also takes what the hold and
// throughput histograms need; the proxy calls ObserveRequestDetail right
// after ObserveRequest when its Observer implements it. held is the time
// the request waited for a switch (0 when it was not held); stream is
// whether the answer was an SSE stream (its time to first byte is then the
// first token's, so completionTokens over dur-ttfb is the decode rate).
type DetailObserver interface {
	ObserveRequestDetail(model string, held time.Duration, stream bool, completionTokens int, ttfb, dur time.Duration)
}

// Recorder takes one activity.Request per finished /v1 request, for the
// panel's Activity page (activity.Log implements it). It is separate from
// Observer so the metrics and the activity log can each be on or off; it is
// called from the request's goroutine and must not block.
type Recorder interface {
	Record(r activity.Request)
}

// statusClientClosed is nginx's "client closed request": the client left
// before the answer was complete.
const statusClientClosed = 499

// retryAfterSeconds is the Retry-After sent with hold-timeout 503s: a switch
// is under way, so a retry soon is likely to be served.
const retryAfterSeconds = "5"

// maxDialRetries is how often a request whose connection to the backend was
// refused is routed again (a switch may have begun between routing and
// dialling); the request body has not been sent, so a retry is safe.
const maxDialRetries = 3

// Proxy is the /v1 endpoint. Create it with New and mount it with Register.
type Proxy struct {
	sup      Backend
	cfg      config.ProxyConfig
	profiles func() map[string]*units.Profile
	log      *slog.Logger

	transport *http.Transport
	rp        *httputil.ReverseProxy
	observer  atomic.Pointer[observerBox]
	recorder  atomic.Pointer[recorderBox]
	created   int64

	// backend is the backend the pooled connections lead to; when it
	// changes (a switch), idle connections to the old process are closed.
	backend atomic.Pointer[backendKey]

	mem          *membudget.Budget
	rejected     *prometheus.CounterVec
	usageRefused *prometheus.CounterVec // usagecheck.go

	// pol is auto_switch's anti-thrash policy (policy.go); nil when
	// auto_switch is off, and then no request pays for it.
	pol *policy
	// lanes routes requests per GPU set (SetLanes); nil: everything to sup.
	lanes         *lanes
	deferred      *prometheus.CounterVec
	drainTimeouts prometheus.Counter

	// flights are the forwardings under way, which a switch drains
	// (drain.go); switchEnds counts how the drained ones ended.
	flights    flights
	switchEnds *prometheus.CounterVec

	lenMu    sync.Mutex
	lenCache map[string]int // "profile@since" → max_model_len reported by vLLM
	times    switchTimes    // wakes and cold starts seen, for /v1/models (readiness.go)
}

type observerBox struct{ o Observer }

type recorderBox struct{ r Recorder }

// New builds the proxy. sup is the Supervisor; profiles returns the
// configured profiles (called per request, so a config reload is seen);
// cfg's zero HoldTimeout and MaxBodyBytes mean 10 min and 32 MiB, a nil
// DrainTimeout and MinResidency the config's defaults (as config.Parse
// sets them).
func New(sup Backend, cfg config.ProxyConfig, profiles func() map[string]*units.Profile, log *slog.Logger) *Proxy {
	if log == nil {
		log = slog.Default()
	}
	if cfg.HoldTimeout <= 0 {
		cfg.HoldTimeout = config.Duration(10 * time.Minute)
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 32 << 20
	}
	if cfg.BodyMemoryBytes < cfg.MaxBodyBytes {
		cfg.BodyMemoryBytes = max(cfg.MaxBodyBytes, 256<<20)
	}
	p := &Proxy{sup: sup, cfg: cfg, profiles: profiles, log: log,
		created: time.Now().Unix(), lenCache: map[string]int{},
		mem: membudget.New(cfg.BodyMemoryBytes), rejected: newRejectedCounter(), usageRefused: newUsageRefusedCounter()}
	p.deferred, p.drainTimeouts = newPolicyCounters()
	p.switchEnds = newSwitchEndsCounter()
	if cfg.AutoSwitch {
		drain := min(config.DefaultDrainTimeout, cfg.HoldTimeout.D())
		residency := min(config.DefaultMinResidency, cfg.HoldTimeout.D())
		if cfg.DrainTimeout != nil {
			drain = cfg.DrainTimeout.D()
		}
		if cfg.MinResidency != nil {
			residency = cfg.MinResidency.D()
		}
		p.pol = newPolicy(residency, drain, p.deferred, p.drainTimeouts)
	}
	p.transport = &http.Transport{
		Proxy: nil, // the backend is on loopback: never an environment proxy
		// Agents keep many streams open; without a large idle pool every
		// request would open a connection and leave one in TIME_WAIT.
		MaxIdleConns:        512,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		// No ResponseHeaderTimeout: a non-streamed answer to a long prompt
		// takes minutes; the client's own context bounds it.
		DisableCompression: true,
	}
	p.DialBackends(nil)
	p.rp = &httputil.ReverseProxy{
		Rewrite:        p.rewrite,
		Transport:      p.transport,
		FlushInterval:  0, // ReverseProxy flushes SSE and unknown-length answers after every write anyway
		BufferPool:     bufferPool{},
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.upstreamError,
		ErrorLog:       slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
	}
	return p
}

// SetObserver installs the metrics hook (nil removes it); safe at any time.
func (p *Proxy) SetObserver(o Observer) {
	if o == nil {
		p.observer.Store(nil)
		return
	}
	p.observer.Store(&observerBox{o})
}

// SetRecorder installs the activity log (nil removes it); safe at any time.
func (p *Proxy) SetRecorder(r Recorder) {
	if r == nil {
		p.recorder.Store(nil)
		return
	}
	p.recorder.Store(&recorderBox{r})
}

// Register mounts GET /v1/models, GET /v1/models/* and every other /v1/*
// path on e, behind e's middleware (the bearer token check). It does nothing
// when the proxy is disabled in the config.
func (p *Proxy) Register(e *echo.Echo) {
	if p.cfg.Disabled {
		return
	}
	e.GET("/v1/models", p.handleModels)
	e.GET("/v1/models/*", p.handleModel)
	e.Any("/v1/*", func(c echo.Context) error {
		if c.Request().Method == http.MethodOptions {
			answerOptions(c.Response())
			return nil
		}
		p.ServeHTTP(c.Response(), c.Request())
		return nil
	})
}

// Close drops the idle connections to the backend (call on shutdown).
func (p *Proxy) Close() { p.transport.CloseIdleConnections() }

// bufferPool reuses the 32 KiB copy buffers of the reverse proxy.
type bufferPool struct{}

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (bufferPool) Get() []byte  { return *(copyBuffers.Get().(*[]byte)) }
func (bufferPool) Put(b []byte) { copyBuffers.Put(&b) }

// exchange is one request's forwarding state, shared with the reverse
// proxy's hooks through the request context.
type exchange struct {
	host     string // 127.0.0.1:port
	canRetry bool   // a dial failure may be retried (nothing written)
	api      apishape.Kind
	prof     *units.Profile
	client   context.Context // the client's request context (the outgoing one is also cancelled by a drain)
	flight   *flight

	status  int
	tap     *usageTap
	err     error
	dialErr bool
}

type exchangeKey struct{}

func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	x := pr.In.Context().Value(exchangeKey{}).(*exchange)
	pr.Out.URL.Scheme = "http"
	pr.Out.URL.Host = x.host
	pr.Out.Host = x.host
	// gpuhost's bearer token is gpuhost's, not the backend's.
	pr.Out.Header.Del("Authorization")
	// Ask for an identity body, so the usage tap can read it.
	pr.Out.Header.Del("Accept-Encoding")
	// The body is already here whole; nothing to wait for.
	pr.Out.Header.Del("Expect")
}

func (p *Proxy) modifyResponse(resp *http.Response) error {
	x := resp.Request.Context().Value(exchangeKey{}).(*exchange)
	x.status = resp.StatusCode
	ownResponseHeaders(resp.Header)
	if p.unservedAPI(resp, x) {
		return nil
	}
	if mode := tapModeFor(resp.Header.Get("Content-Type"), resp.Header.Get("Content-Encoding")); mode != tapNone {
		x.tap = newUsageTap(resp.Body, mode, x.api)
		x.tap.guardEnd(x, resp.StatusCode)
		resp.Body = x.tap
	}
	return nil
}

// upstreamError handles a failed round trip (nothing has been written to the
// client yet): a refused connection is left for the caller to retry, a
// client that left gets nothing, a request a switch cut gets 503, anything
// else is 502.
func (p *Proxy) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	x := r.Context().Value(exchangeKey{}).(*exchange)
	x.err = err
	x.dialErr = isDialError(err)
	switch {
	case x.dialErr && x.canRetry:
		return
	case x.client.Err() != nil:
		x.status = statusClientClosed
		return
	case x.flight != nil && x.flight.cut.Load():
		e := switchCut(x)
		x.status = e.status
		writeError(w, e, x.api)
		return
	}
	x.status = http.StatusBadGateway
	writeError(w, &apiErr{status: http.StatusBadGateway, typ: "upstream_error", code: "backend_unreachable",
		msg: "the inference backend at " + x.host + " did not answer: " + err.Error()}, x.api)
}

// isDialError reports a connection that could not be made (refused, reset
// while connecting): the request was not sent.
func isDialError(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

// record is one request's access-log entry.
type record struct {
	start     time.Time
	remote    string // the TCP peer's IP (echo.ExtractIPDirect: never a forwarded-for header)
	method    string
	path      string
	api       apishape.Kind // from the path: how usage is read and errors are shaped
	requested string        // the client's "model" (shortened), for the log only
	model     string        // the served name it resolved to, "" if none
	profile   string
	status    int
	held      time.Duration
	switched  bool
	stream    bool
	tap       *usageTap
	limits    usageLimits   // what the answer's usage may reach (usagecheck.go)
	client    *clientWriter // the last forwarding attempt's writer
	x         *exchange     // the last forwarding attempt
	firstByte time.Time     // of an answer gpuhost wrote itself
	detail    string
	ticket    ticket // auto_switch: the forwarding under way counts as in flight
	pending   string // auto_switch: the profile whose switch this request waits for
	// sup and pol are the lane the request is routed in (laneFor): the
	// Backend as a whole on a box of one lane, else the engine of the
	// requested model's GPU set, with that lane's anti-thrash policy.
	sup Backend
	pol *policy
}

// clientWriter notes when the first body byte went to the client (the
// time to first byte: for a stream, the first token rather than the headers
// the backend sends at once) and whether writing to the client failed (the client
// left: 499, not the backend's fault).
type clientWriter struct {
	http.ResponseWriter
	first    time.Time // first body byte
	headerAt time.Time // for answers without a body
	err      error
}

func (w *clientWriter) WriteHeader(code int) {
	if w.headerAt.IsZero() && code >= 200 {
		w.headerAt = time.Now()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *clientWriter) Write(p []byte) (int, error) {
	if w.first.IsZero() {
		w.first = time.Now()
	}
	n, err := w.ResponseWriter.Write(p)
	if err != nil && w.err == nil {
		w.err = err
	}
	return n, err
}

// Unwrap lets http.ResponseController reach the connection's Flush.
func (w *clientWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// ServeHTTP forwards one /v1 request; Register mounts it.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := &record{start: time.Now(), remote: echo.ExtractIPDirect()(r), method: r.Method, path: r.URL.Path}
	defer p.endRequest(r, rec)

	clean, aerr := cleanPath(r.URL.Path)
	if aerr != nil {
		p.fail(w, rec, aerr)
		return
	}
	if clean != r.URL.Path {
		// Doubled slashes: the backend gets the path it would route.
		r.URL.Path, r.URL.RawPath = clean, ""
	}
	rec.api = apishape.Of(clean)
	body, reserved, aerr := p.readBody(w, r)
	defer p.mem.Give(reserved)
	if aerr != nil {
		p.fail(w, rec, aerr)
		return
	}
	var field modelField
	peeked := false
	if len(body) > 0 && hasJSONBody(r, body) {
		f, err := peekModel(body)
		if err != nil {
			p.fail(w, rec, badJSON(err))
			return
		}
		field, peeked = f, true
		if f.IsString {
			rec.requested = truncate(f.Name, 128)
		}
	}
	requested := ""
	if field.IsString {
		requested = p.clientModel(field.Name)
	}
	rec.sup, rec.pol = p.laneFor(requested)
	var h hold
	h.start(r.Context(), p.cfg.HoldTimeout.D())
	defer h.stop()

	for attempt, refused := 0, 0; ; attempt++ {
		prof, aerr := p.route(r.Context(), &h, requested, rec)
		if aerr != nil {
			p.fail(w, rec, aerr)
			return
		}
		fl, fctx, ok := p.flights.admit(rec.sup, prof.Name, r.Context())
		if !ok {
			// A switch began since routing: route again, which
			// holds the request until the switch is done.
			if rec.pol != nil {
				rec.pol.release(rec)
			}
			if refused++; refused > maxRouteRounds {
				p.fail(w, rec, switchIncomplete(requested, prof.Name, rec.sup.State()))
				return
			}
			attempt--
			continue
		}
		x, cw := p.forward(w, r, fctx, fl, rec, prof, body, field, peeked, attempt)
		if x.err != nil && x.dialErr && x.canRetry && r.Context().Err() == nil {
			// Refused: the backend is restarting or a switch began after
			// routing. Wait a moment and route again (held if switching).
			if sleepCtx(h.context(), 100*time.Millisecond) == nil {
				continue
			}
			p.fail(w, rec, holdError(rec.sup.State(), h.context(), r.Context(), x.err))
			return
		}
		if x.err != nil {
			rec.detail = x.err.Error()
		}
		// 499 only when the client left before it had the whole answer: a
		// client that closes the moment it reads [DONE] (go-openai does)
		// got everything, and the request counts as the backend's status.
		switch {
		case cw.err != nil || (r.Context().Err() != nil && !x.tap.complete()):
			rec.status = statusClientClosed
		case x.tap.failed() != nil:
			f := x.tap.failed()
			rec.status, rec.detail = f.status, f.msg
		}
		return
	}
}

// clientModel is the name a request is routed on: the model it names, or,
// when no profile serves that name, the served name of the profile
// proxy.client_models maps it to (Claude Code's own claude-… ids). The body
// is then rewritten to the backend's name as for an alias.
func (p *Proxy) clientModel(name string) string {
	if len(p.cfg.ClientModels) == 0 || name == "" {
		return name
	}
	profiles := p.profiles()
	for _, prof := range profiles {
		if prof != nil && serves(prof, name) {
			return name
		}
	}
	if prof := profiles[p.cfg.ClientModelProfile(name)]; prof != nil {
		return prof.ServedModelName()
	}
	return name
}

// endRequest, deferred by ServeHTTP, ends rec's place in the policy's
// counts and logs it, also when the forwarding panicked (which it then
// passes on).
func (p *Proxy) endRequest(r *http.Request, rec *record) {
	if rec.pol != nil {
		rec.pol.release(rec)
	}
	if v := recover(); v != nil {
		// httputil.ReverseProxy aborts a response whose copy failed
		// (client gone, backend died mid-stream) with ErrAbortHandler;
		// log it, then let net/http drop the connection.
		if rec.x != nil && rec.x.tap.complete() && (rec.client == nil || rec.client.err == nil) {
			// The copy failed after the whole answer went out: the
			// client closed at [DONE]. Not a failure of anyone's.
			rec.tap, rec.status = rec.x.tap, rec.x.status
		} else if r.Context().Err() != nil || rec.client != nil && rec.client.err != nil {
			rec.status = statusClientClosed
		} else {
			rec.status = http.StatusBadGateway
			rec.detail = "the backend broke off the answer"
		}
		p.done(rec)
		panic(v)
	}
	p.done(rec)
}

// forward makes one forwarding attempt of the request to prof, with the
// body's "model" rewritten to the name the backend serves, and notes its
// outcome in rec. ctx is the outgoing request's context, which a drain
// cancels when it cuts fl. It returns the attempt and its writer to the client.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, ctx context.Context, fl *flight, rec *record, prof *units.Profile, body []byte, field modelField, peeked bool, attempt int) (*exchange, *clientWriter) {
	rec.model, rec.profile = prof.ServedModelName(), prof.Name
	out := body
	if up := upstreamName(prof); peeked && (!field.IsString || field.Name != up) {
		out = withModel(body, field, up)
	}
	defer p.flights.end(fl) // also when the copy panics (ErrAbortHandler)
	x := &exchange{host: backendHost(prof), canRetry: attempt < maxDialRetries, api: rec.api, prof: prof, client: r.Context(), flight: fl}
	p.noteBackend(prof)
	req := r.WithContext(context.WithValue(ctx, exchangeKey{}, x))
	req.Body = io.NopCloser(newBytesReader(out))
	req.ContentLength = int64(len(out))
	if len(out) == 0 {
		req.Body = http.NoBody
	}
	rec.tap = nil
	cw := &clientWriter{ResponseWriter: w}
	rec.client, rec.x = cw, x
	p.rp.ServeHTTP(cw, req)
	if rec.pol != nil {
		rec.pol.release(rec)
	}
	rec.tap, rec.status = x.tap, x.status
	rec.limits = limitsFor(field, prof)
	if x.tap != nil {
		rec.stream = x.tap.mode == tapSSE
	}
	return x, cw
}

// cleanPath checks the (decoded) request path before it is forwarded: a dot
// segment ("/v1/../api/x", also written "%2e%2e") is refused, since the
// backend (or anything behind it) might resolve it to a path outside /v1;
// doubled slashes are collapsed. A trailing slash is kept.
func cleanPath(p string) (string, *apiErr) {
	for _, seg := range strings.Split(p, "/") {
		if seg == "." || seg == ".." {
			return "", &apiErr{status: http.StatusBadRequest, typ: "invalid_request_error", code: "invalid_path",
				msg: "request path " + strconv.Quote(truncate(p, 200)) + " contains a '.' or '..' segment; gpuhost forwards only paths below /v1 without dot segments"}
		}
	}
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c, nil
}

// noteBackend closes pooled connections when requests start going to a
// different backend process (another profile, or the same one restarted),
// so none is reused against a process that is gone.
func (p *Proxy) noteBackend(prof *units.Profile) {
	key := backendKey{prof: prof, port: prof.Port, since: p.sup.State().Since}
	if old := p.backend.Load(); old != nil && *old == key {
		return // the same backend: nothing is allocated
	}
	p.swapBackend(key)
}

func (p *Proxy) swapBackend(key backendKey) {
	if old := p.backend.Swap(&key); old != nil && *old != key {
		p.transport.CloseIdleConnections()
	}
}

// backendKey identifies one running backend process.
type backendKey struct {
	prof  *units.Profile
	port  int
	since time.Time
}

// readBody reads the whole request body, bounded by max_body_bytes. The
// body is needed whole anyway: to route on "model" before the backend is
// chosen, and to hold the request while a switch runs.
func (p *Proxy) readBody(w http.ResponseWriter, r *http.Request) (body []byte, reserved int64, _ *apiErr) {
	limit := p.cfg.MaxBodyBytes
	tooBig := func() *apiErr {
		return &apiErr{status: http.StatusRequestEntityTooLarge, typ: "invalid_request_error", code: "request_too_large",
			msg: "request body is larger than proxy.max_body_bytes (" + itoa64(limit) + " bytes)"}
	}
	if r.ContentLength > limit {
		w.Header().Set("Connection", "close")
		return nil, 0, tooBig()
	}
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil, 0, nil
	}
	// An announced length is reserved before a byte is read; an
	// unannounced one grows with what actually arrives.
	buf, reserved, err := readBudgeted(r.Body, p.mem, r.ContentLength, limit)
	switch {
	case errors.Is(err, errOverBudget):
		p.rejected.WithLabelValues("body_memory").Inc()
		w.Header().Set("Connection", "close")
		return nil, reserved, overBudget(p.cfg.BodyMemoryBytes)
	case err == nil && int64(len(buf)) > limit:
		w.Header().Set("Connection", "close")
		return nil, reserved, tooBig()
	case err != nil && r.Context().Err() != nil:
		return nil, reserved, &apiErr{status: statusClientClosed, msg: "the client went away while sending the body"}
	case err != nil:
		return nil, reserved, &apiErr{status: http.StatusBadRequest, typ: "invalid_request_error", code: "body_read_failed",
			msg: "reading the request body: " + err.Error()}
	}
	return buf, reserved, nil
}

// hasJSONBody decides whether a body is routed on its "model": a JSON media
// type, or a body that looks like an object whatever its label (`curl -d`
// sends JSON as a form). Other bodies (multipart uploads) go to the active
// backend untouched.
func hasJSONBody(r *http.Request, body []byte) bool {
	switch r.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch:
	default:
		return false
	}
	if isJSONMediaType(r.Header.Get("Content-Type")) {
		return true
	}
	i := skipWS(body, 0)
	return i < len(body) && body[i] == '{'
}

// fail answers with a gpuhost error and records it.
func (p *Proxy) fail(w http.ResponseWriter, rec *record, e *apiErr) {
	rec.status, rec.detail = e.status, e.msg
	if e.status == statusClientClosed {
		return // nobody to answer
	}
	writeError(w, e, rec.api)
	rec.firstByte = time.Now()
}

// done writes the access-log line and feeds the observer.
func (p *Proxy) done(rec *record) {
	dur := time.Since(rec.start)
	var ttfb time.Duration
	first := rec.firstByte
	if c := rec.client; c != nil && first.IsZero() {
		first = c.first
		if first.IsZero() {
			first = c.headerAt
		}
	}
	if !first.IsZero() {
		ttfb = first.Sub(rec.start)
	}
	prompt, compl, refused := p.countedUsage(rec)
	if b := p.observer.Load(); b != nil {
		b.o.ObserveRequest(rec.api, rec.model, rec.status, prompt, compl, ttfb, dur)
		if d, ok := b.o.(DetailObserver); ok {
			d.ObserveRequestDetail(rec.model, rec.held, rec.stream, compl, ttfb, dur)
		}
	}
	if b := p.recorder.Load(); b != nil {
		b.r.Record(activity.Request{Time: rec.start, Client: rec.remote, Method: rec.method, Path: truncate(rec.path, 256), API: rec.api.String(),
			Model: rec.model, Profile: rec.profile, Status: rec.status, Stream: rec.stream,
			PromptTokens: prompt, CompletionTokens: compl, TTFB: ttfb, Duration: dur, Held: rec.held, Switched: rec.switched})
	}
	level := slog.LevelInfo
	if rec.status >= 500 {
		level = slog.LevelWarn
	}
	ctx := context.Background()
	if !p.log.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 18)
	attrs = append(attrs, slog.String("method", rec.method), slog.String("path", rec.path), slog.String("model", rec.model),
		slog.Int("status", rec.status), slog.Float64("ttfb_ms", ms(ttfb)), slog.Float64("duration_ms", ms(dur)))
	if rec.requested != "" && rec.requested != rec.model {
		attrs = append(attrs, slog.String("requested", rec.requested))
	}
	if rec.api != apishape.Other {
		attrs = append(attrs, slog.String("api", rec.api.String()))
	}
	if rec.profile != "" {
		attrs = append(attrs, slog.String("profile", rec.profile))
	}
	if rec.tap != nil {
		attrs = append(attrs, slog.Int("prompt_tokens", prompt), slog.Int("completion_tokens", compl), slog.Int64("bytes", rec.tap.bytes))
		if rec.stream {
			attrs = append(attrs, slog.Bool("stream", true), slog.Int("events", rec.tap.events), slog.Bool("done", rec.tap.sawDone))
		}
	}
	if rec.held > 0 {
		attrs = append(attrs, slog.Float64("held_ms", ms(rec.held)))
	}
	if rec.switched {
		attrs = append(attrs, slog.Bool("switched", true))
	}
	if rec.detail != "" {
		attrs = append(attrs, slog.String("detail", rec.detail))
	}
	if refused != "" {
		attrs = append(attrs, slog.String("usage_refused", refused))
	}
	p.log.LogAttrs(ctx, level, "v1 request", attrs...)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// DialBackends makes the proxy reach the backends through d (nil: plain
// loopback TCP): under systemd each backend port is a unix socket, since
// the backend's own 127.0.0.1 is in its private network. Call it before
// the proxy serves.
func (p *Proxy) DialBackends(d *loopback.Dialer) {
	if d == nil {
		d = &loopback.Dialer{}
	}
	dd := *d
	dd.Timeout, dd.KeepAlive = 5*time.Second, 30*time.Second
	p.transport.DialContext = dd.DialContext
}
