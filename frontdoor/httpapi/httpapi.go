// Package httpapi is the daemon's JSON API (/api/...): status, profiles,
// switch, the event stream, the doctor and bench triggers. It is a front
// door: it turns authenticated requests into calls on the Supervisor and
// never controls systemd itself.
package httpapi

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"gpuhost/api"
	"gpuhost/config"
	"gpuhost/internal/apishape"
	"gpuhost/internal/frontdoor"
	"gpuhost/internal/jsonlimit"
	"gpuhost/internal/sse"
)

// Supervisor is what the HTTP API uses of the daemon's Supervisor: reading
// state, profiles and events, and starting a switch.
type Supervisor interface {
	Config() *config.Config
	State() api.State
	Status(ctx context.Context) api.Status
	Profiles() []api.ProfileInfo
	Switch(ctx context.Context, profile string, opts api.SwitchOptions) (string, <-chan error, error)
	Subscribe(since uint64) (<-chan api.Event, []api.Event, func())
	LastSeq() uint64
}

// New builds the HTTP API on echo. token returns the bearer token at
// request time; it is required when the daemon listens beyond loopback.
func New(sup Supervisor, doctor api.DoctorFunc, log *slog.Logger) (*echo.Echo, error) {
	cfg := sup.Config()
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
		_ = refuse(c, code, strings.ReplaceAll(strings.ToLower(http.StatusText(code)), " ", "_"),
			api.APIError{Error: strings.ToLower(http.StatusText(code)), Detail: msg})
	}
	e.Pre(frontdoor.New(frontdoor.Options{
		Listen:            cfg.Listen,
		AllowedHosts:      cfg.HTTP.AllowedHosts,
		FormPaths:         PanelFormPaths,
		MultipartPrefixes: []string{"/v1/audio"},
		MaxBodyBytes:      cfg.HTTP.MaxBodyBytes,
		LimitedPrefixes:   []string{"/api", "/mcp"},
		BodyReadTimeout:   cfg.HTTP.BodyReadTimeout.D(),
		WriteTimeout:      cfg.HTTP.WriteTimeout.D(),
		// The panel's activity stream and the MCP server's GET stream are
		// mounted on this echo too.
		StreamPaths:         []string{"/api/events", "/activity/events", "/mcp"},
		MaxStreamsPerClient: cfg.HTTP.MaxStreamsPerClient,
		MaxStreams:          cfg.HTTP.MaxStreams,
		JSON:                jsonlimit.Limits{MaxDepth: cfg.HTTP.MaxJSONDepth, MaxValues: cfg.HTTP.MaxJSONValues, MaxStrings: cfg.HTTP.MaxJSONValues},
		DecodeMemoryBytes:   cfg.HTTP.DecodeMemoryBytes,
	}).Middleware)
	// A token file that cannot be read, and beyond loopback a missing or
	// short token, are configuration errors: nothing listens.
	if err := cfg.CheckToken(); err != nil {
		return nil, err
	}
	if !cfg.IsLoopback() {
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
	e.POST("/api/heal", func(c echo.Context) error { return handleHeal(c, sup) })
	e.GET("/api/events", func(c echo.Context) error { return handleEvents(c, sup) })
	return e, nil
}

// PanelFormPaths are the web panel's form POST routes: they carry the
// panel's CSRF token instead of a JSON content type (the panel's tests check
// that its routes and this list agree).
var PanelFormPaths = []string{"/switch", "/bench/run", "/ask", "/ask/stream", "/mail/rerun", "/login", "/logout"}

// bearerAuth demands the bearer token on every request a front door has not
// vouched for. The token is checked first: the right one always passes, also
// from an address that is throttled (a guesser on the same address, e.g.
// another local user, must not lock the owner out). Clients that keep
// sending wrong tokens get 429 instead of 401 past the limit. A refused
// connection is closed after the answer, so clients without the token
// cannot sit on connection slots.
func bearerAuth(cfg *config.Config, th *frontdoor.Throttle) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if frontdoor.Authenticated(c) {
				return next(c)
			}
			want, err := cfg.APIToken()
			if err != nil || want == "" {
				return refuse(c, http.StatusServiceUnavailable, "no_token", api.APIError{Error: "no token", Detail: "the API token is not readable on the server"})
			}
			header := c.Request().Header.Get("Authorization")
			got, ok := strings.CutPrefix(header, "Bearer ")
			if ok && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1 {
				return next(c)
			}
			c.Response().Header().Set("Connection", "close")
			remote := c.Request().RemoteAddr
			wait, blocked := th.Blocked(remote)
			if header != "" {
				th.Fail(remote) // a missing header is a client without config, not a guess
			}
			if blocked {
				c.Response().Header().Set("Retry-After", frontdoor.RetryAfterSeconds(wait))
				return refuse(c, http.StatusTooManyRequests, "rate_limit_exceeded", api.APIError{Error: "too many requests",
					Detail: fmt.Sprintf("too many wrong bearer tokens from this address; retry in %s s", frontdoor.RetryAfterSeconds(wait))})
			}
			c.Response().Header().Set("WWW-Authenticate", `Bearer realm="gpuhost"`)
			return refuse(c, http.StatusUnauthorized, "invalid_api_key", api.APIError{Error: "unauthorized", Detail: "missing or wrong bearer token"})
		}
	}
}

