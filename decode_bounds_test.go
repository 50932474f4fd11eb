package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestDecodeMemoryBounded: 64 concurrent worst-case bodies on each
// endpoint that decodes JSON keep the daemon's peak RSS within three times
// its decode budget above rest, and /api/status is answered from a fresh
// client throughout (before: one 4 MiB /mcp body of empty objects cost
// ~160 MB to decode, 16 at once ~2.4 GB, and it stayed).
// GPUHOST_DECODE_CLIENTS sets the concurrency (the build before the bounds
// needs about 150 MB per /mcp body: measure it with 16).
func TestDecodeMemoryBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("moves ~1 GB over loopback")
	}
	clients := 64
	if n, err := strconv.Atoi(os.Getenv("GPUHOST_DECODE_CLIENTS")); err == nil && n > 0 {
		clients = n
	}
	// The daemon's defaults: http.decode_memory_bytes and (set here to
	// the same) proxy.body_memory_bytes of 64 MiB, http.max_body_bytes of
	// 4 MiB, http.max_json_values of 50,000.
	const budgetMiB = 64
	const size = 4_000_000 // under http.max_body_bytes
	mcpCall := func(elem string, n int) string {
		return `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"gpu_status","arguments":{"expression":[` +
			strings.Repeat(elem+",", n-1) + elem + `]}}}`
	}
	endpoints := []struct {
		name, path, body string
		session          bool
	}{
		{"mcp: 4 MB of empty objects", "/mcp", mcpCall("{}", size/3), true},
		{"mcp: 49,000 empty objects (within the limits)", "/mcp", mcpCall("{}", 49_000), true},
		{"bench upload: 1 million one-character notes", "/api/bench/results",
			`{"schema_version":1,"id":"20260101T000000Z-upload","status":"ok","notes":[` + strings.Repeat(`"a",`, size/4-1) + `"a"]}`, false},
		{"v1 peek: 4 MB of empty objects", "/v1/chat/completions", `{"model":"no-such-model","messages":[` + strings.Repeat("{},", size/3) + `{}]}`, false},
	}
	for _, ep := range endpoints {
		t.Run(ep.name, func(t *testing.T) {
			d := startBoundsDaemon(t, "127.0.0.1", fmt.Sprintf("proxy: {body_memory_bytes: %d}", budgetMiB<<20), "10ms")
			sid := ""
			if ep.session {
				sid = mcpSession(t, d.url)
			}
			base := d.rssMiB(t)
			stop := make(chan struct{})
			probes := make(chan statusProbe, 1)
			go func() { probes <- probeStatus(t, d, stop) }()
			codes := burst(t, d.url+ep.path, ep.body, sid, clients)
			close(stop)
			p := <-probes
			peak := d.hwmMiB(t)
			time.Sleep(2 * time.Second)
			after := d.rssMiB(t)
			t.Logf("%d × %s (%d bytes): %v (status: count); RSS %d → peak %d MiB, %d MiB 2 s later; /api/status during it: %d answered, %d not, slowest %s",
				clients, ep.path, len(ep.body), codes, base, peak, after, p.answered, p.failed, p.slowest.Round(time.Millisecond))
			if p.failed > 0 || p.answered == 0 {
				t.Errorf("/api/status from a fresh client: %d answered, %d not (within 10 s each)", p.answered, p.failed)
			}
			// /api and /mcp answer every refusal (the /v1 proxy closes a
			// connection whose body does not fit without reading it).
			if !strings.HasPrefix(ep.path, "/v1/") && codes[-1] > 0 {
				t.Errorf("%d requests got no answer; want each answered (413, 503 or its handler's)", codes[-1])
			}
			if peak > base+3*budgetMiB+64 {
				t.Errorf("RSS peak %d MiB (at rest %d MiB): more than three times the %d MiB decode budget above rest", peak, base, budgetMiB)
			}
		})
	}
}

// mcpSession initializes an MCP session (protocol 2025-06-18) and returns
// its id.
func mcpSession(t *testing.T, url string) string {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"probe","version":"1"}}}`
	req, _ := http.NewRequest("POST", url+"/mcp", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	sid := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || sid == "" {
		t.Fatalf("initialize: %d, session %q", resp.StatusCode, sid)
	}
	return sid
}

// burst posts body to url from n clients at once, each on its own
// connection, and returns the answers' status codes (-1: no answer).
func burst(t *testing.T, url, body, sid string, n int) map[int]int {
	t.Helper()
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			if sid != "" {
				req.Header.Set("Mcp-Session-Id", sid)
				req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
			}
			code := -1
			resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				code = resp.StatusCode
			}
			mu.Lock()
			codes[code]++
			mu.Unlock()
		})
	}
	wg.Wait()
	return codes
}

type statusProbe struct {
	answered, failed int
	slowest          time.Duration
}

// probeStatus asks for /api/status on a fresh connection at once and then
// every 100 ms until stop is closed, each within 10 s (a liveness bound, not a speed
// one), and counts the answers.
func probeStatus(t *testing.T, d *limitDaemon, stop <-chan struct{}) statusProbe {
	var p statusProbe
	for {
		took, ok := statusWithin(d, 10*time.Second)
		if ok {
			p.answered++
			p.slowest = max(p.slowest, took)
		} else {
			p.failed++
		}
		select {
		case <-stop:
			return p
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// statusWithin asks for /api/status (with the bounds token, which a
// loopback daemon ignores) on a fresh connection.
func statusWithin(d *limitDaemon, limit time.Duration) (time.Duration, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", d.url+"/api/status", nil)
	req.Header.Set("Authorization", "Bearer "+boundsToken)
	t0 := time.Now()
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		return time.Since(t0), false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return time.Since(t0), resp.StatusCode == http.StatusOK
}

// hwmMiB is the daemon's peak RSS so far (VmHWM).
func (d *limitDaemon) hwmMiB(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, _ := strconv.Atoi(f[1])
			return kb / 1024
		}
	}
	t.Fatal("no VmHWM")
	return 0
}
