package frontdoor

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"gpuhost/internal/loopback"
)

func TestHostAllowed(t *testing.T) {
	tests := []struct {
		listen  string
		allowed []string
		host    string
		want    bool
	}{
		{"127.0.0.1:8080", nil, "127.0.0.1:8080", true},
		{"127.0.0.1:8080", nil, "localhost:8080", true},
		{"127.0.0.1:8080", nil, "[::1]:8080", true},
		{"127.0.0.1:8080", nil, "rebind.evil.example:8080", false},
		{"127.0.0.1:8080", nil, "192.168.1.5:8080", false}, // loopback listener: only loopback names
		{"127.0.0.1:8080", nil, "", false},
		{"127.0.0.1:8080", []string{"gpu-box.lan"}, "GPU-BOX.lan:8080", true},
		{"0.0.0.0:8080", nil, "192.168.1.5:8080", true}, // an IP literal cannot be rebound
		{"0.0.0.0:8080", nil, "[fe80::1]:8080", true},
		{"0.0.0.0:8080", nil, "gpu-box.lan:8080", false},
		{"0.0.0.0:8080", []string{"gpu-box.lan"}, "gpu-box.lan", true},
		{"192.168.1.5:8080", nil, "192.168.1.5:8080", true},
		{"localhost:8080", nil, "localhost", true},
	}
	for _, tt := range tests {
		g := New(Options{Listen: tt.listen, AllowedHosts: tt.allowed})
		if got := g.HostAllowed(tt.host); got != tt.want {
			t.Errorf("listen %s allowed %v: HostAllowed(%q) = %v, want %v", tt.listen, tt.allowed, tt.host, got, tt.want)
		}
	}
}

// serve runs one request through the guard in front of a handler that
// records whether it ran and reads the body whole.
func serve(t *testing.T, g *Guard, r *http.Request) (*httptest.ResponseRecorder, bool, string) {
	t.Helper()
	e := echo.New()
	ran := false
	var body string
	e.Pre(g.Middleware)
	h := func(c echo.Context) error {
		ran = true
		b, err := io.ReadAll(c.Request().Body)
		if err != nil {
			return c.String(http.StatusRequestEntityTooLarge, err.Error())
		}
		body = string(b)
		return c.String(http.StatusOK, "ok")
	}
	e.Any("/*", h)
	w := httptest.NewRecorder()
	e.ServeHTTP(w, r)
	return w, ran, body
}