// refuse answers a request the API does not serve. On /v1 the answer is in
// the caller's API shape (apishape.Refuse: Anthropic's on /v1/messages,
// OpenAI's on the rest), with code as its code and body's detail as its
// message, since Claude Code and Codex show nothing of another shape;
// elsewhere it is body, gpuhost's own {"error","detail"}. Headers set
// before (WWW-Authenticate, Retry-After, Connection) go out either way.
func refuse(c echo.Context, status int, code string, body api.APIError) error {
	if p := c.Request().URL.Path; apishape.IsV1(p) {
		apishape.Refuse(c.Response(), p, status, code, body.Detail)
		return nil
	}
	return c.JSON(status, body)
}

func unknownProfile(c echo.Context, cfg *config.Config, name string) error {
	return c.JSON(http.StatusNotFound, api.APIError{
		Error:  "unknown profile",
		Detail: fmt.Sprintf("no profile %q; profiles: %s", name, strings.Join(cfg.ProfileNames(), ", ")),
		Extra:  map[string]any{"profiles": cfg.ProfileNames()},
	})
}

func handleSwitch(c echo.Context, sup Supervisor) error {
	var req api.SwitchRequest
	dec := json.NewDecoder(http.MaxBytesReader(c.Response(), c.Request().Body, 1<<16))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return c.JSON(http.StatusBadRequest, api.APIError{Error: "bad request", Detail: "body must be JSON like {\"profile\": \"name\"}: " + err.Error()})
	}
	if req.Profile == "" {
		return c.JSON(http.StatusBadRequest, api.APIError{Error: "bad request", Detail: "missing \"profile\""})
	}
	return answerSwitch(c, sup, req)
}

// handleHeal is POST /api/heal: the wanted profile (the last wanted, else
// the one stopped by hand) is started again through a switch, which also
// forgets the crash count that made the daemon give up. Its body is a JSON
// object ({} or {"wait": true}).
func handleHeal(c echo.Context, sup Supervisor) error {
	var req api.HealRequest
	dec := json.NewDecoder(http.MaxBytesReader(c.Response(), c.Request().Body, 1<<16))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return c.JSON(http.StatusBadRequest, api.APIError{Error: "bad request", Detail: "body must be a JSON object like {} or {\"wait\": true}: " + err.Error()})
	}
	st := sup.State()
	profile := st.LastWanted
	if profile == "" {
		profile = st.Paused
	}
	if profile == "" {
		return c.JSON(http.StatusConflict, api.APIError{Error: "nothing to heal",
			Detail: "no profile was wanted yet: `gpuhost switch PROFILE` chooses one"})
	}
	return answerSwitch(c, sup, api.SwitchRequest{Profile: profile, Force: true, Wait: req.Wait})
}

// answerSwitch starts the switch req asks for and answers with where to
// follow it (or, with req.Wait, its outcome).
func answerSwitch(c echo.Context, sup Supervisor, req api.SwitchRequest) error {
	since := sup.LastSeq()
	id, done, err := sup.Switch(c.Request().Context(), req.Profile, api.SwitchOptions{Force: req.Force})
	if err != nil {
		status, title := api.SwitchErrorStatus(err)
		body := api.APIError{Error: title, Detail: err.Error()}
		var be *api.BusyError
		var de *api.DoctorError
		switch {
		case errors.Is(err, api.ErrUnknownProfile):
			return unknownProfile(c, sup.Config(), req.Profile)
		case errors.As(err, &be):
			body.Extra = map[string]any{"target": be.Target, "switch_id": be.SwitchID, "step": be.Step}
		case errors.As(err, &de):
			body.Extra = map[string]any{"checks": de.Checks}
		}
		return c.JSON(status, body)
	}
	acc := api.SwitchAccepted{SwitchID: id, Profile: req.Profile, Events: "/api/events?since=" + strconv.FormatUint(since, 10)}
	if !req.Wait {
		return c.JSON(http.StatusAccepted, acc)
	}
	select {
	case err := <-done:
		st := sup.State()
		acc.State = &st
		if err != nil {
			return c.JSON(http.StatusBadGateway, api.APIError{Error: "switch failed", Detail: err.Error(), Extra: acc})
		}
		return c.JSON(http.StatusOK, acc)
	case <-c.Request().Context().Done():
		return nil // the switch goes on; the client left
	}
}

// handleEvents streams Supervisor events as server-sent events. A client
// that reconnects with Last-Event-ID (or ?since=) gets what it missed while
// it is still in the ring buffer.
func handleEvents(c echo.Context, sup Supervisor) error {
	since := uint64(0)
	if v := c.Request().Header.Get("Last-Event-ID"); v != "" {
		since, _ = strconv.ParseUint(v, 10, 64)
	} else if v := c.QueryParam("since"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return c.JSON(http.StatusBadRequest, api.APIError{Error: "bad request", Detail: fmt.Sprintf("since=%q is not a sequence number", v)})
		}
		since = n
	} else {
		since = sup.LastSeq()
	}
	ch, backlog, cancel := sup.Subscribe(since)
	defer cancel()
	c.Response().Header().Set("Content-Type", "text/event-stream") // no charset, as always; sse.Writer sets the rest
	w := sse.NewWriter(c.Response())
	write := func(e api.Event) error {
		data, _ := json.Marshal(e)
		return w.Send(sse.Event{ID: strconv.FormatUint(e.Seq, 10), Type: string(e.Kind), Data: data})
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
