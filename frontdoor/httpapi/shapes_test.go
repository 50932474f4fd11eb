package httpapi

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"gpuhost/api"
	"gpuhost/appliance/appliancetest"
)

// TestV1RefusalShapes: what the daemon refuses before the /v1 proxy (the
// bearer token's 401, the wrong-token throttle's 429, the guard's Host
// refusal) reaches Claude Code in Anthropic's error shape on
// /v1/messages, Codex and opencode in OpenAI's on the other /v1 paths, and
// /api clients in gpuhost's own; the status, WWW-Authenticate, Retry-After
// and the closed connection are the same in every shape.
func TestV1RefusalShapes(t *testing.T) {
	f := appliancetest.New(t, appliancetest.Options{VLLMLoad: "10ms"})
	f.Cfg.Listen = "0.0.0.0:0"
	f.Cfg.HTTP.AuthFailuresPerMinute = 1
	const good = "good-token-0123456789abcdef"
	t.Setenv(f.Cfg.APITokenEnv, good)
	kinds := []struct {
		name     string
		host     string // "" = the server's own
		auth     string
		warmup   int // wrong tokens sent first
		status   int
		apiError string // gpuhost's "error" on /api
		code     string
		anthType string
		oaiType  string
		header   string // a header the refusal must carry
		closes   bool
	}{
		{"no token", "", "", 0, 401, "unauthorized", "invalid_api_key", "authentication_error", "invalid_request_error", "WWW-Authenticate", true},
		{"wrong token", "", "Bearer wrong", 0, 401, "unauthorized", "invalid_api_key", "authentication_error", "invalid_request_error", "WWW-Authenticate", true},
		{"throttled", "", "Bearer wrong", 1, 429, "too many requests", "rate_limit_exceeded", "rate_limit_error", "rate_limit_error", "Retry-After", true},
		{"foreign host", "rebind.evil.example", "Bearer " + good, 0, 421, "misdirected request", "frontdoor_host", "invalid_request_error", "invalid_request_error", "", false},
	}
	paths := []struct {
		path string
		anth bool
	}{
		{"/v1/messages", true}, {"/v1/messages/count_tokens", true}, {"/v1/chat/completions", false}, {"/v1/responses", false}, {"/api/status", false},
	}
	for _, k := range kinds {
		for _, p := range paths {
			t.Run(k.name+" "+p.path, func(t *testing.T) {
				e, err := New(f.Sup, nil, slog.New(slog.DiscardHandler)) // its own throttle
				if err != nil {
					t.Fatal(err)
				}
				e.Any("/v1/*", func(c echo.Context) error { return c.String(http.StatusOK, "proxied") })
				srv := httptest.NewServer(e)
				defer srv.Close()
				send := func(auth string) *http.Response {
					method := http.MethodPost
					if p.path == "/api/status" {
						method = http.MethodGet
					}
					req, _ := http.NewRequest(method, srv.URL+p.path, strings.NewReader(`{"model":"m"}`))
					req.Header.Set("Content-Type", "application/json")
					if k.host != "" {
						req.Host = k.host
					}
					if auth != "" {
						req.Header.Set("Authorization", auth)
					}
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						t.Fatal(err)
					}
					return resp
				}
				for range k.warmup {
					resp := send("Bearer warm-up")
					resp.Body.Close()
				}
				resp := send(k.auth)
				data, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != k.status || resp.Close != k.closes || (k.header != "" && resp.Header.Get(k.header) == "") {
					t.Fatalf("%d close=%v %s=%q, want %d close=%v with %s: %s", resp.StatusCode, resp.Close, k.header, resp.Header.Get(k.header),
						k.status, k.closes, k.header, data)
				}
				if !p.anth && !strings.HasPrefix(p.path, "/v1/") {
					var ae api.APIError
					if err := json.Unmarshal(data, &ae); err != nil || ae.Error != k.apiError || ae.Detail == "" {
						t.Errorf("not gpuhost's error %q: %v %s", k.apiError, err, data)
					}
					return
				}
				var doc struct {
					Type  *string `json:"type"`
					Error struct {
						Type, Message, Code string
					} `json:"error"`
				}
				if err := json.Unmarshal(data, &doc); err != nil || doc.Error.Message == "" || doc.Error.Code != k.code {
					t.Fatalf("not a /v1 error with code %s: %v %s", k.code, err, data)
				}
				if p.anth && (doc.Type == nil || *doc.Type != "error" || doc.Error.Type != k.anthType) {
					t.Errorf("not Anthropic's shape with type %s: %s", k.anthType, data)
				}
				if !p.anth && (doc.Type != nil || doc.Error.Type != k.oaiType || !strings.Contains(string(data), `"param":null`)) {
					t.Errorf("not OpenAI's shape with type %s: %s", k.oaiType, data)
				}
				if strings.Contains(string(data), good) {
					t.Error("the token leaked into an answer")
				}
			})
		}
	}
}

// TestV1EchoErrorShape: an error echo answers itself on /v1 (no route: the
// proxy is disabled) is in the caller's shape too; on /api it is not.
func TestV1EchoErrorShape(t *testing.T) {
	f := appliancetest.New(t, appliancetest.Options{VLLMLoad: "10ms"})
	e, err := New(f.Sup, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(e)
	defer srv.Close()
	for _, tc := range []struct{ path, want string }{
		{"/v1/messages", `{"error":{"code":"not_found","message":"Not Found","type":"not_found_error"},"type":"error"}`},
		{"/v1/responses", `{"error":{"code":"not_found","message":"Not Found","param":null,"type":"invalid_request_error"}}`},
		{"/api/nothing", `{"error":"not found","detail":"Not Found"}`},
	} {
		resp, err := http.Get(srv.URL + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound || strings.TrimSpace(string(data)) != tc.want {
			t.Errorf("%s: %d %s, want 404 %s", tc.path, resp.StatusCode, data, tc.want)
		}
	}
}
