// Package panel is gpuhost's small web panel: a dashboard (one lane per
// GPU, active profile, units, endpoint health, last switch), the profiles
// grouped by GPU set with a Switch button and live switch progress, the
// doctor's checks, the backend units' journals (a live tail, the last
// failed step's excerpt pinned), the /v1 activity, and the mail triage
// worker's state, posts and costs (mail.go).
//
// It is server-rendered html/template from an embedded file system, with a
// little plain JavaScript for the live parts and no build step. Every page
// reads fine without JavaScript, and a switch falls back to a form POST
// whose result page shows the switch's progress from the event buffer.
//
// Rights live in the server: on a loopback listener the panel trusts the
// local machine (and refuses foreign Host headers, so a web page cannot
// reach it through DNS rebinding); on any other listener the operator logs
// in with the API token and gets a server-side session. Every POST carries a
// CSRF token bound to the browser and the session, and must come from the
// panel's own origin.
package panel

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"gpuhost/api"
	"gpuhost/internal/frontdoor"
	"gpuhost/internal/loopback"
	"gpuhost/nvml"
	"gpuhost/units"
)

//go:embed templates/*.html static/*
var assets embed.FS

// Supervisor is what the panel needs of the daemon's Supervisor (internal/assemble,
// which builds the panel, hands it over). It is an interface so the panel states exactly which parts
// of the daemon it touches: reading state and events, and starting a switch.
type Supervisor interface {
	State() api.State
	Status(ctx context.Context) api.Status
	Profiles() []api.ProfileInfo
	Snapshot(ctx context.Context) (nvml.Snapshot, error)
	Switch(ctx context.Context, profile string, opts api.SwitchOptions) (string, <-chan error, error)
	Subscribe(since uint64) (<-chan api.Event, []api.Event, func())
	LastSeq() uint64
}

// Defaults of the tunables below.
const (
	// DefaultDoctorTTL is how long a doctor report is reused: the doctor
	// talks to the backends and systemd, and a page view must not hammer them.
	DefaultDoctorTTL = 30 * time.Second
	// DoctorMinInterval bounds how often "run again" may start a new run.
	DoctorMinInterval = 5 * time.Second
	// SessionTTL is a login's lifetime; after it the operator logs in again.
	SessionTTL = 12 * time.Hour
	// maxSessions caps the in-memory session store; the oldest go first.
	maxSessions = 256
	// maxFormBytes bounds a POST body: the panel's forms are a few fields.
	maxFormBytes = 64 << 10
)

