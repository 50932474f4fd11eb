package frontdoor

import (
	"fmt"
	"net/http"
	"sync"

	"github.com/labstack/echo/v4"
)

// streams counts the long-lived event streams (SSE) each client address
// holds open. Without it one client could hold every connection slot with
// streams (1,024 /activity/events from one loopback client: every other
// request, an authenticated /api/status too, waited for a slot).
type streams struct {
	max   int
	paths map[string]bool

	mu   sync.Mutex
	open map[string]int // by client address
}

func newStreams(limit int, paths []string) *streams {
	if limit <= 0 || len(paths) == 0 {
		return nil
	}
	s := &streams{max: limit, paths: map[string]bool{}, open: map[string]int{}}
	for _, p := range paths {
		s.paths[p] = true
	}
	return s
}

// acquire takes one of the client's stream slots; false when all are held.
func (s *streams) acquire(ip string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open[ip] >= s.max {
		return false
	}
	s.open[ip]++
	return true
}

func (s *streams) release(ip string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open[ip]--; s.open[ip] <= 0 {
		delete(s.open, ip) // the table holds only clients with open streams
	}
}

// guard runs next within one of the client's stream slots when the request
// opens a stream, and refuses it (429, connection closed) when the client
// holds MaxStreamsPerClient already.
func (s *streams) guard(c echo.Context, next echo.HandlerFunc) error {
	r := c.Request()
	if s == nil || r.Method != http.MethodGet || !s.paths[r.URL.Path] {
		return next(c)
	}
	ip := clientIP(r.RemoteAddr)
	if !s.acquire(ip) {
		c.Response().Header().Set("Connection", "close")
		c.Response().Header().Set("Retry-After", "5")
		return refuse(c, http.StatusTooManyRequests, "streams",
			fmt.Sprintf("this address holds %d event streams already (http.max_streams_per_client); close one (another tab?) and retry", s.max))
	}
	defer s.release(ip)
	return next(c)
}
