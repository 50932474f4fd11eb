package proxy_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gpuhost/appliance/appliancetest"
	"gpuhost/internal/testkit"
)

// soakDuration is GPUHOST_PROXY_SOAK (a Go duration, at most 60 s), 20 s by
// default and 3 s with -short.
func soakDuration(t *testing.T) time.Duration {
	d := 20 * time.Second
	if testing.Short() {
		d = 3 * time.Second
	}
	if v := os.Getenv("GPUHOST_PROXY_SOAK"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil || d <= 0 || d > time.Minute {
			t.Fatalf("GPUHOST_PROXY_SOAK=%q: want a duration up to 60s", v)
		}
	}
	return d
}

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return len(ents)
}

// TestSoak runs concurrent streams (complete, cut off by the client, not
// streamed, refused) for a while and checks that goroutines and open files
// come back to where they were: nothing leaks per request.
func TestSoak(t *testing.T) {
	e := newEnv(t, appliancetest.Options{Activate: "coder"})
	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	defer tr.CloseIdleConnections()
	bodies := [][]byte{
		chatBody(t, "qwen3-coder", true, 24, nil),
		chatBody(t, "qwen3-coder", true, 400, map[string]any{"ignore_eos": true}), // cut off after the first read
		chatBody(t, "qwen3-coder", false, 8, nil),
		[]byte(`{"model":"nope","messages":[]}`),
		[]byte(`{"model":"qwen3-coder","messages":[`),
	}
	wantStatus := []int{200, 200, 200, 404, 400}
	var counts [5]atomic.Int64
	var failures atomic.Int64
	var firstErr atomic.Value
	work := func(ctx context.Context, worker int) {
		for i := worker; ctx.Err() == nil; i++ {
			kind := i % len(bodies)
			rctx, cancel := context.WithCancel(context.Background())
			err := func() error {
				defer cancel()
				req, _ := http.NewRequestWithContext(rctx, http.MethodPost, e.url+"/v1/chat/completions", bytesReader(bodies[kind]))
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					return err
				}
				defer resp.Body.Close()
				if resp.StatusCode != wantStatus[kind] {
					return fmt.Errorf("kind %d: status %d", kind, resp.StatusCode)
				}
				if kind == 1 {
					_, err := resp.Body.Read(make([]byte, 256))
					cancel() // the client walks away mid-stream
					return err
				}
				if kind == 0 {
					s, err := parseStream(resp, nil)
					if err == nil && !s.done {
						err = fmt.Errorf("stream without [DONE]")
					}
					return err
				}
				_, err = io.Copy(io.Discard, resp.Body)
				return err
			}()
			if err != nil {
				failures.Add(1)
				firstErr.CompareAndSwap(nil, err.Error())
			}
			counts[kind].Add(1)
		}
	}
	run := func(d time.Duration) {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		var wg sync.WaitGroup
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func() { defer wg.Done(); work(ctx, w) }()
		}
		wg.Wait()
	}
	settle := func() (int, int) {
		tr.CloseIdleConnections()
		e.p.Close()
		time.Sleep(100 * time.Millisecond) // closed connections' goroutines exit
		runtime.GC()
		return runtime.NumGoroutine(), openFDs(t)
	}

	run(time.Second) // warm up: pools, the simulator's connections, lazily started goroutines
	g0, fd0 := settle()
	d := soakDuration(t)
	run(d)
	const tolerance = 8
	var g1, fd1 int
	deadline := time.Now().Add(5 * time.Second)
	for {
		g1, fd1 = settle()
		if g1 <= g0+tolerance && fd1 <= fd0+tolerance || time.Now().After(deadline) {
			break
		}
	}
	total := int64(0)
	for i := range counts {
		total += counts[i].Load()
	}
	t.Logf("soak %s: %d requests (%d complete streams, %d cut off, %d whole, %d 404, %d 400); goroutines %d → %d, fds %d → %d",
		d, total, counts[0].Load(), counts[1].Load(), counts[2].Load(), counts[3].Load(), counts[4].Load(), g0, g1, fd0, fd1)
	if f := failures.Load(); f > 0 {
		t.Fatalf("%d of %d requests failed; first: %v", f, total, firstErr.Load())
	}
	if counts[1].Load() == 0 || counts[0].Load() == 0 {
		t.Fatal("the soak ran no streams")
	}
	if g1 > g0+tolerance {
		buf := make([]byte, 1<<20)
		t.Fatalf("goroutines grew from %d to %d:\n%s", g0, g1, buf[:runtime.Stack(buf, true)])
	}
	if fd1 > fd0+tolerance {
		t.Fatalf("open files grew from %d to %d", fd0, fd1)
	}
	testkit.Eventually(t, 10*time.Second, func() bool {
		return metric(t, e.backendURL("coder"), "vllm:num_requests_running", "") == 0
	}, "no generation left running on the backend")
}
