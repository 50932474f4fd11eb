package httpapi

import (
	"log/slog"
	"net/http"
	"testing"

	"gpuhost/appliance/appliancetest"
)

// TestUnknownPathsAfterTheToken: beyond loopback an unknown /api path
// answers 401 without the token (no route discovery), 404 only with it;
// OPTIONS goes through the same token check and the guard's origin rule
// (the proxy answers it itself: TestBackendHeadersOwnedByTheFrontDoor).
func TestUnknownPathsAfterTheToken(t *testing.T) {
	f := appliancetest.New(t, appliancetest.Options{VLLMLoad: "10ms"})
	f.Cfg.Listen = "0.0.0.0:0"
	const tok = "tok-0123456789abcdef0123"
	t.Setenv(f.Cfg.APITokenEnv, tok)
	if _, err := New(f.Sup, nil, slog.Default()); err != nil {
		t.Fatal(err)
	}
	srv := newAPIServer(t, f)
	for _, tc := range []struct {
		method, path, auth, origin string
		want                       int
	}{
		{"GET", "/api/nope", "", "", 401},
		{"GET", "/api/nope", "Bearer " + tok, "", 404},
		{"GET", "/nope", "", "", 401},
		{"OPTIONS", "/v1/chat/completions", "", "", 401},
		{"OPTIONS", "/api/switch", "", "", 401},
		{"OPTIONS", "/v1/chat/completions", "Bearer " + tok, "https://evil.example", 403},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL+tc.path, nil)
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		if tc.origin != "" {
			req.Header.Set("Origin", tc.origin)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s %s (auth %v, origin %q): %d, want %d", tc.method, tc.path, tc.auth != "", tc.origin, resp.StatusCode, tc.want)
		}
		for k := range resp.Header {
			if len(k) > 15 && k[:15] == "Access-Control-" {
				t.Errorf("%s %s: answer carries %s", tc.method, tc.path, k)
			}
		}
	}
}
