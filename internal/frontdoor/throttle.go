package frontdoor

import (
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"
)

// Throttle counts failed authentications (wrong bearer tokens, wrong panel
// passwords) per client address in fixed windows. A client past the limit
// within a window gets 429 with Retry-After instead of 401 for each further
// wrong guess, until the window ends. Callers check the credential before
// asking Blocked: the right credential always passes, so a guesser sharing
// the owner's address (NAT, or another user on this machine over loopback)
// cannot lock the owner out. What stops guessing is the token's length
// (config.MinTokenLength characters beyond loopback: out of reach online);
// the throttle bounds the log (the first refusal of each window is logged
// once with the client's address; the attempted secret is never seen here)
// and tells a misconfigured client to stop.
type Throttle struct {
	what   string // "bearer token", "panel login": for the log line
	limit  int
	window time.Duration
	log    *slog.Logger
	now    func() time.Time

	mu      sync.Mutex
	clients map[string]*failures
}

type failures struct {
	start  time.Time
	count  int
	logged bool
}

// maxClients bounds the table: past it, expired entries are dropped, and if
// all are live the oldest is evicted (a flood of addresses cannot grow
// memory without bound).
const maxClients = 8192

// NewThrottle allows limit failures per client per window; limit ≤ 0
// disables it. now may be nil (time.Now).
func NewThrottle(what string, limit int, window time.Duration, log *slog.Logger, now func() time.Time) *Throttle {
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.Default()
	}
	return &Throttle{what: what, limit: limit, window: window, log: log, now: now, clients: map[string]*failures{}}
}

// Blocked reports whether the client must wait, and for how long.
func (t *Throttle) Blocked(remote string) (time.Duration, bool) {
	if t == nil || t.limit <= 0 {
		return 0, false
	}
	ip := clientIP(remote)
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	f := t.clients[ip]
	if f == nil || now.Sub(f.start) >= t.window {
		return 0, false
	}
	if f.count < t.limit {
		return 0, false
	}
	if !f.logged {
		f.logged = true
		t.log.Warn("authentication failures throttled", "what", t.what, "client", ip, "failures", f.count,
			"window", t.window.String(), "retry_after_s", RetryAfterSeconds(f.start.Add(t.window).Sub(now)))
	}
	return f.start.Add(t.window).Sub(now), true
}

// Fail records one failed attempt.
func (t *Throttle) Fail(remote string) {
	if t == nil || t.limit <= 0 {
		return
	}
	ip := clientIP(remote)
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	f := t.clients[ip]
	if f == nil || now.Sub(f.start) >= t.window {
		if f == nil && len(t.clients) >= maxClients {
			t.evict(now)
		}
		f = &failures{start: now}
		t.clients[ip] = f
	}
	f.count++
	if f.count == 1 {
		t.log.Info("authentication failed", "what", t.what, "client", ip)
	}
}

func (t *Throttle) evict(now time.Time) {
	var oldest string
	var oldestAt time.Time
	for ip, f := range t.clients {
		if now.Sub(f.start) >= t.window {
			delete(t.clients, ip)
			continue
		}
		if oldest == "" || f.start.Before(oldestAt) {
			oldest, oldestAt = ip, f.start
		}
	}
	if len(t.clients) >= maxClients {
		delete(t.clients, oldest)
	}
}

// RetryAfterSeconds renders a wait as whole seconds, at least 1.
func RetryAfterSeconds(d time.Duration) string {
	s := int((d + time.Second - 1) / time.Second)
	return strconv.Itoa(max(s, 1))
}

// clientIP is the address without the port: the unit a client is counted
// by (the daemon is not behind a proxy, so RemoteAddr is the client).
func clientIP(remote string) string {
	if h, _, err := net.SplitHostPort(remote); err == nil {
		return h
	}
	return remote
}
