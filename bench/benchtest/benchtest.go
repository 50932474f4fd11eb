// Package benchtest is the test kit the bench packages share (the core,
// the command, the service): a misbehaving proxy in front of a real
// simulator, and the accuracy bound of tests that compare measured rates
// with a server's own. It is imported by tests only.
package benchtest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"sync/atomic"
	"testing"
)

// AccuracyEnv, set to 1, makes Bound return the stated limit.
const AccuracyEnv = "GPUHOST_BENCH_ACCURACY"

// Bound is an accuracy limit: the stated one with GPUHOST_BENCH_ACCURACY=1
// (an idle machine: the accuracy check), else 99, i.e. within a factor
// of 100, in the default suite. How close a measured rate comes to the
// simulator's depends on the machine's load (timer wake-ups, scheduling
// on a busy 2-core machine), so the default suite asserts no closeness,
// only that the figure is of the right order: a wrong clock unit (ms for
// s) or a token count off by orders of magnitude still fails it. Counts
// are asserted exactly by the tests themselves.
func Bound(strict float64) float64 {
	if os.Getenv(AccuracyEnv) == "1" {
		return strict
	}
	return 99
}

// Proxy puts a misbehaving layer in front of a real simulator, on
// /v1/chat/completions only; requests are numbered from 1.
type Proxy struct {
	RewriteBody func(body []byte) []byte                        // the request body
	Respond     func(n int64, w http.ResponseWriter) bool       // answer request n itself
	Wrap        func(n int64, body io.ReadCloser) io.ReadCloser // the response body of request n
	count       atomic.Int64
}

type reqNum struct{}

// StartProxy serves p in front of target until the test ends and returns
// its URL.
func StartProxy(t testing.TB, target string, p *Proxy) string {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatalf("proxy target %q: %v", target, err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.FlushInterval = -1
	rp.ModifyResponse = func(resp *http.Response) error {
		if p.Wrap != nil && resp.Request.URL.Path == "/v1/chat/completions" {
			n, _ := resp.Request.Context().Value(reqNum{}).(int64)
			resp.Body = p.Wrap(n, resp.Body)
		}
		return nil
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := BufferBody(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if r.URL.Path == "/v1/chat/completions" {
			n := p.count.Add(1)
			if p.Respond != nil && p.Respond(n, w) {
				return
			}
			if p.RewriteBody != nil {
				b := p.RewriteBody(body)
				r.Body = io.NopCloser(bytes.NewReader(b))
				r.ContentLength = int64(len(b))
			}
			r = r.WithContext(context.WithValue(r.Context(), reqNum{}, n))
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// Forward is a reverse proxy to target that streams answers as they come,
// with each request's body read in full first (see BufferBody).
func Forward(target *url.URL) http.Handler {
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.FlushInterval = -1
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := BufferBody(r); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rp.ServeHTTP(w, r)
	})
}

// BufferBody replaces r's body with a copy read in full and returns it. Go's HTTP/1
// server ends a request body once the handler starts its answer, so a
// reverse proxy still copying the body upstream when a fast backend
// answers has that copy fail and its upstream connection closed
// mid-answer ("use of closed network connection"): on a loaded machine
// that cut a bench warm-up stream and failed a test.
func BufferBody(r *http.Request) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	b, err := io.ReadAll(r.Body)
	_ = r.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("read the request body: %w", err)
	}
	r.Body = io.NopCloser(bytes.NewReader(b))
	r.ContentLength = int64(len(b))
	return b, nil
}
