package appliance

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"gpuhost/config"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"gpuhost/internal/frontdoor"
	"gpuhost/internal/sse"
	"gpuhost/nvml"
	"gpuhost/systemd"
	"gpuhost/units"
)

// APIError is the JSON body of every error answer: a short error and a
// detail that names what was wrong, plus optional structured context.
type APIError struct {
	Error  string `json:"error"`
	Detail string `json:"detail"`
	Extra  any    `json:"extra,omitempty"`
}

// Status is the answer of GET /api/status and `gpuhost status`.
type Status struct {
	State    State                `json:"state"`
	GPU      *nvml.Snapshot       `json:"gpu,omitempty"`
	GPUError string               `json:"gpu_error,omitempty"`
	Units    []systemd.UnitStatus `json:"units"`
	Profiles []ProfileInfo        `json:"profiles"`
	// LastSwitch is the most recent finished switch, if any.
	LastSwitch *SwitchSummary `json:"last_switch,omitempty"`
	// Telegram is the bot's health; absent when telegram.enabled is false.
	Telegram *TelegramStatus `json:"telegram,omitempty"`
}

// ProfileInfo is a profile as listed to clients.
type ProfileInfo struct {
	Name       string        `json:"name"`
	Backend    units.Backend `json:"backend"`
	Model      string        `json:"model"`
	ServedName string        `json:"served_name"`
	Port       int           `json:"port"`
	Unit       string        `json:"unit"`
	Active     bool          `json:"active"`
	Args       []string      `json:"args"`
	// Context is the configured context length in tokens (vLLM
	// max_model_len, Ollama num_ctx); 0: the backend's default.
	Context int `json:"context,omitempty"`
	// AutoToolChoice and ToolCallParser: vLLM's enable_auto_tool_choice and
	// tool_call_parser (without both a request with tools is refused).
	AutoToolChoice bool   `json:"auto_tool_choice,omitempty"`
	ToolCallParser string `json:"tool_call_parser,omitempty"`
}

// Profiles lists the configured profiles, marking the active one.
func (s *Supervisor) Profiles() []ProfileInfo {
	st := s.State()
	var out []ProfileInfo
	for _, name := range s.cfg.ProfileNames() {
		p := s.cfg.Profiles[name]
		bc := s.cfg.BackendFor(p.Backend)
		out = append(out, ProfileInfo{
			Name: name, Backend: p.Backend, Model: p.Model, ServedName: p.ServedName, Port: p.Port,
			Unit: bc.Unit, Active: st.Phase == PhaseActive && st.Profile == name, Args: units.BackendArgs(*p, bc.Simulated),
			AutoToolChoice: p.VLLM.EnableAutoToolChoice, ToolCallParser: p.VLLM.ToolCallParser,
		})
		if p.Backend == units.Ollama {
			out[len(out)-1].Context = p.Ollama.NumCtx
		} else {
			out[len(out)-1].Context = p.VLLM.MaxModelLen
		}
	}
	return out
}

// Status gathers state, GPU and units; a failing component shows as an
// error field, never as a failed request.
func (s *Supervisor) Status(ctx context.Context) Status {
	out := Status{State: s.State(), Profiles: s.Profiles(), Units: []systemd.UnitStatus{}, LastSwitch: s.LastSwitch(), Telegram: s.TelegramStatus()}
	if snap, err := s.snapshot(ctx); err != nil {
		out.GPUError = err.Error()
	} else {
		out.GPU = &snap
	}
	if bs, err := s.backends(ctx); err == nil {
		for _, b := range bs {
			out.Units = append(out.Units, b.status)
		}
	}
	return out
}

