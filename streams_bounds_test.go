package main

import (
	"context"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestLongStreamsCannotTakeEverySlot: event streams that never end, 1,024
// GET /mcp from one address and 16 /api/events from each of 65 loopback
// addresses, hold at most http.max_streams_per_client (16) between them,
// and /api/status is answered from a fresh client throughout (before:
// every GET /mcp was a stream nobody counted, 1,024 of them took every
// connection and /api/status was answered from no address; each 127.x.y.z
// was a client of its own).
func TestLongStreamsCannotTakeEverySlot(t *testing.T) {
	if testing.Short() {
		t.Skip("opens ~2,000 connections")
	}
	d := startBoundsDaemon(t, "127.0.0.1", "", "10ms")
	tests := []struct {
		name  string
		path  string
		froms int  // loopback source addresses 127.0.0.1..
		each  int  // streams from each
		live  bool // each GET /mcp names a live session of its own
	}{
		{"1,024 GET /mcp from one address", "/mcp", 1, 1024, false},
		{"64 GET /mcp streams of 64 live sessions", "/mcp", 1, 64, true},
		{"65 × 16 /api/events from 65 loopback addresses", "/api/events", 65, 16, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			total := tc.froms * tc.each
			var mu sync.Mutex
			codes := map[int]int{}
			var wg sync.WaitGroup
			defer wg.Wait()
			defer cancel()
			for i := range tc.froms {
				from := net.IPv4(127, 0, 0, byte(1+i))
				c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
					DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: from}}).DialContext}}
				for range tc.each {
					sid := ""
					if tc.live {
						sid = mcpSession(t, d.url)
					}
					wg.Go(func() {
						code := openStream(ctx, c, d.url+tc.path, sid)
						mu.Lock()
						codes[code]++
						mu.Unlock()
						if code == http.StatusOK {
							<-ctx.Done()
						}
					})
				}
			}
			// Wait until every stream was answered one way or the other
			// (before the bounds the last ones waited for a slot forever).
			for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				mu.Lock()
				n := 0
				for _, v := range codes {
					n += v
				}
				mu.Unlock()
				if n == total {
					break
				}
			}
			took, ok := statusWithin(d, 10*time.Second)
			took2, ok2 := statusWithin(d, 10*time.Second)
			mu.Lock()
			held := codes[http.StatusOK]
			t.Logf("%d streams: %v (status: count); /api/status from a fresh client: answered=%v in %s, again answered=%v in %s",
				total, codes, ok, took.Round(time.Millisecond), ok2, took2.Round(100*time.Microsecond))
			mu.Unlock()
			if !ok || !ok2 {
				t.Errorf("/api/status from a fresh client not answered within 10 s while %d streams were tried", total)
			}
			if held > 16 {
				t.Errorf("%d streams held: more than http.max_streams_per_client (16) for loopback as one client", held)
			}
		})
	}
}

// openStream opens a GET event stream and returns its status (-1: no
// answer), with an MCP session id when sid is set; a stream that was opened stays open until ctx ends.
func openStream(ctx context.Context, c *http.Client, url, sid string) int {
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	req.Header.Set("Accept", "text/event-stream")
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	}
	resp, err := c.Do(req)
	if err != nil {
		return -1
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return resp.StatusCode
	}
	go func() {
		<-ctx.Done()
		resp.Body.Close()
	}()
	return resp.StatusCode
}
