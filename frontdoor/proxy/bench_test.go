package proxy_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"gpuhost/appliance/appliancetest"
	"gpuhost/config"
	"gpuhost/frontdoor/httpapi"
	"gpuhost/frontdoor/proxy"
	"gpuhost/internal/activity"
	"gpuhost/internal/sse"
	"gpuhost/units"
)

// BenchmarkProxy measures what the proxy adds, side by side in one run:
// the same requests straight to the simulator ("direct") and through the
// daemon's echo server with the proxy ("proxy"). The simulator is unpaced
// (prefill and decode at 1e9 tok/s), so the figures are HTTP and proxy cost,
// not model time. The access log is a real text handler writing to
// io.Discard, as the daemon pays for one.
//
// apis16 sends the 16-token answer as chat, Messages and Responses in
// turn, each paired with a direct request, so that the three APIs' added
// latencies are compared under the same drift (benchAPIsInterleaved).
//
// Kinds: nonstream (16 tokens, one JSON answer), stream16 (16 SSE chunks:
// the latency of a short streamed answer), messages16 and responses16 (the
// same answer streamed as Anthropic Messages and OpenAI Responses events,
// whose usage the proxy reads from message_start/message_delta and
// response.completed) and stream1024 (sustained streaming throughput).
//
// The proxy/* runs are paired: before each proxied request the same request
// goes straight to the simulator, so machine drift (large on a shared VM)
// cancels. Reported: ns/op, p50-ms and p99-ms of the measured target's
// requests alone (to the last byte / [DONE]); tok/s for streams (tokens over
// the median request time); and for proxy/*, added-p50-ms (median of
// proxied − paired direct), added-p99-ms (p99 proxied − p99 direct) and
// tput-%direct (median direct time / median proxied time, i.e. streamed
// tokens/s through the proxy as a percentage of direct, same run).
//
// With GPUHOST_PROXY_BENCH_AUTO_SWITCH=1 the proxy runs with
// proxy.auto_switch on, so that the anti-thrash policy's per-request
// bookkeeping (policy.go: admit and release) is in the figures; with
// GPUHOST_PROXY_BENCH_ACTIVITY=1 each request is also recorded into the
// panel's Activity log (internal/activity), as the daemon does when the
// panel is on.
//
//	go test -run '^$' -bench BenchmarkProxy -benchtime 2s ./frontdoor/proxy/
func BenchmarkProxy(b *testing.B) {
	f := appliancetest.New(b, appliancetest.Options{Activate: "coder", Hook: func(c *config.Config) {
		c.Profiles["coder"].Sim.PrefillTPS = 1e9
		c.Profiles["coder"].Sim.DecodeTPS = 1e9
		c.Proxy.AutoSwitch = os.Getenv("GPUHOST_PROXY_BENCH_AUTO_SWITCH") == "1"
	}})
	api, err := httpapi.New(f.Sup, f.Doctor, f.Log)
	if err != nil {
		b.Fatal(err)
	}
	p := proxy.New(f.Sup, f.Cfg.Proxy, func() map[string]*units.Profile { return f.Cfg.Profiles },
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if os.Getenv("GPUHOST_PROXY_BENCH_ACTIVITY") == "1" {
		p.SetRecorder(activity.NewLog(activity.DefaultLogSize))
	}
	p.Register(api)
	srv := httptest.NewServer(api)
	defer srv.Close()
	defer p.Close()

	msgs := `"messages":[{"role":"system","content":"You are a helpful coding assistant."},{"role":"user","content":"Write a function that reverses a string."}]`
	bodies := map[string][]byte{
		"nonstream":  []byte(`{"model":"qwen3-coder",` + msgs + `,"max_tokens":16,"ignore_eos":true}`),
		"stream16":   []byte(`{"model":"qwen3-coder",` + msgs + `,"max_tokens":16,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}`),
		"stream1024": []byte(`{"model":"qwen3-coder",` + msgs + `,"max_tokens":1024,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}`),
		// The same 16-token answer in the agent APIs, for their added
		// latency beside chat's (stream16) in the same run.
		"messages16":  []byte(`{"model":"qwen3-coder","system":"You are a helpful coding assistant.","messages":[{"role":"user","content":"Write a function that reverses a string."}],"max_tokens":16,"stream":true}`),
		"responses16": []byte(`{"model":"qwen3-coder","instructions":"You are a helpful coding assistant.","input":"Write a function that reverses a string.","max_output_tokens":16,"stream":true}`),
	}
	paths := map[string]string{"messages16": "/v1/messages", "responses16": "/v1/responses"}
	targets := []struct{ name, url string }{
		{"direct", "http://127.0.0.1:" + strconv.Itoa(f.Cfg.Profiles["coder"].Port)},
		{"proxy", srv.URL},
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4, DisableCompression: true}}
	b.Run("apis16", func(b *testing.B) { benchAPIsInterleaved(b, client, targets[0].url, srv.URL, bodies, paths) })
	for _, tgt := range targets {
		b.Run(tgt.name, func(b *testing.B) {
			for _, kind := range []string{"nonstream", "stream16", "messages16", "responses16", "stream1024"} {
				b.Run(kind, func(b *testing.B) {
					body := bodies[kind]
					stream := kind != "nonstream"
					tokens := map[string]int{"stream16": 16, "messages16": 16, "responses16": 16, "stream1024": 1024}[kind]
					path := "/v1/chat/completions"
					if p, ok := paths[kind]; ok {
						path = p
					}
					url := tgt.url + path
					directURL := targets[0].url + path
					paired := tgt.name != "direct"
					for range 20 { // warm connections and caches
						benchRequest(b, client, url, body, stream)
						benchRequest(b, client, directURL, body, stream)
					}
					lat := make([]time.Duration, 0, b.N)
					ref := make([]time.Duration, 0, b.N) // paired direct requests
					b.ResetTimer()
					for range b.N {
						if paired {
							t0 := time.Now()
							benchRequest(b, client, directURL, body, stream)
							ref = append(ref, time.Since(t0))
						}
						t0 := time.Now()
						benchRequest(b, client, url, body, stream)
						lat = append(lat, time.Since(t0))
					}
					b.StopTimer()
					sum := func(ds []time.Duration) (s time.Duration) {
						for _, d := range ds {
							s += d
						}
						return s
					}
					b.ReportMetric(float64(sum(lat).Nanoseconds())/float64(b.N), "ns/op")
					var added []time.Duration
					if paired {
						added = make([]time.Duration, b.N)
						for i := range added {
							added[i] = lat[i] - ref[i]
						}
						slices.Sort(added)
					}
					slices.Sort(lat)
					slices.Sort(ref)
					b.ReportMetric(msOf(pct(lat, 50)), "p50-ms")
					b.ReportMetric(msOf(pct(lat, 99)), "p99-ms")
					if stream {
						// Medians, not means: a shared VM's stalls of hundreds of
						// ms would otherwise decide the figure.
						b.ReportMetric(float64(tokens)/pct(lat, 50).Seconds(), "tok/s")
					}
					if !paired {
						return
					}
					b.ReportMetric(msOf(pct(added, 50)), "added-p50-ms")
					b.ReportMetric(msOf(pct(lat, 99)-pct(ref, 99)), "added-p99-ms")
					if stream {
						b.ReportMetric(100*pct(ref, 50).Seconds()/pct(lat, 50).Seconds(), "tput-%direct")
					}
				})
			}
		})
	}
}