// StatusLine is the one-line summary for systemd's STATUS= and the log,
// e.g. "active: qwen3-coder (vllm) · 18.4/24.0 GiB".
func StatusLine(st State, snap *nvml.Snapshot) string {
	var b strings.Builder
	switch st.Phase {
	case PhaseActive:
		fmt.Fprintf(&b, "active: %s (%s)", st.Profile, st.Backend)
	case PhaseSwitching:
		fmt.Fprintf(&b, "switching to %s: %s", st.Target, st.Step)
	case PhaseFailed:
		fmt.Fprintf(&b, "failed: %s", st.Error)
	default:
		b.WriteString("idle")
	}
	if snap != nil {
		if d, ok := snap.Device0(); ok {
			fmt.Fprintf(&b, " · %.1f/%.1f GiB", float64(d.MemoryUsedMiB)/1024, float64(d.MemoryTotalMiB)/1024)
		}
	}
	return b.String()
}

// AuthenticatedKey is the echo context key through which another front door
// vouches for a request before NewAPI's bearer check: browsers cannot send a
// bearer header (an EventSource cannot set headers at all), so the web panel
// authenticates them with its own cookie sessions. The panel sets the key in
// an e.Pre middleware (which runs before routing and before every e.Use
// middleware) for its own routes, which enforce sessions themselves, and for
// read-only requests that carry a valid session.
const AuthenticatedKey = "gpuhost.authenticated"

// Authenticated reports whether a front door vouched for the request (see
// AuthenticatedKey); the bearer check then lets it through.
func Authenticated(c echo.Context) bool {
	ok, _ := c.Get(AuthenticatedKey).(bool)
	return ok
}

// DoctorFunc runs the doctor for the API (the serve command wires it with
// the daemon's GPU and unit connections).
type DoctorFunc func(ctx context.Context, profile string) DoctorReport

// NewAPI builds the HTTP API on echo. token returns the bearer token at
// request time; it is required when the daemon listens beyond loopback.
func NewAPI(sup *Supervisor, doctor DoctorFunc, log *slog.Logger) (*echo.Echo, error) {
	cfg := sup.cfg
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	// The daemon is not behind a reverse proxy: the client is the peer
	// address, never an X-Forwarded-For or X-Real-IP header a client sets
	// (logs and per-client limits must not be spoofable).
	e.IPExtractor = echo.ExtractIPDirect()
	e.HTTPErrorHandler = func(err error, c echo.Context) {
		if c.Response().Committed {
			return
		}
		code, msg := http.StatusInternalServerError, err.Error()
		var he *echo.HTTPError
		if errors.As(err, &he) {
			code, msg = he.Code, fmt.Sprint(he.Message)
		}
		_ = c.JSON(code, APIError{Error: strings.ToLower(http.StatusText(code)), Detail: msg})
	}
	e.Pre(frontdoor.New(frontdoor.Options{
		Listen:            cfg.Listen,
		AllowedHosts:      cfg.HTTP.AllowedHosts,
		FormPaths:         PanelFormPaths,
		MultipartPrefixes: []string{"/v1/audio"},
		MaxBodyBytes:      cfg.HTTP.MaxBodyBytes,
		LimitedPrefixes:   []string{"/api", "/mcp"},
		BodyReadTimeout:   cfg.HTTP.BodyReadTimeout.D(),
	}).Middleware)
	if !cfg.IsLoopback() {
		if err := checkToken(cfg); err != nil {
			return nil, err
		}
		e.Use(bearerAuth(cfg, frontdoor.NewThrottle("bearer token", cfg.HTTP.AuthFailuresPerMinute, time.Minute, log, nil)))
	}
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			t0 := time.Now()
			err := next(c)
			if err != nil {
				c.Error(err)
			}
			log.Debug("http", "method", c.Request().Method, "path", c.Path(), "status", c.Response().Status, "ms", time.Since(t0).Milliseconds())
			return nil
		}
	})

	e.GET("/api/status", func(c echo.Context) error {
		ctx, cancel := context.WithTimeout(c.Request().Context(), 10*time.Second)
		defer cancel()
		return c.JSON(http.StatusOK, sup.Status(ctx))
	})
	e.GET("/api/profiles", func(c echo.Context) error {
		return c.JSON(http.StatusOK, sup.Profiles())
	})
	e.GET("/api/doctor", func(c echo.Context) error {
		profile := c.QueryParam("profile")
		if profile != "" {
			if _, ok := cfg.Profiles[profile]; !ok {
				return unknownProfile(c, cfg, profile)
			}
		}
		ctx, cancel := context.WithTimeout(c.Request().Context(), 30*time.Second)
		defer cancel()
		return c.JSON(http.StatusOK, doctor(ctx, profile))
	})
	e.POST("/api/switch", func(c echo.Context) error { return handleSwitch(c, sup) })
	e.GET("/api/events", func(c echo.Context) error { return handleEvents(c, sup) })
	return e, nil
}