func TestGuardRules(t *testing.T) {
	g := New(Options{Listen: "127.0.0.1:8080", FormPaths: []string{"/switch"}, MultipartPrefixes: []string{"/v1/audio"},
		MaxBodyBytes: 64, LimitedPrefixes: []string{"/api", "/mcp"}})
	type hdr = map[string]string
	tests := []struct {
		name     string
		method   string
		path     string
		host     string
		headers  hdr
		body     string
		wantCode int
		wantRule string
	}{
		{"curl JSON switch", "POST", "/api/switch", "127.0.0.1:8080", hdr{"Content-Type": "application/json"}, `{}`, 200, ""},
		{"JSON with charset", "POST", "/api/switch", "127.0.0.1:8080", hdr{"Content-Type": "application/json; charset=utf-8"}, `{}`, 200, ""},
		{"text/plain switch (no-cors fetch)", "POST", "/api/switch", "127.0.0.1:8080", hdr{"Content-Type": "text/plain"}, `{"profile":"x"}`, 415, "content-type"},
		{"no content type", "POST", "/api/bench", "127.0.0.1:8080", nil, ``, 415, "content-type"},
		{"cross-site", "POST", "/api/switch", "127.0.0.1:8080", hdr{"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}, `{}`, 403, "origin"},
		{"same-site", "POST", "/api/ask", "127.0.0.1:8080", hdr{"Content-Type": "application/json", "Sec-Fetch-Site": "same-site"}, `{}`, 403, "origin"},
		{"foreign Origin", "POST", "/v1/chat/completions", "127.0.0.1:8080", hdr{"Content-Type": "application/json", "Origin": "http://evil.example"}, `{}`, 403, "origin"},
		{"other loopback port Origin", "POST", "/api/switch", "127.0.0.1:8080", hdr{"Content-Type": "application/json", "Origin": "http://127.0.0.1:9999"}, `{}`, 403, "origin"},
		{"null Origin", "POST", "/api/switch", "127.0.0.1:8080", hdr{"Content-Type": "application/json", "Origin": "null"}, `{}`, 403, "origin"},
		{"own Origin", "POST", "/api/switch", "127.0.0.1:8080", hdr{"Content-Type": "application/json", "Origin": "http://127.0.0.1:8080", "Sec-Fetch-Site": "same-origin"}, `{}`, 200, ""},
		{"panel form post", "POST", "/switch", "127.0.0.1:8080", hdr{"Content-Type": "application/x-www-form-urlencoded", "Origin": "http://127.0.0.1:8080"}, `profile=x`, 200, ""},
		{"panel form post cross-site", "POST", "/switch", "127.0.0.1:8080", hdr{"Content-Type": "application/x-www-form-urlencoded", "Sec-Fetch-Site": "cross-site"}, `profile=x`, 403, "origin"},
		{"rebinding GET status", "GET", "/api/status", "rebind.evil.example:8080", nil, ``, 421, "host"},
		{"rebinding GET metrics", "GET", "/metrics", "rebind.evil.example:8080", nil, ``, 421, "host"},
		{"rebinding /v1", "POST", "/v1/chat/completions", "rebind.evil.example:8080", hdr{"Content-Type": "application/json"}, `{}`, 421, "host"},
		{"cross-site GET is a read", "GET", "/api/status", "127.0.0.1:8080", hdr{"Sec-Fetch-Site": "cross-site"}, ``, 200, ""},
		{"DELETE without body", "DELETE", "/mcp", "localhost:8080", hdr{"Content-Type": "application/json"}, ``, 200, ""},
		{"multipart audio upload", "POST", "/v1/audio/transcriptions", "127.0.0.1:8080", hdr{"Content-Type": "multipart/form-data; boundary=x"}, `--x--`, 200, ""},
		{"multipart elsewhere", "POST", "/v1/chat/completions", "127.0.0.1:8080", hdr{"Content-Type": "multipart/form-data; boundary=x"}, `--x--`, 415, "content-type"},
		{"multipart audio cross-site", "POST", "/v1/audio/transcriptions", "127.0.0.1:8080", hdr{"Content-Type": "multipart/form-data; boundary=x", "Sec-Fetch-Site": "cross-site"}, `--x--`, 403, "origin"},
		{"body over limit", "POST", "/mcp", "127.0.0.1:8080", hdr{"Content-Type": "application/json"}, strings.Repeat("x", 65), 413, "body-size"},
		{"/v1 body not limited here", "POST", "/v1/chat/completions", "127.0.0.1:8080", hdr{"Content-Type": "application/json"}, strings.Repeat("x", 65), 200, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(tt.method, tt.path, strings.NewReader(tt.body))
			if tt.body == "" {
				r.Body, r.ContentLength = http.NoBody, 0
			}
			r.Host = tt.host
			for k, v := range tt.headers {
				r.Header.Set(k, v)
			}
			w, ran, _ := serve(t, g, r)
			if w.Code != tt.wantCode {
				t.Fatalf("status %d, want %d: %s", w.Code, tt.wantCode, w.Body.String())
			}
			if tt.wantRule != "" {
				if ran {
					t.Error("handler ran for a refused request")
				}
				if !strings.Contains(w.Body.String(), tt.wantRule) && !strings.Contains(w.Body.String(), strings.ReplaceAll(tt.wantRule, "-", "_")) {
					t.Errorf("refusal does not name rule %q: %s", tt.wantRule, w.Body.String())
				}
			}
		})
	}
}

// A chunked body (no Content-Length) is cut at the limit and the error
// names the config key.
func TestGuardChunkedBodyLimit(t *testing.T) {
	g := New(Options{Listen: "127.0.0.1:8080", MaxBodyBytes: 64, LimitedPrefixes: []string{"/api"}})
	r := httptest.NewRequest("POST", "/api/x", io.MultiReader(bytes.NewReader(make([]byte, 1000))))
	r.ContentLength = -1
	r.Host = "127.0.0.1"
	r.Header.Set("Content-Type", "application/json")
	w, ran, _ := serve(t, g, r)
	if ran || w.Code != http.StatusRequestEntityTooLarge || !strings.Contains(w.Body.String(), "http.max_body_bytes (64 bytes)") {
		t.Fatalf("status %d ran %v: %s", w.Code, ran, w.Body.String())
	}
	// Under the limit, the handler gets the whole body.
	r = httptest.NewRequest("POST", "/api/x", io.MultiReader(strings.NewReader(`{"a":1}`)))
	r.ContentLength = -1
	r.Host = "127.0.0.1"
	r.Header.Set("Content-Type", "application/json")
	if w, ran, body := serve(t, g, r); !ran || w.Code != 200 || body != `{"a":1}` {
		t.Fatalf("small chunked body: %d ran %v body %q", w.Code, ran, body)
	}
}

func TestThrottle(t *testing.T) {
	now := time.Unix(1000, 0)
	var logs bytes.Buffer
	th := NewThrottle("bearer token", 3, time.Minute, slog.New(slog.NewTextHandler(&logs, nil)), func() time.Time { return now })
	a, b := "10.0.0.1:5555", "10.0.0.2:1"
	for i := 0; i < 3; i++ {
		if _, blocked := th.Blocked(a); blocked {
			t.Fatalf("blocked after %d failures", i)
		}
		th.Fail(a)
	}
	wait, blocked := th.Blocked("10.0.0.1:7777") // another port, same client
	if !blocked || wait != time.Minute {
		t.Fatalf("after 3 failures: blocked %v wait %v", blocked, wait)
	}
	if _, blocked := th.Blocked(b); blocked {
		t.Fatal("another client is blocked")
	}
	now = now.Add(20 * time.Second)
	if wait, _ := th.Blocked(a); wait != 40*time.Second || RetryAfterSeconds(wait) != "40" {
		t.Fatalf("wait %v", wait)
	}
	if n := strings.Count(logs.String(), "throttled"); n != 1 {
		t.Errorf("%d throttle log lines in one window, want 1:\n%s", n, logs.String())
	}
	now = now.Add(41 * time.Second)
	if _, blocked := th.Blocked(a); blocked {
		t.Fatal("still blocked after the window")
	}
	if !strings.Contains(logs.String(), "client=10.0.0.1") {
		t.Errorf("log does not name the client: %s", logs.String())
	}
}

func TestThrottleBoundedTable(t *testing.T) {
	now := time.Unix(1000, 0)
	th := NewThrottle("x", 1, time.Minute, slog.New(slog.NewTextHandler(io.Discard, nil)), func() time.Time { return now })
	for i := 0; i < maxClients+500; i++ {
		th.Fail("10." + string(rune('a'+i%26)) + ":" + strings.Repeat("1", 1+i%7) + "-" + time.Duration(i).String())
	}
	if n := len(th.clients); n > maxClients {
		t.Fatalf("%d clients tracked, cap %d", n, maxClients)
	}
}

// FuzzHostAllowed: on a loopback listener without allowed hosts, an
// accepted Host names a loopback address or a localhost name, nothing else.
func FuzzHostAllowed(f *testing.F) {
	for _, s := range []string{"127.0.0.1:1", "[::1]", "localhost", "evil", "127.0.0.1.evil", "[fe80::1%lo]:1", "localhost.:80"} {
		f.Add(s)
	}
	g := New(Options{Listen: "127.0.0.1:8080"})
	f.Fuzz(func(t *testing.T, host string) {
		if !g.HostAllowed(host) {
			return
		}
		h := normHost(stripPort(host))
		if h != "localhost" && !strings.HasSuffix(h, ".localhost") && !loopback.IsHost(h) {
			t.Fatalf("HostAllowed(%q) = true", host)
		}
	})
}