// Daemon are the daemon-wide facts the panel needs (internal/assemble
// builds them from gpuhost.yaml; nothing in the panel: section tunes the panel,
// whose panel.disabled is the caller's decision).
type Daemon struct {
	// Listen is the daemon's listen address: beyond loopback the panel
	// requires a login with the API token.
	Listen string
	// APIToken reads the API token now (config.Config.APIToken), the login
	// credential; it is read at every login and session check, so a
	// rotated token takes effect at once. nil reads as no token.
	APIToken func() (string, error)
	// APITokenEnv names the token's environment variable, for the error
	// of a panel beyond loopback without a token.
	APITokenEnv string
	// AuthFailuresPerMinute is http.auth_failures_per_minute: the wrong
	// tokens one client address may send per minute.
	AuthFailuresPerMinute int
	// Profiles are the configured profiles: the active one's endpoint is
	// probed, their key flags and aliases are listed, and a switch names
	// its backend.
	Profiles map[string]*units.Profile
	// Units are the configured backend units (config.BackendUnits): the
	// only names the logs page reads the journal of.
	Units []string
	// Journal reads a unit's last log lines (appliance.OpenUnits's
	// journal); nil: the logs page says no journal is configured.
	Journal JournalFunc
	// DialBackend reaches the active backend for the dashboard's health
	// probe (under systemd through its unix socket); nil dials TCP.
	DialBackend func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Panel serves the web panel's routes on the daemon's echo server.
type Panel struct {
	sup    Supervisor
	doctor api.DoctorFunc
	daemon Daemon
	log    *slog.Logger

	// authRequired is fixed at New: the listen address does not change
	// while the daemon runs.
	authRequired bool
	pages        map[string]*template.Template
	static       fs.FS
	csrfKey      []byte
	sessions     *sessionStore
	doctorCache  *doctorCache
	probeClient  *http.Client
	befores      *beforeMemo
	now          func() time.Time
	logins       *frontdoor.Throttle // failed logins per client address
	fails        failWatch           // the last failed step, for /logs

	mu     sync.RWMutex
	bench  BenchSource
	ask    *askState  // nil: the agent is disabled
	mail   *mailState // nil: triage is disabled
	router *echo.Router
	owned  map[string]bool // route patterns the panel registered

	// activity (under mu) is the request log and history (SetActivity);
	// nil: the Activity page says none is recorded.
	activity ActivitySource
}

// New builds the panel. On a listener beyond loopback the API token must be
// readable and non-empty (it is the login credential), as NewAPI requires.
// doctor may be nil: the verdicts then read "doctor not configured".
func New(sup Supervisor, doctor api.DoctorFunc, d Daemon, log *slog.Logger) (*Panel, error) {
	if sup == nil {
		return nil, errors.New("panel: supervisor and config are required")
	}
	if log == nil {
		log = slog.Default()
	}
	if d.APIToken == nil {
		d.APIToken = func() (string, error) { return "", nil }
	}
	p := &Panel{
		sup: sup, doctor: doctor, daemon: d, log: log,
		authRequired: !loopback.ListensOnly(d.Listen),
		probeClient:  &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true, DialContext: d.DialBackend}},
		befores:      newBeforeMemo(64),
		now:          time.Now,
		owned:        map[string]bool{},
	}
	if p.authRequired {
		tok, err := d.APIToken()
		if err != nil {
			return nil, fmt.Errorf("panel: listen %s is not loopback and the login token is unreadable: %w", d.Listen, err)
		}
		if tok == "" {
			return nil, fmt.Errorf("panel: listen %s is not loopback: set the API token in $%s or api_token_file (it is the panel's login)", d.Listen, d.APITokenEnv)
		}
	}
	key, err := randomBytes(32)
	if err != nil {
		return nil, fmt.Errorf("panel: generate CSRF key: %w", err)
	}
	p.csrfKey = key
	p.logins = frontdoor.NewThrottle("panel login", d.AuthFailuresPerMinute, time.Minute, p.log, func() time.Time { return p.now() })
	p.sessions = newSessionStore(SessionTTL, maxSessions)
	p.doctorCache = newDoctorCache(doctor, DefaultDoctorTTL, DoctorMinInterval)
	if p.pages, err = parsePages(); err != nil {
		return nil, err
	}
	if p.static, err = fs.Sub(assets, "static"); err != nil {
		return nil, fmt.Errorf("panel: static assets: %w", err)
	}
	return p, nil
}

// parsePages builds one template set per page (layout + page), so each
// page's "content" block is its own.
func parsePages() (map[string]*template.Template, error) {
	out := map[string]*template.Template{}
	for _, name := range []string{"dashboard", "profiles", "doctor", "logs", "activity", "bench", "ask", "mail", "login", "error"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("panel: parse template %s: %w", name, err)
		}
		out[name] = t
	}
	return out, nil
}

// Register adds the panel's routes to the daemon's echo server (the one
// httpapi.New built). It also installs a pre-routing middleware that
// vouches (frontdoor.AuthenticatedKey) for the panel's own routes, which
// check sessions themselves, and for read-only requests with a valid
// session, so the browser can follow /api/events without a bearer header.
func (p *Panel) Register(e *echo.Echo) {
	p.mu.Lock()
	p.router = e.Router()
	p.mu.Unlock()
	add := func(method, path string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) {
		e.Add(method, path, h, m...)
		p.mu.Lock()
		p.owned[path] = true
		p.mu.Unlock()
	}
	page := p.guard(guardPage)
	post := p.guard(guardPost)
	open := p.guard(guardOpen)
	openPost := p.guard(guardOpenPost)

	add(http.MethodGet, "/", p.handleDashboard, page)
	add(http.MethodGet, "/profiles", p.handleProfiles, page)
	add(http.MethodGet, "/doctor", p.handleDoctor, page)
	add(http.MethodGet, "/logs", p.handleLogs, page)
	add(http.MethodGet, "/logs/tail", p.handleLogsTail, page)
	add(http.MethodGet, "/activity", p.handleActivity, page)
	add(http.MethodGet, "/activity/events", p.handleActivityEvents, page)
	add(http.MethodGet, "/activity/charts", p.handleActivityCharts, page)
	add(http.MethodGet, "/activity/history", p.handleActivityHistory, page)
	add(http.MethodGet, "/live", p.handleLive, page)
	add(http.MethodGet, "/bench", p.handleBench, page)
	add(http.MethodPost, "/bench/run", p.handleBenchRun, post)
	add(http.MethodPost, "/switch", p.handleSwitch, post)
	add(http.MethodGet, "/ask", p.handleAsk, page)
	add(http.MethodPost, "/ask", p.handleAskForm, post)
	add(http.MethodPost, "/ask/stream", p.handleAskStream, post)
	add(http.MethodGet, "/mail", p.handleMail, page)
	add(http.MethodPost, "/mail/rerun", p.handleMailRerun, post)
	add(http.MethodGet, "/login", p.handleLoginPage, open)
	add(http.MethodPost, "/login", p.handleLogin, openPost)
	add(http.MethodPost, "/logout", p.handleLogout, post)
	add(http.MethodGet, "/static/*", p.handleStatic, open)
	e.RouteNotFound("/*", p.handleNotFound, open)
	p.mu.Lock()
	p.owned["/*"] = true
	p.mu.Unlock()
	e.Pre(p.vouch)
}

