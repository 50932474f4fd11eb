package httpapi

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"gpuhost/api"
	"gpuhost/appliance/appliancetest"
	"gpuhost/internal/testkit"
)

func newAPIServer(t *testing.T, f *appliancetest.Fixture) *httptest.Server {
	t.Helper()
	e, err := New(f.Sup, f.Doctor, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return srv
}

func TestAPIErrorsAreJSONWithTheRightStatus(t *testing.T) {
	f := appliancetest.New(t, appliancetest.Options{VLLMLoad: "10ms"})
	srv := newAPIServer(t, f)
	tests := []struct {
		name, method, path, body string
		status                   int
		detail                   string
	}{
		{"unknown profile", "POST", "/api/switch", `{"profile":"nope"}`, 404, "coder, coder-greedy, llama"},
		{"bad json", "POST", "/api/switch", `{"profile":`, 400, "body must be JSON"},
		{"unknown field", "POST", "/api/switch", `{"profil":"coder"}`, 400, "unknown field"},
		{"missing profile", "POST", "/api/switch", `{}`, 400, "missing \"profile\""},
		{"doctor failure", "POST", "/api/switch", `{"profile":"coder-greedy"}`, 422, "profile.gpu_memory_utilization"},
		{"doctor unknown profile", "GET", "/api/doctor?profile=x", "", 404, "no profile \"x\""},
		{"no such route", "GET", "/api/nothing", "", 404, "Not Found"},
		{"bad since", "GET", "/api/events?since=abc", "", 400, "since="},
		{"heal with nothing wanted", "POST", "/api/heal", `{}`, 409, "no profile was wanted yet"},
		{"heal unknown field", "POST", "/api/heal", `{"profile":"coder"}`, 400, "unknown field"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, srv.URL+tt.path, strings.NewReader(tt.body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var ae api.APIError
			if err := json.NewDecoder(resp.Body).Decode(&ae); err != nil {
				t.Fatalf("answer is not JSON: %v", err)
			}
			if resp.StatusCode != tt.status || ae.Error == "" || !strings.Contains(ae.Detail, tt.detail) {
				t.Errorf("got %d %+v, want %d with detail containing %q", resp.StatusCode, ae, tt.status, tt.detail)
			}
		})
	}
}

func TestAPISwitchStatusAndEvents(t *testing.T) {
	f := appliancetest.New(t, appliancetest.Options{VLLMLoad: "300ms"})
	srv := newAPIServer(t, f)
	c := api.NewClient(srv.URL, "")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var lines []string
	if err := c.SwitchAndFollow(ctx, api.SwitchRequest{Profile: "coder"}, func(e api.Event) { lines = append(lines, api.FormatEvent(e)) }); err != nil {
		t.Fatal(err)
	}
	out := strings.Join(lines, "\n")
	for _, w := range []string{"vram_release", "ready", "verify", "serving qwen3-coder", "coder is active"} {
		if !strings.Contains(out, w) {
			t.Errorf("switch output lacks %q:\n%s", w, out)
		}
	}
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.State.Phase != api.PhaseActive || st.State.Profile != "coder" || st.GPU == nil || len(st.Units) != 2 {
		t.Fatalf("status = %+v", st)
	}
	active := 0
	for _, p := range st.Profiles {
		if p.Active {
			active++
			if p.Name != "coder" || p.Args[0] != "serve" {
				t.Errorf("active profile listed as %+v", p)
			}
		}
	}
	if active != 1 {
		t.Errorf("%d profiles marked active", active)
	}

	// A switch while one runs answers 409 naming the running one.
	acc, err := c.Switch(ctx, api.SwitchRequest{Profile: "llama"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Switch(ctx, api.SwitchRequest{Profile: "coder"})
	var re *api.RemoteError
	if !asRemote(err, &re) || re.Status != http.StatusConflict || !strings.Contains(re.Detail, `"llama"`) {
		t.Errorf("concurrent switch: %v", err)
	}
	// Events replay from "since": the whole switch is there even though we
	// subscribe after it started.
	done := false
	_ = c.Events(ctx, acc.Events, func(e api.Event) bool {
		if e.SwitchID == acc.SwitchID && e.Kind == "switch" && e.Status == "done" {
			done = true
			return false
		}
		return true
	})
	if !done {
		t.Fatal("did not see the llama switch finish on the event stream")
	}

	rep, err := c.Doctor(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	for _, ch := range rep.Checks {
		ids[ch.ID+"/"+ch.Profile] = string(ch.Severity)
	}
	if ids["units.exclusive/"] != "ok" || ids["endpoint.health/llama"] != "ok" || ids["profile.gpu_memory_utilization/coder-greedy"] != "fail" {
		t.Errorf("doctor over the API: %v", ids)
	}
	if rep.Exit != 1 {
		t.Errorf("doctor exit = %d, want 1 (coder-greedy fails)", rep.Exit)
	}

	// Heal starts the last wanted profile (llama) again through a switch.
	lines = nil
	if err := c.HealAndFollow(ctx, func(e api.Event) { lines = append(lines, api.FormatEvent(e)) }); err != nil {
		t.Fatalf("heal: %v", err)
	}
	if out := strings.Join(lines, "\n"); !strings.Contains(out, "llama is active") {
		t.Errorf("heal output:\n%s", out)
	}
}

func asRemote(err error, re **api.RemoteError) bool {
	r, ok := err.(*api.RemoteError)
	if ok {
		*re = r
	}
	return ok
}

func TestAPIRequiresTokenBeyondLoopback(t *testing.T) {
	f := appliancetest.New(t, appliancetest.Options{VLLMLoad: "10ms"})
	f.Cfg.Listen = "0.0.0.0:0"
	t.Setenv(f.Cfg.APITokenEnv, "")
	if _, err := New(f.Sup, nil, slog.Default()); err == nil || !strings.Contains(err.Error(), "GPUHOST_API_TOKEN") {
		t.Fatalf("no token on a public listen address must be refused, got %v", err)
	}
	t.Setenv(f.Cfg.APITokenEnv, "tok-0123456789abcdef0123")
	srv := newAPIServer(t, f)
	for _, tc := range []struct {
		auth string
		want int
	}{{"", 401}, {"Bearer wrong", 401}, {"Basic tok-0123456789abcdef0123", 401}, {"Bearer tok-0123456789abcdef0123", 200}} {
		req, _ := http.NewRequest("GET", srv.URL+"/api/profiles", nil)
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("Authorization %q: %d, want %d", tc.auth, resp.StatusCode, tc.want)
		}
		if strings.Contains(string(body), "tok-0123456789abcdef0123") {
			t.Error("the token leaked into an answer")
		}
	}
}

// TestAPIRefusesShortTokenBeyondLoopback: a one-character token on 0.0.0.0
// was accepted; now the daemon refuses to start and says how long it must
// be, without printing the token.
func TestAPIRefusesShortTokenBeyondLoopback(t *testing.T) {
	f := appliancetest.New(t, appliancetest.Options{VLLMLoad: "10ms"})
	f.Cfg.Listen = "0.0.0.0:0"
	t.Setenv(f.Cfg.APITokenEnv, "x")
	_, err := New(f.Sup, nil, slog.Default())
	if err == nil || !strings.Contains(err.Error(), "at least 24") || !strings.Contains(err.Error(), "$GPUHOST_API_TOKEN has 1 characters") {
		t.Fatalf("a 1-character token beyond loopback: %v", err)
	}
	f.Cfg.Listen = "127.0.0.1:0" // loopback needs no token at all
	if _, err := New(f.Sup, nil, slog.Default()); err != nil {
		t.Fatalf("loopback: %v", err)
	}
}

// TestAPIThrottlesWrongTokens: past http.auth_failures_per_minute wrong
// tokens, a client gets 429 with Retry-After (before: every guess was
// answered, 3,355 per second), one log line names the client and never the
// token; a client that sends no token at all is not counted; the right
// token still passes from the throttled address; refusals close the
// connection.
func TestAPIThrottlesWrongTokens(t *testing.T) {
	f := appliancetest.New(t, appliancetest.Options{VLLMLoad: "10ms"})
	f.Cfg.Listen = "0.0.0.0:0"
	f.Cfg.HTTP.AuthFailuresPerMinute = 5
	const good = "good-token-0123456789abcdef"
	t.Setenv(f.Cfg.APITokenEnv, good)
	var logs testkit.SyncBuffer
	e, err := New(f.Sup, nil, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(e)
	defer srv.Close()
	get := func(auth string) *http.Response {
		req, _ := http.NewRequest("GET", srv.URL+"/api/profiles", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	for i := 0; i < 20; i++ {
		if resp := get(""); resp.StatusCode != 401 || !resp.Close {
			t.Fatalf("no token #%d: %d close=%v, want 401 (not throttled) with Connection: close", i, resp.StatusCode, resp.Close)
		}
	}
	for i := 0; i < 5; i++ {
		if resp := get("Bearer guess-" + strings.Repeat("x", i)); resp.StatusCode != 401 {
			t.Fatalf("guess %d: %d, want 401", i, resp.StatusCode)
		}
	}
	for i := 0; i < 3; i++ {
		resp := get("Bearer guess-again")
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("guess past the limit: %d Retry-After %q, want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
	}
	// The right token still passes from the throttled address (before: 429
	// for the rest of the window), and the wrong ones stay refused.
	if resp := get("Bearer " + good); resp.StatusCode != http.StatusOK {
		t.Fatalf("right token from a throttled address: %d, want 200", resp.StatusCode)
	}
	if resp := get("Bearer guess-after"); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("wrong token after the right one: %d, want 429 (a right token does not reset the count)", resp.StatusCode)
	}
	// A refused client does not keep its connection (nor a slot).
	if resp := get("Bearer guess-close"); !resp.Close {
		t.Error("a refused request's connection stays open (want Connection: close)")
	}
	if strings.Contains(logs.String(), "guess") || strings.Contains(logs.String(), good) {
		t.Errorf("a token reached the log:\n%s", logs.String())
	}
	if n := strings.Count(logs.String(), "authentication failures throttled"); n != 1 || !strings.Contains(logs.String(), "client=127.0.0.1") {
		t.Errorf("%d throttle lines, want 1 naming the client:\n%s", n, logs.String())
	}
}

// TestClientAddressIsThePeer: X-Forwarded-For and X-Real-IP, which any
// client can send, do not change the address logs and limits see.
func TestClientAddressIsThePeer(t *testing.T) {
	f := appliancetest.New(t, appliancetest.Options{VLLMLoad: "10ms"})
	e, err := New(f.Sup, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	e.GET("/test/ip", func(c echo.Context) error { return c.String(http.StatusOK, c.RealIP()) })
	srv := httptest.NewServer(e)
	defer srv.Close()
	req, _ := http.NewRequest("GET", srv.URL+"/test/ip", nil)
	req.Header.Set("X-Forwarded-For", "203.0.113.9")
	req.Header.Set("X-Real-IP", "203.0.113.10")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "127.0.0.1" {
		t.Fatalf("client address %q, want the peer 127.0.0.1", b)
	}
}
