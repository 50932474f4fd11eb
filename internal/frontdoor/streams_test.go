package frontdoor

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/labstack/echo/v4"
)

// TestStreamsPerClient: a client address holds at most
// MaxStreamsPerClient event streams; the next gets 429 with the key named
// and its connection closed, while other addresses, other routes and the
// same address after a stream ended are served (before: one client could
// hold every connection with streams).
func TestStreamsPerClient(t *testing.T) {
	e := echo.New()
	g := New(Options{Listen: "0.0.0.0:8080", StreamPaths: []string{"/api/events"}, MaxStreamsPerClient: 2})
	e.Pre(g.Middleware)
	entered, release := make(chan struct{}, 16), make(chan struct{})
	e.GET("/api/events", func(c echo.Context) error {
		entered <- struct{}{}
		<-release
		return c.String(http.StatusOK, "done")
	})
	e.GET("/api/status", func(c echo.Context) error { return c.String(http.StatusOK, "ok") })
	serve := func(remote, path string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, "http://127.0.0.1:8080"+path, nil)
		r.RemoteAddr = remote
		w := httptest.NewRecorder()
		e.ServeHTTP(w, r)
		return w
	}
	var wg sync.WaitGroup
	open := func(remote string) {
		wg.Go(func() {
			if w := serve(remote, "/api/events"); w.Code != http.StatusOK {
				t.Errorf("stream from %s: %d", remote, w.Code)
			}
		})
		<-entered
	}
	open("10.0.0.1:1000")
	open("10.0.0.1:1001")
	tests := []struct {
		name, remote, path string
		want               int
	}{
		{"third stream from the same address", "10.0.0.1:1002", "/api/events", http.StatusTooManyRequests},
		{"another route from the same address", "10.0.0.1:1003", "/api/status", http.StatusOK},
	}
	for _, tc := range tests {
		w := serve(tc.remote, tc.path)
		if w.Code != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, w.Code, tc.want)
		}
		if tc.want == http.StatusTooManyRequests {
			if !strings.Contains(w.Body.String(), "http.max_streams_per_client") || w.Header().Get("Connection") != "close" || w.Header().Get("Retry-After") == "" {
				t.Errorf("%s: body %s, headers %v: want the key named, Connection: close, Retry-After", tc.name, w.Body, w.Header())
			}
		}
	}
	open("10.0.0.2:1000") // another address is not affected
	close(release)        // every stream ends
	wg.Wait()
	if n := len(g.streams.open); n != 0 {
		t.Errorf("%d addresses still counted after their streams ended", n)
	}
	for i := range 3 { // the address's slots are free again
		if w := serve("10.0.0.1:2000", "/api/events"); w.Code != http.StatusOK {
			t.Errorf("stream %d after the others ended: %d", i, w.Code)
		}
	}
}