// vouch runs before routing and before NewAPI's bearer check. It finds the
// route the request will take (the same router lookup echo does next) and
// marks the request authenticated when the route is the panel's own, or
// when the method is read-only and the request carries a valid session.
// Writes to the API still need the bearer token, so a session cookie never
// turns an API POST into a cross-site request forgery target.
func (p *Panel) vouch(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if !p.authRequired {
			return next(c)
		}
		req := c.Request()
		p.mu.RLock()
		r := p.router
		p.mu.RUnlock()
		if r != nil {
			r.Find(req.Method, echo.GetPath(req), c)
			p.mu.RLock()
			owned := p.owned[c.Path()]
			p.mu.RUnlock()
			// The not-found page answers unknown API paths only after the
			// bearer check: before it, a 404 would tell a client without
			// the token which routes exist.
			if owned && !(c.Path() == "/*" && apiPath(req.URL.Path)) {
				c.Set(frontdoor.AuthenticatedKey, true)
				return next(c)
			}
		}
		if (req.Method == http.MethodGet || req.Method == http.MethodHead) && p.sessionFrom(c) != "" {
			c.Set(frontdoor.AuthenticatedKey, true)
		}
		return next(c)
	}
}

// apiPath: the prefixes of the API, the /v1 proxy, MCP and metrics, which
// the bearer token guards beyond loopback.
func apiPath(path string) bool {
	for _, p := range []string{"/api", "/v1", "/mcp", "/metrics"} {
		if path == p || strings.HasPrefix(path, p+"/") {
			return true
		}
	}
	return false
}

// guard kinds: what a route needs before its handler runs.
type guardKind int

const (
	guardPage     guardKind = iota // session (when required); GET
	guardPost                      // session (when required) + CSRF
	guardOpen                      // no session (login page, assets, 404)
	guardOpenPost                  // no session + CSRF (the login form)
)

// Context keys the guard leaves for handlers.
const (
	keyCSRF    = "panel.csrf"    // the token to render into forms
	keySession = "panel.session" // the raw session id ("" without login)
	// keyAnonymous marks an answer that must not show the backend state
	// (a request for a foreign Host).
	keyAnonymous = "panel.anonymous"
)

// guard applies the panel's security rules to one route: response headers,
// the loopback Host check, the session, and CSRF on POST.
func (p *Panel) guard(kind guardKind) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			setSecurityHeaders(c.Response().Header())
			if c.Request().Body != nil {
				c.Request().Body = http.MaxBytesReader(c.Response(), c.Request().Body, maxFormBytes)
			}
			if !p.authRequired && !loopback.IsHost(stripPort(c.Request().Host)) {
				c.Set(keyAnonymous, true)
				// A page that resolves its own name to 127.0.0.1 (DNS
				// rebinding) must not reach a panel that trusts loopback.
				return p.renderError(c, http.StatusMisdirectedRequest, "Wrong host",
					fmt.Sprintf("this panel listens on loopback and answers only to localhost, not to host %q", c.Request().Host))
			}
			sid := ""
			if p.authRequired {
				sid = p.sessionFrom(c)
			}
			c.Set(keySession, sid)
			nonce, err := p.csrfNonce(c)
			if err != nil {
				return p.renderError(c, http.StatusInternalServerError, "Internal error", "cannot create the CSRF cookie: "+err.Error())
			}
			c.Set(keyCSRF, p.csrfToken(nonce, sid))
			needSession := p.authRequired && (kind == guardPage || kind == guardPost)
			if needSession && sid == "" {
				if wantsJSON(c) || kind == guardPost {
					return p.fail(c, http.StatusUnauthorized, "login required", "log in at /login first")
				}
				return c.Redirect(http.StatusSeeOther, "/login?next="+urlQueryEscape(c.Request().URL.RequestURI()))
			}
			if kind == guardPost || kind == guardOpenPost {
				if err := p.checkCSRF(c, nonce, sid); err != nil {
					p.log.Warn("rejected POST without valid CSRF proof", "path", c.Request().URL.Path, "remote", c.RealIP(), "reason", err)
					return p.fail(c, http.StatusForbidden, "forbidden", err.Error())
				}
			}
			return next(c)
		}
	}
}