// benchAPIsInterleaved is the added latency of each API beside chat's,
// measured so that the machine's drift falls on all of them alike: every
// iteration sends the same 16-token answer as chat, Messages and Responses
// (in an order that rotates), each as a pair of a direct request and a
// proxied one. It reports each API's added-p50 (median of proxied − its
// paired direct) and the two agent APIs' added-p50 as a percentage of
// chat's (messages-%chat, responses-%chat: ≤ 110 is "no more than 10 %
// above chat").
func benchAPIsInterleaved(b *testing.B, client *http.Client, direct, proxied string, bodies map[string][]byte, paths map[string]string) {
	kinds := []string{"stream16", "messages16", "responses16"}
	path := func(kind string) string {
		if p, ok := paths[kind]; ok {
			return p
		}
		return "/v1/chat/completions"
	}
	for range 20 { // warm connections and caches
		for _, k := range kinds {
			benchRequest(b, client, direct+path(k), bodies[k], true)
			benchRequest(b, client, proxied+path(k), bodies[k], true)
		}
	}
	added := map[string][]time.Duration{}
	b.ResetTimer()
	for i := range b.N {
		for j := range kinds {
			k := kinds[(i+j)%len(kinds)]
			t0 := time.Now()
			benchRequest(b, client, direct+path(k), bodies[k], true)
			t1 := time.Now()
			benchRequest(b, client, proxied+path(k), bodies[k], true)
			added[k] = append(added[k], time.Since(t1)-t1.Sub(t0))
		}
	}
	b.StopTimer()
	p50 := map[string]time.Duration{}
	for _, k := range kinds {
		slices.Sort(added[k])
		p50[k] = pct(added[k], 50)
	}
	b.ReportMetric(msOf(p50["stream16"]), "chat-added-p50-ms")
	b.ReportMetric(msOf(p50["messages16"]), "messages-added-p50-ms")
	b.ReportMetric(msOf(p50["responses16"]), "responses-added-p50-ms")
	if p50["stream16"] > 0 {
		b.ReportMetric(100*p50["messages16"].Seconds()/p50["stream16"].Seconds(), "messages-%chat")
		b.ReportMetric(100*p50["responses16"].Seconds()/p50["stream16"].Seconds(), "responses-%chat")
	}
}

// pct is the p-th percentile of sorted durations.
func pct(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, len(sorted)*p/100)]
}

// benchRequest sends one request and reads the whole answer; a stream must
// end with its API's end ([DONE], message_stop, response.completed).
func benchRequest(b *testing.B, client *http.Client, url string, body []byte, stream bool) {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		data, _ := io.ReadAll(resp.Body)
		b.Fatalf("status %d: %s", resp.StatusCode, data)
	}
	if !stream {
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			b.Fatal(err)
		}
		return
	}
	rd := sse.NewReader(resp.Body, 0)
	done := false
	for {
		e, err := rd.Next()
		done = done || string(e.Data) == "[DONE]" || e.Type == "message_stop" || e.Type == "response.completed" || e.Type == "response.incomplete"
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, sse.ErrIncomplete) || !done {
				b.Fatalf("stream ended without its end event: %v", err)
			}
			return
		}
	}
}

func msOf(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }
