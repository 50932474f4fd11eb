package llm

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"testing"

	"gpuhost/simulator"
	"gpuhost/simulator/simtest"
)

// startSim runs the real inference simulator in this process, fast enough
// that a test takes milliseconds, and returns its /v1 base URL.
func startSim(t *testing.T, o simulator.Options) string {
	t.Helper()
	if o.Flavor == "" {
		o.Flavor = simulator.FlavorVLLM
	}
	if o.Model == "" {
		o.Model = "qwen3-coder"
	}
	o.PrefillTPS, o.DecodeTPS = 1e7, 1e6
	return simtest.Start(t, o) + "/v1"
}

// deadURL is a /v1 URL on a loopback port nobody listens on.
func deadURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return "http://" + addr + "/v1"
}

// recorder is an http.RoundTripper that forwards to the real server and
// keeps each request body, so a test can read what the client sent.
type recorder struct {
	mu     sync.Mutex
	bodies [][]byte
	paths  []string
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		b, err := io.ReadAll(req.Body)
		if err != nil {
			return nil, err
		}
		_ = req.Body.Close()
		body = b
		req.Body = io.NopCloser(bytes.NewReader(b))
	}
	r.mu.Lock()
	r.bodies = append(r.bodies, body)
	r.paths = append(r.paths, req.URL.Path)
	r.mu.Unlock()
	return http.DefaultTransport.RoundTrip(req)
}

func (r *recorder) requests() ([]string, [][]byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.paths...), append([][]byte(nil), r.bodies...)
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