// setSecurityHeaders keeps pages from being framed, sniffed, cached or
// running anything but the panel's own script.
func setSecurityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
}

// wantsJSON tells the panel's own fetch calls (Accept: application/json)
// from browser navigations.
func wantsJSON(c echo.Context) bool {
	return strings.Contains(c.Request().Header.Get("Accept"), "application/json")
}

// fail answers an error as JSON for fetch and as an HTML page otherwise.
func (p *Panel) fail(c echo.Context, code int, short, detail string) error {
	if wantsJSON(c) {
		return c.JSON(code, api.APIError{Error: short, Detail: detail})
	}
	return p.renderError(c, code, http.StatusText(code), detail)
}

// pageData is what every page template gets.
type pageData struct {
	Title        string
	Page         string
	CSRF         string
	AuthRequired bool
	LoggedIn     bool
	// Authorized gates the navigation and the state pill: an anonymous
	// visitor of a non-loopback panel sees neither.
	Authorized bool
	State      api.State
	Body       any
}

func (p *Panel) pageData(c echo.Context, page, title string, body any) pageData {
	tok, _ := c.Get(keyCSRF).(string)
	sid, _ := c.Get(keySession).(string)
	d := pageData{Title: title, Page: page, CSRF: tok, AuthRequired: p.authRequired, LoggedIn: sid != "",
		Authorized: !p.authRequired || sid != "", Body: body}
	if anon, _ := c.Get(keyAnonymous).(bool); anon {
		d.Authorized = false
	}
	if d.Authorized {
		d.State = p.sup.State()
	}
	return d
}

// render executes a page into a buffer first, so a template error becomes
// a clean 500 instead of half a page.
func (p *Panel) render(c echo.Context, code int, page string, data pageData) error {
	t, ok := p.pages[page]
	if !ok {
		return fmt.Errorf("panel: no template %q", page)
	}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, "layout.html", data); err != nil {
		p.log.Error("render page", "page", page, "err", err)
		return c.String(http.StatusInternalServerError, "internal error: the page could not be rendered (see the daemon log)")
	}
	h := c.Response().Header()
	h.Set("Cache-Control", "no-store")
	return c.HTMLBlob(code, buf.Bytes())
}

// errorView is the body of the error page.
type errorView struct {
	Code    int
	Message string
}

func (p *Panel) renderError(c echo.Context, code int, title, msg string) error {
	setSecurityHeaders(c.Response().Header())
	return p.render(c, code, "error", p.pageData(c, "error", title, errorView{Code: code, Message: msg}))
}

// handleNotFound answers every unknown path: an HTML page for browsers,
// the API's JSON error for API clients and API paths.
func (p *Panel) handleNotFound(c echo.Context) error {
	path := c.Request().URL.Path
	if wantsJSON(c) || strings.HasPrefix(path, "/api/") || strings.HasPrefix(path, "/v1/") {
		return c.JSON(http.StatusNotFound, api.APIError{Error: "not found", Detail: fmt.Sprintf("no route %s %s", c.Request().Method, path)})
	}
	return p.renderError(c, http.StatusNotFound, "Not found", fmt.Sprintf("There is no page at %s.", path))
}

// handleStatic serves the embedded CSS and JavaScript.
func (p *Panel) handleStatic(c echo.Context) error {
	name := c.Param("*")
	if !fs.ValidPath(name) || name == "." {
		return p.handleNotFound(c)
	}
	data, err := fs.ReadFile(p.static, name)
	if err != nil {
		return p.handleNotFound(c)
	}
	ctype := "application/octet-stream"
	switch {
	case strings.HasSuffix(name, ".css"):
		ctype = "text/css; charset=utf-8"
	case strings.HasSuffix(name, ".js"):
		ctype = "text/javascript; charset=utf-8"
	}
	c.Response().Header().Set("Cache-Control", "no-cache")
	return c.Blob(http.StatusOK, ctype, data)
}
