package loopback

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"
)

// Dialer dials TCP, except that a loopback address whose port is listed
// in Sockets is reached through that unix socket instead. Under systemd a
// backend lives in its own network namespace and its socket unit is the
// only way in; everything above the dial (URLs, Host headers, logs, the
// backends' own Host checks) keeps saying 127.0.0.1:PORT, so one Dialer in
// each transport that talks to a backend is the whole change.
type Dialer struct {
	// Sockets maps a loopback port to the unix socket that reaches it.
	// Nil or empty: plain TCP everywhere (the demo's process runner).
	Sockets map[int]string
	// Timeout bounds one dial; zero means 5 s.
	Timeout time.Duration
	// KeepAlive is the TCP keep-alive period (unused for unix sockets);
	// zero means Go's default.
	KeepAlive time.Duration
}

// DialContext has the signature of net/http.Transport.DialContext.
func (d *Dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	timeout := d.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	nd := &net.Dialer{Timeout: timeout, KeepAlive: d.KeepAlive}
	if path, ok := d.SocketFor(addr); ok {
		c, err := nd.DialContext(ctx, "unix", path)
		if err != nil {
			return nil, fmt.Errorf("dial %s through its socket %s: %w", addr, path, err)
		}
		return c, nil
	}
	return nd.DialContext(ctx, network, addr)
}

// SocketFor returns the unix socket that stands for addr (host:port), if
// addr is a loopback address whose port has one.
func (d *Dialer) SocketFor(addr string) (string, bool) {
	if d == nil || len(d.Sockets) == 0 {
		return "", false
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || !DialsLoopback(host) {
		return "", false
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		return "", false
	}
	path, ok := d.Sockets[n]
	return path, ok
}
