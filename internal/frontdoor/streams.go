package frontdoor

import (
	"fmt"
	"net/http"
	"sync"

	"github.com/labstack/echo/v4"
)

// streams counts the long-lived event streams (SSE) each client (ClientKey)
// holds open, and all of them together. Without it one client could hold
// every connection slot with streams (1,024 /activity/events or GET /mcp
// from one loopback client: every other request, an authenticated
// /api/status too, waited for a slot).
type streams struct {
	max   int
	total int // 0: no total
	paths map[string]bool

	mu   sync.Mutex
	open map[string]int // by client; only clients with open streams
	all  int
}

func newStreams(limit, total int, paths []string) *streams {
	if limit <= 0 || len(paths) == 0 {
		return nil
	}
	s := &streams{max: limit, total: total, paths: map[string]bool{}, open: map[string]int{}}
	for _, p := range paths {
		s.paths[p] = true
	}
	return s
}

// acquire takes one of the client's stream slots; "" when it got one,
// else the key of the cap that is reached.
func (s *streams) acquire(client string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open[client] >= s.max {
		return "http.max_streams_per_client"
	}
	if s.total > 0 && s.all >= s.total {
		return "http.max_streams"
	}
	s.open[client]++
	s.all++
	return ""
}

func (s *streams) release(client string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.all--
	if s.open[client]--; s.open[client] <= 0 {
		delete(s.open, client) // the table holds only clients with open streams
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
	client := ClientKey(r.RemoteAddr)
	switch key := s.acquire(client); key {
	case "":
	case "http.max_streams_per_client":
		c.Response().Header().Set("Connection", "close")
		c.Response().Header().Set("Retry-After", "5")
		return refuse(c, http.StatusTooManyRequests, "streams",
			fmt.Sprintf("this client holds %d event streams already (%s; every loopback address is one client); close one (another tab?) and retry", s.max, key))
	default:
		c.Response().Header().Set("Connection", "close")
		c.Response().Header().Set("Retry-After", "5")
		return refuse(c, http.StatusTooManyRequests, "streams",
			fmt.Sprintf("the daemon holds %d event streams already (%s); retry later", s.total, key))
	}
	defer s.release(client)
	return next(c)
}
