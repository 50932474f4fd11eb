package frontdoor

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// v1Error decodes both /v1 error shapes: Anthropic's has the top-level
// "type":"error" and no param, OpenAI's no top-level type.
type v1Error struct {
	Type  *string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
		Code    string `json:"code"`
		Param   any    `json:"param"`
	} `json:"error"`
}

// TestRefusalShapes: every refusal of the guard, on every kind of path,
// comes in the caller's shape: Anthropic's on /v1/messages and
// count_tokens (Claude Code reads nothing else), OpenAI's on the other /v1
// paths, gpuhost's {"error","detail","rule"} on /api; with the status and
// the headers (Connection: close, Retry-After) it always had.
func TestRefusalShapes(t *testing.T) {
	kinds := []struct {
		rule     string
		method   string
		host     string
		headers  map[string]string
		body     string
		status   int
		anthType string // Anthropic's "type" for the status
		oaiType  string // OpenAI's
		hdrs     map[string]string
	}{
		{"host", "POST", "rebind.evil.example:8080", map[string]string{"Content-Type": "application/json"}, `{}`, 421, "invalid_request_error", "invalid_request_error", nil},
		{"origin", "POST", "127.0.0.1:8080", map[string]string{"Content-Type": "application/json", "Origin": "http://evil.example"}, `{}`, 403, "permission_error", "invalid_request_error", nil},
		{"origin", "POST", "127.0.0.1:8080", map[string]string{"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}, `{}`, 403, "permission_error", "invalid_request_error", nil},
		{"content-type", "POST", "127.0.0.1:8080", map[string]string{"Content-Type": "text/plain"}, `{}`, 415, "invalid_request_error", "invalid_request_error", nil},
		{"body-size", "POST", "127.0.0.1:8080", map[string]string{"Content-Type": "application/json"}, strings.Repeat("x", 65), 413, "request_too_large", "invalid_request_error",
			map[string]string{"Connection": "close"}},
		{"streams", "GET", "127.0.0.1:8080", nil, ``, 429, "rate_limit_error", "rate_limit_error",
			map[string]string{"Connection": "close", "Retry-After": "5"}},
	}
	paths := []struct {
		path string
		anth bool
	}{
		{"/v1/messages", true}, {"/v1/messages/count_tokens", true}, {"/v1/chat/completions", false}, {"/v1/responses", false}, {"/api/status", false},
	}
	for _, k := range kinds {
		for _, p := range paths {
			t.Run(k.rule+" "+k.method+" "+p.path, func(t *testing.T) {
				// /v1 bodies are limited and these paths are streams here
				// only so that each refusal can be seen on each path.
				g := New(Options{Listen: "127.0.0.1:8080", MaxBodyBytes: 64, LimitedPrefixes: []string{"/api", "/v1"},
					StreamPaths: []string{p.path}, MaxStreamsPerClient: 1})
				r := httptest.NewRequest(k.method, p.path, strings.NewReader(k.body))
				if k.body == "" {
					r.Body, r.ContentLength = http.NoBody, 0
				}
				r.Host = k.host
				for h, v := range k.headers {
					r.Header.Set(h, v)
				}
				if k.rule == "streams" && g.streams.acquire(ClientKey(r.RemoteAddr)) != "" {
					t.Fatal("could not hold the client's one stream")
				}
				w, ran, _ := serve(t, g, r)
				if ran || w.Code != k.status {
					t.Fatalf("status %d ran %v, want %d refused: %s", w.Code, ran, k.status, w.Body)
				}
				for h, v := range k.hdrs {
					if got := w.Header().Get(h); got != v {
						t.Errorf("%s: %q, want %q", h, got, v)
					}
				}
				if ct := w.Header().Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
					t.Errorf("Content-Type %q", ct)
				}
				code := "frontdoor_" + strings.ReplaceAll(k.rule, "-", "_")
				if !strings.HasPrefix(p.path, "/v1/") {
					var ref Refusal
					if err := json.Unmarshal(w.Body.Bytes(), &ref); err != nil || ref.Rule != k.rule || ref.Error != strings.ToLower(http.StatusText(k.status)) || ref.Detail == "" {
						t.Errorf("not gpuhost's refusal: %v %s", err, w.Body)
					}
					return
				}
				var doc v1Error
				if err := json.Unmarshal(w.Body.Bytes(), &doc); err != nil || doc.Error.Message == "" || doc.Error.Code != code {
					t.Fatalf("not a /v1 error with code %s: %v %s", code, err, w.Body)
				}
				if p.anth && (doc.Type == nil || *doc.Type != "error" || doc.Error.Type != k.anthType) {
					t.Errorf("not Anthropic's shape with type %s: %s", k.anthType, w.Body)
				}
				if !p.anth && (doc.Type != nil || doc.Error.Type != k.oaiType || !strings.Contains(w.Body.String(), `"param":null`)) {
					t.Errorf("not OpenAI's shape with type %s: %s", k.oaiType, w.Body)
				}
			})
		}
	}
}
