package benchcmd

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"sync/atomic"
	"testing"

	"gpuhost/simulator"
	"gpuhost/simulator/simtest"
)

// startSim runs the real simulator in-process (simtest.Start).
func startSim(t testing.TB, o simulator.Options) string { return simtest.Start(t, o) }

// proxy puts a misbehaving layer in front of a real simulator: respond
// answers request n to /v1/chat/completions itself when it returns true
// (the part of the core's test proxy the commands' tests use).
type proxy struct {
	respond func(n int64, w http.ResponseWriter) bool
	count   atomic.Int64
}

func startProxy(t *testing.T, target string, p *proxy) string {
	t.Helper()
	u, _ := url.Parse(target)
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.FlushInterval = -1
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/chat/completions" {
			if n := p.count.Add(1); p.respond != nil && p.respond(n, w) {
				return
			}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// bound is an accuracy limit for tests that compare measured rates with a
// server's own: the stated limit with GPUHOST_BENCH_ACCURACY=1, five times
// it in the default suite, which must pass on a loaded 2-core CI machine
// (as the core's tests bound them).
func bound(strict float64) float64 {
	if os.Getenv("GPUHOST_BENCH_ACCURACY") == "1" {
		return strict
	}
	return 5 * strict
}
