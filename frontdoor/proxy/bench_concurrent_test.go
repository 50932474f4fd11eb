package proxy_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"gpuhost/appliance/appliancetest"
	"gpuhost/config"
	"gpuhost/frontdoor/proxy"
	"gpuhost/units"
)

// fakeStreams are 16-chunk answers of each API, as a fast upstream sends
// them (usage where each API puts it), and a small whole chat answer.
func fakeStreams() map[string][]byte {
	var chat, long, msgs, resp bytes.Buffer
	msgs.WriteString("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"served\",\"usage\":{\"input_tokens\":20,\"output_tokens\":0}}}\n\n")
	msgs.WriteString("event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n")
	resp.WriteString("event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"r\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[],\"usage\":null}}\n\n")
	for i := 0; i < 16; i++ {
		fmt.Fprintf(&chat, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"served\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" word%d\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n", i)
		fmt.Fprintf(&msgs, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" word%d\"}}\n\n", i)
		fmt.Fprintf(&resp, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":%d,\"item_id\":\"m\",\"output_index\":0,\"content_index\":0,\"delta\":\" word%d\"}\n\n", i+1, i)
	}
	for i := 0; i < 256; i++ {
		fmt.Fprintf(&long, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"served\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" word%d\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n", i)
	}
	chat.WriteString("data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"served\",\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":16,\"total_tokens\":36}}\n\ndata: [DONE]\n\n")
	long.WriteString("data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"served\",\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":256,\"total_tokens\":276}}\n\ndata: [DONE]\n\n")
	msgs.WriteString("event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"},\"usage\":{\"output_tokens\":16}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	resp.WriteString("event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":17,\"response\":{\"id\":\"r\",\"object\":\"response\",\"status\":\"completed\",\"output\":[],\"usage\":{\"input_tokens\":20,\"output_tokens\":16,\"total_tokens\":36}}}\n\n")
	return map[string][]byte{"/v1/chat/completions": chat.Bytes(), "/v1/chat/completions?long": long.Bytes(), "/v1/messages": msgs.Bytes(), "/v1/responses": resp.Bytes()}
}

// BenchmarkProxyConcurrent: throughput through the proxy (usage parsing
// of each API included) beside the same fake upstream directly, in one
// run: 16-chunk streams of chat, Messages and Responses at 1 and 32
// concurrent clients (chunks/s, and through-%direct), a 256-chunk chat
// stream at 32 (an answer of realistic length, where the per-request cost
// is spread over many tokens), and whole chat answers at 64 (req/s). The
// upstream writes each chunk with a flush, as a backend does; it does no
// work, so the figures are the proxy's cost.
//
// Client, proxy and upstream share the machine's cores, so at 32 and 64
// clients the run is CPU-bound and the ratio is the ratio of CPU spent per
// request: each side also reports the process's CPU time (user + system)
// per request (cpu-us/req), whose difference is what the proxy's hop costs.
// Both sides use the same client (one pool, keep-alive); proxy-dials counts
// the connections the proxy opened to the upstream during its run (at most
// the concurrency when its pool keeps them; more would be a new connection
// per request). Two other hops run beside them, as yardsticks: a bare
// httputil.ReverseProxy with the same transport settings (no routing, usage
// tap, log or hold), the floor of what any net/http proxy costs
// (bare-%direct, bare-cpu-us/req), and a TCP byte relay (relay-%direct),
// which parses nothing: the ceiling of any proxy on the same machine.
//
//	go test -run '^$' -bench BenchmarkProxyConcurrent -benchtime 3000x -count 2 ./frontdoor/proxy/
//
// BENCH_ONLY=direct|relay|bare|proxy runs one side alone and reports only
// its CPU per request (and the kernel's part of it, sys-us/req), for a
// profile or a syscall count of that side:
//
//	BENCH_ONLY=proxy go test -run '^$' -bench 'BenchmarkProxyConcurrent/stream16_v1_chat_completions/c32' -benchtime 5000x -cpuprofile cpu.prof ./frontdoor/proxy/
func BenchmarkProxyConcurrent(b *testing.B) {
	up, upConns := fakeUpstream()
	defer up.Close()
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(up.URL, "http://"))
	n, _ := strconv.Atoi(port)
	prof := &units.Profile{Name: "p", Backend: units.VLLM, Model: "org/model", ServedName: "served", Port: n}
	profiles := map[string]*units.Profile{prof.Name: prof} // one map, as the daemon's config holds
	p := proxy.New(appliancetest.Fixed{Profile: prof}, config.ProxyConfig{}, func() map[string]*units.Profile { return profiles },
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	e := echo.New()
	p.Register(e)
	srv := httptest.NewServer(e)
	defer srv.Close()
	defer p.Close()

	upURL, _ := url.Parse(up.URL)
	bare := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite:    func(pr *httputil.ProxyRequest) { pr.SetURL(upURL) },
		Transport:  &http.Transport{MaxIdleConns: 512, MaxIdleConnsPerHost: 256, DisableCompression: true},
		ErrorLog:   log.New(io.Discard, "", 0), // as quiet as gpuhost's at its default level
		BufferPool: benchBuffers{},             // gpuhost pools its copy buffers too
	})
	defer bare.Close()
	relay := tcpRelay(b, upURL.Host)
	defer relay.Close()

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128, MaxConnsPerHost: 0, DisableCompression: true}}
	body := []byte(`{"model":"served","stream":true,"max_tokens":16}`)
	type result struct{ rate, cpuPerReq, sysPerReq, dials float64 }
	run := func(b *testing.B, url string, conc int, header string) result {
		var next atomic.Int64
		var wg sync.WaitGroup
		dials0, cpu0, sys0 := upConns.Load(), cpuTime(b), sysTime(b)
		t0 := time.Now()
		for range conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= int64(b.N) {
					req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, url, bytes.NewReader(body))
					req.Header.Set("Content-Type", "application/json")
					if header != "" {
						req.Header.Set("X-Whole", "1")
					}
					resp, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
		}
		wg.Wait()
		el := time.Since(t0)
		return result{rate: float64(b.N) / el.Seconds(), cpuPerReq: float64((cpuTime(b) - cpu0).Microseconds()) / float64(b.N),
			sysPerReq: float64((sysTime(b) - sys0).Microseconds()) / float64(b.N),
			dials:     float64(upConns.Load() - dials0)}
	}
	// compare runs the same requests straight to the upstream, through the
	// bare reverse proxy and through gpuhost's proxy, one after the other.
	compare := func(b *testing.B, path string, conc int, header string, scale float64, unit string) {
		if only := os.Getenv("BENCH_ONLY"); only != "" {
			u, ok := map[string]string{"direct": up.URL, "bare": bare.URL, "proxy": srv.URL, "relay": "http://" + relay.Addr().String()}[only]
			if !ok {
				b.Fatalf("BENCH_ONLY=%q: want direct, relay, bare or proxy", only)
			}
			r := run(b, u+path, conc, header)
			b.ReportMetric(r.cpuPerReq, only+"-cpu-us/req")
			b.ReportMetric(r.sysPerReq, only+"-sys-us/req")
			return
		}
		direct := run(b, up.URL+path, conc, header)
		floor := run(b, "http://"+relay.Addr().String()+path, conc, header)
		hop := run(b, bare.URL+path, conc, header)
		via := run(b, srv.URL+path, conc, header)
		b.ReportMetric(scale*direct.rate, "direct-"+unit)
		b.ReportMetric(scale*via.rate, "proxy-"+unit)
		b.ReportMetric(100*via.rate/direct.rate, "%direct")
		b.ReportMetric(100*hop.rate/direct.rate, "bare-%direct")
		b.ReportMetric(100*floor.rate/direct.rate, "relay-%direct")
		b.ReportMetric(floor.cpuPerReq, "relay-cpu-us/req")
		b.ReportMetric(direct.cpuPerReq, "direct-cpu-us/req")
		b.ReportMetric(hop.cpuPerReq, "bare-cpu-us/req")
		b.ReportMetric(via.cpuPerReq, "proxy-cpu-us/req")
		b.ReportMetric(via.dials, "proxy-dials")
	}
	for _, path := range []string{"/v1/chat/completions", "/v1/messages", "/v1/responses"} {
		for _, conc := range []int{1, 32} {
			b.Run(fmt.Sprintf("stream16%s/c%d", strings.ReplaceAll(path, "/", "_"), conc), func(b *testing.B) {
				compare(b, path, conc, "", 16, "chunks/s")
			})
		}
	}
	b.Run("stream256_v1_chat_completions/c32", func(b *testing.B) {
		compare(b, "/v1/chat/completions?long", 32, "", 256, "chunks/s")
	})
	b.Run("whole/c64", func(b *testing.B) {
		compare(b, "/v1/chat/completions", 64, "whole", 1, "req/s")
	})
}

