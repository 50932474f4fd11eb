package mcp_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"gpuhost/config"
	"gpuhost/mcp"
	"gpuhost/mcp/connector"
)

// legacyVersion is a protocol revision with sessions (before 2026-07-28).
const legacyVersion = "2025-06-18"

// The daemon's default (config) and the package's agree.
func TestDefaultMaxSessions(t *testing.T) {
	if mcp.DefaultMaxSessions != config.DefaultMCPMaxSessions {
		t.Errorf("mcp.DefaultMaxSessions %d, config.DefaultMCPMaxSessions %d", mcp.DefaultMaxSessions, config.DefaultMCPMaxSessions)
	}
}

func cappedServer(t testing.TB, maxSessions int) *httptest.Server {
	t.Helper()
	s := newServer(t, mcp.ServerOptions{
		Config:      map[string]yaml.Node{"t": section()},
		Factories:   map[string]connector.Factory{"t": factory(tools(deviceTool("t_status")))},
		MaxSessions: maxSessions,
	})
	srv := httptest.NewServer(s.HTTPHandler())
	t.Cleanup(srv.Close)
	return srv
}

// post sends one JSON-RPC message over streamable HTTP as a client on
// legacyVersion does, and returns the status and the session id header.
func post(t testing.TB, c *http.Client, url, sid, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url+mcp.MountPath, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("Mcp-Protocol-Version", legacyVersion)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Mcp-Session-Id")
}

func initialize(t testing.TB, c *http.Client, url string) string {
	t.Helper()
	code, sid := post(t, c, url, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"`+legacyVersion+`","capabilities":{},"clientInfo":{"name":"cap-test","version":"1"}}}`)
	if code != http.StatusOK || sid == "" {
		t.Fatalf("initialize: %d, session %q", code, sid)
	}
	return sid
}

func callStatus(t testing.TB, c *http.Client, url, sid string) int {
	t.Helper()
	code, _ := post(t, c, url, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"t_status","arguments":{"device":"kitchen"}}}`)
	return code
}

// TestSessionCap: at mcp.max_sessions the least recently used session is
// evicted by the next initialize (before: every session stayed for the
// idle TTL, an hour); an evicted session gets 404, which tells a client to
// initialize again, and the others keep working. Clients on 2026-07-28
// hold no session and evict nobody.
func TestSessionCap(t *testing.T) {
	srv := cappedServer(t, 3)
	c := srv.Client()
	a, b, cc := initialize(t, c, srv.URL), initialize(t, c, srv.URL), initialize(t, c, srv.URL)
	if code := callStatus(t, c, srv.URL, a); code != http.StatusOK { // a is now the most recent
		t.Fatalf("session a: %d", code)
	}
	d := initialize(t, c, srv.URL) // evicts b, the least recently used
	for _, tc := range []struct {
		name, sid string
		want      int
	}{{"a", a, 200}, {"b (evicted)", b, 404}, {"c", cc, 200}, {"d", d, 200}} {
		if code := callStatus(t, c, srv.URL, tc.sid); code != tc.want {
			t.Errorf("session %s: %d, want %d", tc.name, code, tc.want)
		}
	}
	// b initializes again and gets a new session; the least recently used
	// one now is a (c and d were used after it above).
	b2 := initialize(t, c, srv.URL)
	if code := callStatus(t, c, srv.URL, a); code != http.StatusNotFound {
		t.Errorf("session a after the next eviction: %d, want 404", code)
	}
	for _, sid := range []string{cc, d, b2} {
		if code := callStatus(t, c, srv.URL, sid); code != http.StatusOK {
			t.Errorf("session %s: %d, want 200", sid, code)
		}
	}
	// A 2026-07-28 client (mcp-go's default) calls without a session.
	modern, err := httpClient(t, srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if r := call(t, modern, "t_status", map[string]any{"device": "kitchen"}); r.IsError {
			t.Fatalf("modern call: %s", text(r))
		}
	}
	for _, sid := range []string{cc, d, b2} {
		if code := callStatus(t, c, srv.URL, sid); code != http.StatusOK {
			t.Errorf("session %s after modern calls: %d, want 200 (a modern client evicted it)", sid, code)
		}
	}
	if code := callStatus(t, c, srv.URL, "mcp-session-forged"); code != http.StatusNotFound {
		t.Errorf("unknown session: %d, want 404", code)
	}
}

// BenchmarkSessionMemory measures what N legacy initializes leave on the
// heap (retained-MB), capped at the default and with the cap at N (what
// the daemon did before: nothing was evicted within the idle TTL).
// go test ./mcp -run '^$' -bench SessionMemory -benchtime 1x
func BenchmarkSessionMemory(b *testing.B) {
	const n = 30000
	for _, tc := range []struct {
		name string
		max  int
	}{{"uncapped", n}, {fmt.Sprintf("cap=%d", mcp.DefaultMaxSessions), 0}} {
		b.Run(tc.name, func(b *testing.B) {
			for range b.N {
				srv := cappedServer(b, tc.max)
				c := srv.Client()
				before := heapInUse()
				for range n {
					initialize(b, c, srv.URL)
				}
				b.ReportMetric(float64(heapInUse()-before)/(1<<20), "retained-MB")
				srv.Close()
			}
		})
	}
}

// heapInUse is the live heap after a full collection.
func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}

// TestGetStreamNeedsSession: a GET stream is opened only for a live
// session (before: a GET without one opened a stream that never ended and
// minted a session that evicted a real one; any made-up id did the same).
func TestGetStreamNeedsSession(t *testing.T) {
	srv := cappedServer(t, 1)
	c := srv.Client()
	sid := initialize(t, c, srv.URL)
	get := func(id string) int {
		req, _ := http.NewRequest("GET", srv.URL+mcp.MountPath, nil)
		req.Header.Set("Accept", "text/event-stream")
		if id != "" {
			req.Header.Set("Mcp-Session-Id", id)
			req.Header.Set("Mcp-Protocol-Version", legacyVersion)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close() // a stream that was opened ends here
		return resp.StatusCode
	}
	tests := []struct {
		name, id string
		want     int
	}{
		{"no session", "", http.StatusBadRequest},
		{"made-up session", "mcp-session-made-up", http.StatusNotFound},
		{"live session", sid, http.StatusOK},
	}
	for _, tc := range tests {
		if got := get(tc.id); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
	// The refused GETs evicted nobody (the cap is 1).
	if code := callStatus(t, c, srv.URL, sid); code != http.StatusOK {
		t.Errorf("the session after the refused GETs: %d, want 200", code)
	}
}