// PanelFormPaths are the web panel's form POST routes: they carry the
// panel's CSRF token instead of a JSON content type (the panel's tests check
// that its routes and this list agree).
var PanelFormPaths = []string{"/switch", "/bench/run", "/ask", "/ask/stream", "/login", "/logout"}

// checkToken refuses to start beyond loopback without a token that is long
// enough to withstand guessing (the throttle slows guesses; length makes
// them hopeless). The message names the source, never the value.
func checkToken(cfg *config.Config) error {
	tok, err := cfg.APIToken()
	if err != nil {
		return err
	}
	src := "$" + cfg.APITokenEnv
	if cfg.APITokenFile != "" {
		src = "api_token_file " + cfg.APITokenFile
	}
	if tok == "" {
		return fmt.Errorf("listen %s is not loopback: set a bearer token in $%s or api_token_file", cfg.Listen, cfg.APITokenEnv)
	}
	if n := len([]rune(tok)); n < config.MinTokenLength {
		return fmt.Errorf("listen %s is not loopback: the bearer token in %s has %d characters, at least %d are needed (e.g. openssl rand -hex 32)", cfg.Listen, src, n, config.MinTokenLength)
	}
	return nil
}

// bearerAuth demands the bearer token on every request a front door has not
// vouched for. Clients that keep sending wrong tokens are throttled.
func bearerAuth(cfg *config.Config, th *frontdoor.Throttle) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if Authenticated(c) {
				return next(c)
			}
			remote := c.Request().RemoteAddr
			if wait, blocked := th.Blocked(remote); blocked {
				c.Response().Header().Set("Retry-After", frontdoor.RetryAfterSeconds(wait))
				return c.JSON(http.StatusTooManyRequests, APIError{Error: "too many requests",
					Detail: fmt.Sprintf("too many wrong bearer tokens from this address; retry in %s s", frontdoor.RetryAfterSeconds(wait))})
			}
			want, err := cfg.APIToken()
			if err != nil || want == "" {
				return c.JSON(http.StatusServiceUnavailable, APIError{Error: "no token", Detail: "the API token is not readable on the server"})
			}
			got, ok := strings.CutPrefix(c.Request().Header.Get("Authorization"), "Bearer ")
			if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
				if ok || c.Request().Header.Get("Authorization") != "" {
					th.Fail(remote) // a missing header is a client without config, not a guess
				}
				c.Response().Header().Set("WWW-Authenticate", `Bearer realm="gpuhost"`)
				return c.JSON(http.StatusUnauthorized, APIError{Error: "unauthorized", Detail: "missing or wrong bearer token"})
			}
			return next(c)
		}
	}
}

func unknownProfile(c echo.Context, cfg *config.Config, name string) error {
	return c.JSON(http.StatusNotFound, APIError{
		Error:  "unknown profile",
		Detail: fmt.Sprintf("no profile %q; profiles: %s", name, strings.Join(cfg.ProfileNames(), ", ")),
		Extra:  map[string]any{"profiles": cfg.ProfileNames()},
	})
}

// SwitchRequest is the body of POST /api/switch.
type SwitchRequest struct {
	Profile string `json:"profile"`
	Force   bool   `json:"force"`
	// Wait makes the request return when the switch has finished.
	Wait bool `json:"wait"`
}

// SwitchAccepted answers a started switch.
type SwitchAccepted struct {
	SwitchID string `json:"switch_id"`
	Profile  string `json:"profile"`
	// Events is where to follow it (SSE), starting after the last event
	// that preceded the switch.
	Events string `json:"events"`
	State  *State `json:"state,omitempty"`
}

