package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"gpuhost/bench"
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
			waitAnswered(&mu, codes, total, 60*time.Second)
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

// TestClientThatStopsReadingIsCut: a client that pipelines requests for
// large answers and never reads holds its connection until one write has
// waited http.write_timeout, then the daemon closes it: what the client
// finally reads ends early with the connection closed (before: nothing cut
// such a client; it held its connection for as long as it liked).
func TestClientThatStopsReadingIsCut(t *testing.T) {
	if testing.Short() {
		t.Skip("moves ~40 MB over loopback")
	}
	d := startBoundsDaemon(t, "127.0.0.1", "http: {write_timeout: 1s}", "10ms")
	at := time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)
	r := bench.Result{SchemaVersion: bench.SchemaVersion, ID: bench.NewID(at, "upload"), Status: bench.StatusOK,
		StartedAt: at, FinishedAt: at.Add(time.Minute), Notes: []string{strings.Repeat("padding ", 3_900_000/8)}}
	b, _ := json.Marshal(r)
	resp, err := http.Post(d.url+"/api/bench/results", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("upload: %d", resp.StatusCode)
	}
	const pipelined = 12 // ~47 MB of answers: more than the sockets' buffers
	conn, err := net.Dial("tcp", d.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for range pipelined {
		fmt.Fprintf(conn, "GET /api/bench/%s HTTP/1.1\r\nHost: %s\r\n\r\n", r.ID, d.addr)
	}
	time.Sleep(5 * time.Second) // never reading: the daemon's write waits past its 1 s
	br := bufio.NewReader(conn)
	answers := 0
	var readErr error
	for answers < pipelined {
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(br, nil)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		if err != nil {
			readErr = err
			break
		}
		answers++
	}
	var ne net.Error
	timedOut := errors.As(readErr, &ne) && ne.Timeout()
	t.Logf("%d pipelined answers of %d bytes never read for 5 s: %d arrived whole, then %v", pipelined, len(b), answers, readErr)
	if answers == pipelined || readErr == nil || timedOut {
		t.Errorf("the daemon did not cut a client that stopped reading: %d of %d answers arrived, read ended with %v", answers, pipelined, readErr)
	}
}
