package frontdoor

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"gpuhost/internal/jsonlimit"
)

// TestGuardJSONLimits: a body on /api or /mcp that nests too deep or holds
// too many values is refused with 413 naming the key before any handler
// decodes it, in the caller's shape (JSON-RPC on /mcp); bodies within the
// limits reach the handler whole.
func TestGuardJSONLimits(t *testing.T) {
	g := New(Options{Listen: "127.0.0.1:8080", MaxBodyBytes: 1 << 20, LimitedPrefixes: []string{"/api", "/mcp"},
		JSON: jsonlimit.Limits{MaxDepth: 8, MaxValues: 100, MaxStrings: 100}, DecodeMemoryBytes: 64 << 20})
	tests := []struct {
		name, path, body string
		wantCode         int
		wantKey          string
	}{
		{"within the limits", "/api/bench/results", `{"notes":["a","b"]}`, 200, ""},
		{"too deep", "/api/switch", strings.Repeat("[", 9) + strings.Repeat("]", 9), 413, "http.max_json_depth"},
		{"too many values", "/api/bench/results", `{"notes":[` + strings.Repeat(`"x",`, 100) + `"x"]}`, 413, "http.max_json_values"},
		{"too many empty objects on /mcp", "/mcp", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{"expression":[` + strings.Repeat("{},", 100) + `{}]}}}`, 413, "http.max_json_values"},
		{"syntax errors are the handler's", "/api/switch", `{"a":]`, 200, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", tc.path, strings.NewReader(tc.body))
			r.Host = "127.0.0.1:8080"
			r.Header.Set("Content-Type", "application/json")
			w, ran, body := serve(t, g, r)
			if w.Code != tc.wantCode {
				t.Fatalf("status %d, want %d: %s", w.Code, tc.wantCode, w.Body)
			}
			if tc.wantKey == "" {
				if !ran || body != tc.body {
					t.Errorf("handler ran %v with %q, want the body whole", ran, body)
				}
				return
			}
			if ran || !strings.Contains(w.Body.String(), tc.wantKey) {
				t.Errorf("ran %v, body %s: want refused naming %s", ran, w.Body, tc.wantKey)
			}
			if tc.path == "/mcp" {
				var rpc struct {
					JSONRPC string `json:"jsonrpc"`
					Error   struct {
						Code    int    `json:"code"`
						Message string `json:"message"`
					} `json:"error"`
				}
				if err := json.Unmarshal(w.Body.Bytes(), &rpc); err != nil || rpc.JSONRPC != "2.0" || rpc.Error.Code != -32600 || rpc.Error.Message == "" {
					t.Errorf("not a JSON-RPC error: %v %s", err, w.Body)
				}
			}
		})
	}
	if used := g.decode.Used(); used != 0 {
		t.Errorf("decode budget holds %d bytes after every request ended", used)
	}
}

// TestGuardDecodeBudget: the bodies being decoded share one budget. While
// one request holds most of it, another that does not fit gets 503 +
// Retry-After naming http.decode_memory_bytes, a small one still passes,
// and once the first ends the budget is whole again.
func TestGuardDecodeBudget(t *testing.T) {
	const budget = 200 << 10
	g := New(Options{Listen: "127.0.0.1:8080", MaxBodyBytes: 100 << 10, LimitedPrefixes: []string{"/api"},
		JSON: jsonlimit.Limits{MaxDepth: 8, MaxValues: 100_000}, DecodeMemoryBytes: budget})
	e := echo.New()
	e.Pre(g.Middleware)
	entered, release := make(chan struct{}), make(chan struct{})
	e.POST("/api/hold", func(c echo.Context) error {
		entered <- struct{}{}
		<-release
		return c.String(http.StatusOK, "held")
	})
	e.POST("/api/x", func(c echo.Context) error { return c.String(http.StatusOK, "ok") })
	post := func(path, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", path, strings.NewReader(body))
		r.Host = "127.0.0.1:8080"
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		e.ServeHTTP(w, r)
		return w
	}
	// 400 values: 400 × 256 + the body ≈ 103 kB + its 2 kB buffer, over
	// half the budget.
	heavy := "[" + strings.Repeat("1,", 399) + "1]"
	var wg sync.WaitGroup
	wg.Go(func() {
		if w := post("/api/hold", heavy); w.Code != http.StatusOK {
			t.Errorf("first heavy request: %d %s", w.Code, w.Body)
		}
	})
	<-entered
	w := post("/api/x", heavy)
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" || !strings.Contains(w.Body.String(), "http.decode_memory_bytes") {
		t.Errorf("second heavy request while the first is decoded: %d %v %s; want 503 + Retry-After naming the key", w.Code, w.Header(), w.Body)
	}
	if w := post("/api/x", `{"a":1}`); w.Code != http.StatusOK {
		t.Errorf("a small request while the first is decoded: %d %s", w.Code, w.Body)
	}
	close(release)
	wg.Wait()
	if w := post("/api/x", heavy); w.Code != http.StatusOK {
		t.Errorf("heavy request after the first ended: %d %s", w.Code, w.Body)
	}
	if used := g.decode.Used(); used != 0 {
		t.Errorf("decode budget holds %d bytes after every request ended", used)
	}
}

func TestClientKey(t *testing.T) {
	tests := []struct{ remote, want string }{
		{"127.0.0.1:5000", LoopbackClient},
		{"127.4.5.6:1", LoopbackClient},
		{"[::1]:80", LoopbackClient},
		{"[::ffff:127.0.0.9]:80", LoopbackClient},
		{"10.0.0.1:5000", "10.0.0.1"},
		{"[::ffff:10.0.0.1]:5000", "10.0.0.1"},
		{"[fe80::1%eth0]:5000", "fe80::1"},
		{"not an address", "not an address"},
	}
	for _, tc := range tests {
		if got := ClientKey(tc.remote); got != tc.want {
			t.Errorf("ClientKey(%q) = %q, want %q", tc.remote, got, tc.want)
		}
	}
}

// TestLimitPerClient: one client, loopback from any 127/8 address, holds
// at most the cap of connections; the next is answered 503 naming the key
// and closed; once one closes, a new one is accepted.
func TestLimitPerClient(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := LimitPerClient(raw, 2)
	defer ln.Close()
	accepted := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dial := func(from string) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a := dial("127.0.0.1")
	defer a.Close()
	b := dial("127.0.0.2")
	defer b.Close()
	srvA, srvB := <-accepted, <-accepted
	c := dial("127.0.0.3") // a third loopback address is the same client
	defer c.Close()
	fmtReq := "GET / HTTP/1.1\r\nHost: x\r\n\r\n"
	_, _ = io.WriteString(c, fmtReq)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("the connection over the cap got no answer: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "http.max_connections_per_client") {
		t.Errorf("over the cap: %d %s; want 503 naming the key", resp.StatusCode, body)
	}
	select {
	case <-accepted:
		t.Fatal("a connection over the cap reached the server")
	default:
	}
	srvA.Close()
	d := dial("127.0.0.1")
	defer d.Close()
	select {
	case srvD := <-accepted:
		srvD.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("no connection accepted after one of the client's closed")
	}
	srvB.Close()
}

// TestWriteDeadline: an answer whose client stops reading is cut once one
// write has waited WriteTimeout, while a stream whose writes are further
// apart than WriteTimeout, read by its client, arrives whole.
func TestWriteDeadline(t *testing.T) {
	const d = 200 * time.Millisecond
	e := echo.New()
	e.Pre(New(Options{Listen: "127.0.0.1:0", WriteTimeout: d}).Middleware)
	cut := make(chan error, 1)
	e.GET("/flood", func(c echo.Context) error {
		chunk := []byte(strings.Repeat("x", 64<<10))
		for {
			if _, err := c.Response().Write(chunk); err != nil {
				cut <- err
				return nil
			}
			c.Response().Flush()
		}
	})
	e.GET("/slow", func(c echo.Context) error {
		c.Response().WriteHeader(http.StatusOK)
		for i := range 3 {
			if _, err := io.WriteString(c.Response(), "event "+string(rune('0'+i))+"\n"); err != nil {
				return err
			}
			c.Response().Flush()
			time.Sleep(3 * d)
		}
		return nil
	})
	srv := httptest.NewServer(e)
	defer srv.Close()

	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, _ = io.WriteString(conn, "GET /flood HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n") // and never read
	select {
	case err := <-cut:
		t.Logf("a client that never reads: the write failed with %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("a client that never reads held its answer for 30 s")
	}

	resp, err := http.Get(srv.URL + "/slow")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil || string(got) != "event 0\nevent 1\nevent 2\n" {
		t.Fatalf("a slow stream read by its client: %q, %v; want all three events", got, err)
	}
}

// TestStreamsTotal: all clients together hold at most MaxStreams.
func TestStreamsTotal(t *testing.T) {
	s := newStreams(2, 3, []string{"/api/events"})
	for i, c := range []string{"10.0.0.1", "10.0.0.1", "10.0.0.2"} {
		if key := s.acquire(c); key != "" {
			t.Fatalf("stream %d from %s refused by %s", i, c, key)
		}
	}
	if key := s.acquire("10.0.0.3"); key != "http.max_streams" {
		t.Errorf("fourth stream: %q, want refused by http.max_streams", key)
	}
	s.release("10.0.0.1")
	if key := s.acquire("10.0.0.3"); key != "" {
		t.Errorf("after one ended: refused by %s", key)
	}
}
