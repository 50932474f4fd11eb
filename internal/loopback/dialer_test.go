package loopback

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestDialerRoutesLoopbackPortsToSockets: a listed loopback port goes to
// its unix socket (a real HTTP server there answers, the URL still says
// 127.0.0.1:PORT), everything else dials TCP as before.
func TestDialerRoutesLoopbackPortsToSockets(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "b.sock")
	ul, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serve := func(l net.Listener, who string) {
		srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "%s host=%s", who, r.Host)
		})}
		go func() { _ = srv.Serve(l) }()
		t.Cleanup(func() { _ = srv.Close() })
	}
	serve(ul, "unix")
	serve(tl, "tcp")
	tcpPort := tl.Addr().(*net.TCPAddr).Port
	const sockPort = 18000
	d := &Dialer{Sockets: map[int]string{sockPort: sock}}
	client := &http.Client{Transport: &http.Transport{Proxy: nil, DialContext: d.DialContext}, Timeout: 10 * time.Second}
	tests := []struct{ url, want string }{
		{"http://127.0.0.1:" + strconv.Itoa(sockPort) + "/", "unix host=127.0.0.1:18000"},
		{"http://localhost:" + strconv.Itoa(sockPort) + "/", "unix host=localhost:18000"},
		{"http://127.0.0.1:" + strconv.Itoa(tcpPort) + "/", "tcp host=127.0.0.1:" + strconv.Itoa(tcpPort)},
	}
	for _, tc := range tests {
		resp, err := client.Get(tc.url)
		if err != nil {
			t.Fatalf("GET %s: %v", tc.url, err)
		}
		b := make([]byte, 256)
		n, _ := resp.Body.Read(b)
		resp.Body.Close()
		if got := string(b[:n]); got != tc.want {
			t.Errorf("GET %s: %q, want %q", tc.url, got, tc.want)
		}
	}
	for _, addr := range []string{"10.0.0.1:18000", "example.com:18000", "127.0.0.1:x", "garbage"} {
		if p, ok := d.SocketFor(addr); ok {
			t.Errorf("SocketFor(%q) = %q; only loopback addresses map to sockets", addr, p)
		}
	}
	// A socket that is gone is named in the error.
	gone := &Dialer{Sockets: map[int]string{sockPort: filepath.Join(t.TempDir(), "none.sock")}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := gone.DialContext(ctx, "tcp", "127.0.0.1:18000"); err == nil || !strings.Contains(err.Error(), "none.sock") {
		t.Errorf("dial through a missing socket: %v, want an error naming it", err)
	}
}