func handleSwitch(c echo.Context, sup *Supervisor) error {
	var req SwitchRequest
	dec := json.NewDecoder(http.MaxBytesReader(c.Response(), c.Request().Body, 1<<16))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return c.JSON(http.StatusBadRequest, APIError{Error: "bad request", Detail: "body must be JSON like {\"profile\": \"name\"}: " + err.Error()})
	}
	if req.Profile == "" {
		return c.JSON(http.StatusBadRequest, APIError{Error: "bad request", Detail: "missing \"profile\""})
	}
	since := sup.LastSeq()
	id, done, err := sup.Switch(c.Request().Context(), req.Profile, SwitchOptions{Force: req.Force})
	var be *BusyError
	var de *DoctorError
	switch {
	case errors.Is(err, ErrUnknownProfile):
		return unknownProfile(c, sup.cfg, req.Profile)
	case errors.As(err, &be):
		return c.JSON(http.StatusConflict, APIError{Error: "switch in progress", Detail: be.Error(),
			Extra: map[string]any{"target": be.Target, "switch_id": be.SwitchID, "step": be.Step}})
	case errors.As(err, &de):
		return c.JSON(http.StatusUnprocessableEntity, APIError{Error: "profile fails doctor checks", Detail: de.Error(), Extra: map[string]any{"checks": de.Checks}})
	case err != nil:
		return c.JSON(http.StatusInternalServerError, APIError{Error: "switch not started", Detail: err.Error()})
	}
	acc := SwitchAccepted{SwitchID: id, Profile: req.Profile, Events: "/api/events?since=" + strconv.FormatUint(since, 10)}
	if !req.Wait {
		return c.JSON(http.StatusAccepted, acc)
	}
	select {
	case err := <-done:
		st := sup.State()
		acc.State = &st
		if err != nil {
			return c.JSON(http.StatusBadGateway, APIError{Error: "switch failed", Detail: err.Error(), Extra: acc})
		}
		return c.JSON(http.StatusOK, acc)
	case <-c.Request().Context().Done():
		return nil // the switch goes on; the client left
	}
}

// handleEvents streams Supervisor events as server-sent events. A client
// that reconnects with Last-Event-ID (or ?since=) gets what it missed while
// it is still in the ring buffer.
func handleEvents(c echo.Context, sup *Supervisor) error {
	since := uint64(0)
	if v := c.Request().Header.Get("Last-Event-ID"); v != "" {
		since, _ = strconv.ParseUint(v, 10, 64)
	} else if v := c.QueryParam("since"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return c.JSON(http.StatusBadRequest, APIError{Error: "bad request", Detail: fmt.Sprintf("since=%q is not a sequence number", v)})
		}
		since = n
	} else {
		since = sup.LastSeq()
	}
	ch, backlog, cancel := sup.Subscribe(since)
	defer cancel()
	c.Response().Header().Set("Content-Type", "text/event-stream") // no charset, as always; sse.Writer sets the rest
	w := sse.NewWriter(c.Response())
	write := func(e Event) error {
		data, _ := json.Marshal(e)
		return w.Send(sse.Event{ID: strconv.FormatUint(e.Seq, 10), Type: e.Kind, Data: data})
	}
	_ = w.Comment("gpuhost events")
	last := since
	for _, e := range backlog {
		if err := write(e); err != nil {
			return nil
		}
		last = e.Seq
	}
	heartbeat := time.NewTicker(15 * time.Second)
	defer heartbeat.Stop()
	for {
		select {
		case <-c.Request().Context().Done():
			return nil
		case <-heartbeat.C:
			if err := w.Comment("keep-alive"); err != nil {
				return nil
			}
		case e, ok := <-ch:
			if !ok {
				return nil
			}
			if e.Seq <= last {
				continue
			}
			if err := write(e); err != nil {
				return nil
			}
			last = e.Seq
		}
	}
}