// fakeUpstream serves fakeStreams by path, one write and flush per event,
// and the whole chat answer for requests with X-Whole: 1; it counts the
// connections it accepts.
func fakeUpstream() (*httptest.Server, *atomic.Int64) {
	streams := fakeStreams()
	whole := []byte(`{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":20,"completion_tokens":1,"total_tokens":21}}`)
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if strings.Contains(r.URL.RawQuery, "whole") || r.Header.Get("X-Whole") == "1" {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(whole)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		key := r.URL.Path
		if r.URL.RawQuery == "long" {
			key += "?long"
		}
		body := streams[key]
		for len(body) > 0 { // one write and flush per event
			i := bytes.Index(body, []byte("\n\n")) + 2
			_, _ = w.Write(body[:i])
			_ = rc.Flush()
			body = body[i:]
		}
	}))
	upConns := new(atomic.Int64) // connections the upstream accepted
	up.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			upConns.Add(1)
		}
	}
	up.Start()
	return up, upConns
}

// tcpRelay is the cheapest hop there is: a byte relay at the TCP level
// (no HTTP parsing; io.Copy between two TCP connections splices inside the
// kernel on Linux), one upstream connection per client connection. Its
// %direct is the ceiling for any proxy on the same machine.
func tcpRelay(b *testing.B, upstream string) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatalf("relay listen: %v", err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("tcp", upstream)
				if err != nil {
					return
				}
				defer u.Close()
				go func() { _, _ = io.Copy(u, c); u.(*net.TCPConn).CloseWrite() }()
				_, _ = io.Copy(c, u)
			}()
		}
	}()
	return ln
}

// benchBuffers pools the bare reverse proxy's 32 KiB copy buffers, as
// gpuhost's proxy does, so that the bare hop does not allocate one per
// request.
type benchBuffers struct{}

var benchBufferPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (benchBuffers) Get() []byte  { return *(benchBufferPool.Get().(*[]byte)) }
func (benchBuffers) Put(b []byte) { benchBufferPool.Put(&b) }

// cpuTime is the CPU time (user and system) the test process has used.
func cpuTime(b *testing.B) time.Duration {
	ru := rusage(b)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// sysTime is the part of cpuTime spent in the kernel (the system calls,
// and on loopback the receiving side's network work too).
func sysTime(b *testing.B) time.Duration {
	ru := rusage(b)
	return time.Duration(ru.Stime.Nano())
}

func rusage(b *testing.B) syscall.Rusage {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return ru
}
