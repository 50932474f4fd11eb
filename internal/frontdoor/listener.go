package frontdoor

import (
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// LimitPerClient wraps ln so that one client (ClientKey: every loopback
// address is one) holds at most limit of its connections at once. A
// connection past the limit is answered 503 (naming the key) and closed,
// so one client's slow requests, streams and idle keep-alives cannot fill
// http.max_connections for everyone else. Put it inside the listener that
// enforces the total: a refused connection then never takes a slot.
func LimitPerClient(ln net.Listener, limit int) net.Listener {
	return &perClientListener{Listener: ln, limit: limit, open: map[string]int{}, refusing: make(chan struct{}, maxRefusing)}
}

// maxRefusing bounds the refused connections being answered at once;
// beyond it a refused connection is closed without an answer.
const maxRefusing = 64

type perClientListener struct {
	net.Listener
	limit int

	mu   sync.Mutex
	open map[string]int // by ClientKey; only clients with open connections

	refusing chan struct{}
}

func (l *perClientListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		key := ClientKey(c.RemoteAddr().String())
		if l.acquire(key) {
			return &clientConn{Conn: c, release: func() { l.release(key) }}, nil
		}
		select {
		case l.refusing <- struct{}{}:
			go func() {
				defer func() { <-l.refusing }()
				refuseConn(c, l.limit)
			}()
		default:
			_ = c.Close()
		}
	}
}

func (l *perClientListener) acquire(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[key] >= l.limit {
		return false
	}
	l.open[key]++
	return true
}

func (l *perClientListener) release(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[key]--; l.open[key] <= 0 {
		delete(l.open, key)
	}
}

// refuseConn answers a connection over the per-client cap with a 503 and
// closes it, reading what the client sent first (for half a second at most) so
// the close does not reset the answer away.
func refuseConn(c net.Conn, limit int) {
	defer c.Close()
	body := fmt.Sprintf(`{"error":"service unavailable","detail":"this client holds %d connections already (http.max_connections_per_client); close some and retry","rule":"connections"}`, limit)
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	_, _ = fmt.Fprintf(c, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 5\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(c, 64<<10))
}

// clientConn gives its client's slot back once, on the first Close.
type clientConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *clientConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}
