package assemble

import (
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"gpuhost/config"
	"gpuhost/internal/testbin"
	"gpuhost/internal/testkit"
)

func TestLoopbackV1(t *testing.T) {
	for _, tc := range []struct{ addr, want string }{
		{"127.0.0.1:8080", "http://127.0.0.1:8080/v1"},
		{"0.0.0.0:8080", "http://127.0.0.1:8080/v1"},
		{"[::]:8080", "http://127.0.0.1:8080/v1"},
		{"192.168.1.5:8080", "http://192.168.1.5:8080/v1"},
	} {
		a, err := net.ResolveTCPAddr("tcp", tc.addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := loopbackV1(a); got != tc.want {
			t.Errorf("loopbackV1(%s) = %s, want %s", tc.addr, got, tc.want)
		}
	}
}

// TestSelfAuth: beyond loopback the daemon's own /v1 wants the bearer
// token; the agent's and the triage worker's requests to it get it (read
// per request), a configured key wins, and no other URL ever sees it.
func TestSelfAuth(t *testing.T) {
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.URL.Path+" "+r.Header.Get("Authorization"))
		mu.Unlock()
	}))
	defer srv.Close()
	state := t.TempDir()
	tokenFile := filepath.Join(state, "token")
	if err := os.WriteFile(tokenFile, []byte("s3cret-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	yaml := strings.Replace(testbin.ConfigYAML("/bin/true", state, "process", "", testkit.FreePort(t), testkit.FreePort(t), "10ms"),
		"listen: 127.0.0.1:0", "listen: 0.0.0.0:0\napi_token_file: "+tokenFile, 1)
	cfg, err := config.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	base := srv.URL + "/v1"
	c := &http.Client{Transport: &selfAuth{base: base, cfg: cfg, next: http.DefaultTransport}}
	do := func(url, auth string) {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	do(base+"/models", "")                      // the daemon's own /v1: token added
	do(base+"/chat/completions", "Bearer ")     // go-openai's empty key: replaced
	do(base+"/models", "Bearer configured-key") // a configured key wins
	do(srv.URL+"/elsewhere", "")                // not /v1: untouched
	want := []string{
		"/v1/models Bearer s3cret-token",
		"/v1/chat/completions Bearer s3cret-token",
		"/v1/models Bearer configured-key",
		"/elsewhere ",
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("requests seen:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
