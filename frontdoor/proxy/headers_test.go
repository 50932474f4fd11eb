package proxy_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestBackendHeadersOwnedByTheFrontDoor: a backend's CORS grant (vLLM
// sends Access-Control-Allow-Origin: *), cookies, redirects and origin
// policies never reach the client, on a whole answer, a stream or an
// error; what a client reads passes. OPTIONS is answered by gpuhost and
// never reaches the backend.
func TestBackendHeadersOwnedByTheFrontDoor(t *testing.T) {
	url, _, got, mu := wireEnv(t, func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Access-Control-Allow-Origin", "*")
		h.Set("Access-Control-Allow-Credentials", "true")
		h.Set("Access-Control-Allow-Methods", "*")
		h.Add("Set-Cookie", "gpuhost_session=evil; Path=/")
		h.Set("Location", "https://evil.example/")
		h.Set("Clear-Site-Data", `"cookies"`)
		h.Set("Strict-Transport-Security", "max-age=63072000")
		h.Set("X-Request-Id", "req-1")
		if strings.Contains(r.URL.Path, "stream") {
			h.Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: {\"choices\":[]}\n\ndata: [DONE]\n\n")
			return
		}
		h.Set("Content-Type", "application/json")
		if strings.Contains(r.URL.Path, "fail") {
			w.WriteHeader(http.StatusFound)
		}
		_, _ = io.WriteString(w, `{"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
	})
	for _, path := range []string{"/v1/chat/completions", "/v1/stream", "/v1/fail"} {
		req, _ := http.NewRequest(http.MethodPost, url+path, strings.NewReader(`{"model":"served"}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		for k := range resp.Header {
			if strings.HasPrefix(k, "Access-Control-") || k == "Set-Cookie" || k == "Location" || k == "Clear-Site-Data" || k == "Strict-Transport-Security" {
				t.Errorf("%s: the backend's %s reached the client", path, k)
			}
		}
		if resp.Header.Get("X-Request-Id") != "req-1" || resp.Header.Get("Content-Type") == "" {
			t.Errorf("%s: the client lost the answer's own headers: %v", path, resp.Header)
		}
	}
	mu.Lock()
	before := len(*got)
	mu.Unlock()
	req, _ := http.NewRequest(http.MethodOptions, url+"/v1/chat/completions", nil)
	req.Header.Set("Access-Control-Request-Method", "POST")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	mu.Lock()
	after := len(*got)
	mu.Unlock()
	if resp.StatusCode != http.StatusNoContent || after != before || resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("OPTIONS: %d, %d requests reached the backend, headers %v", resp.StatusCode, after-before, resp.Header)
	}
}
