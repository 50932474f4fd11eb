package appliance

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"gpuhost/backend"
	"gpuhost/simulator"
	"gpuhost/units"
)

// startDemoSim runs a simulator in the test process with o (the demo's
// figures) and returns its port.
func startDemoSim(b *testing.B, o simulator.Options) int {
	b.Helper()
	o.Addr = "127.0.0.1:0"
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	ready := make(chan string, 1)
	o.Ready = func(addr string) { ready <- addr }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- simulator.Run(ctx, o) }()
	b.Cleanup(func() { cancel(); <-done })
	select {
	case addr := <-ready:
		_, port, _ := net.SplitHostPort(addr)
		p, _ := strconv.Atoi(port)
		return p
	case err := <-done:
		b.Fatalf("simulator: %v", err)
	}
	return 0
}

// BenchmarkWakeCheck measures, side by side in one run on the demo's
// figures (config/demo.yaml), the wake of each standby profile and the
// verified-wake check that follows it: qwen3-coder (vLLM, level 1: 14540
// MiB of weights copied back at 100 GB/s, decode 150 tokens/s, prefill
// 2545, tool parser qwen3_xml: known prompt and tool round trip side by
// side) and llama3-8b (Ollama: an 800 ms load, decode 120 tokens/s, no
// tool round trip). check/wake_% is the check's cost against the wake.
func BenchmarkWakeCheck(b *testing.B) {
	client := backend.NewClient()
	post := func(url string) {
		resp, err := client.Post(url, "", nil)
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("POST %s: %s", url, resp.Status)
		}
	}
	for _, tools := range []bool{true, false} {
		name := "coder-vllm-level1"
		if !tools {
			name += "-known-prompt-only"
		}
		b.Run(name, func(b *testing.B) { benchVLLMWake(b, client, post, tools) })
	}
	b.Run("llama-ollama-unload", func(b *testing.B) {
		port := startDemoSim(b, simulator.Options{Flavor: simulator.FlavorOllama, Model: "llama3.1:8b",
			PrefillTPS: 4000, DecodeTPS: 120, VRAMMiB: 6200, LoadTime: 800 * time.Millisecond})
		p := &units.Profile{Name: "llama", Backend: units.Ollama, Model: "llama3.1:8b", Port: port}
		s := &Supervisor{client: client}
		o := backend.NewOllama(*p, client, "http://127.0.0.1:"+strconv.Itoa(port))
		var wake, check time.Duration
		for b.Loop() {
			ctx := context.Background()
			if _, err := o.Sleep(ctx, 0); err != nil {
				b.Fatal(err)
			}
			t0 := time.Now()
			if _, err := o.Wake(ctx, 0); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			if _, err := s.observe(ctx, p, false, wakeCheckTokens); err != nil {
				b.Fatal(err)
			}
			wake, check = wake+t1.Sub(t0), check+time.Since(t1)
		}
		report(b, wake, check)
	})
}

func report(b *testing.B, wake, check time.Duration) {
	n := float64(b.N)
	b.ReportMetric(float64(wake.Milliseconds())/n, "wake_ms")
	b.ReportMetric(float64(check.Microseconds())/1000/n, "check_ms")
	b.ReportMetric(100*check.Seconds()/wake.Seconds(), "check/wake_%")
}

// benchVLLMWake is one vLLM sub-benchmark: tools says whether the check
// runs the tool round trip beside the known prompt.
func benchVLLMWake(b *testing.B, client *http.Client, post func(string), tools bool) {
	{
		port := startDemoSim(b, simulator.Options{Flavor: simulator.FlavorVLLM, Model: "Qwen/Qwen3-Coder-30B-A3B-Instruct",
			ServedName: "qwen3-coder", PrefillTPS: 2545, DecodeTPS: 150, WeightsMiB: 14540, H2DGBps: 100,
			DevMode: true, EnableSleepMode: true, EnableAutoToolChoice: true, ToolCallParser: "qwen3_xml"})
		p := &units.Profile{Name: "coder", Backend: units.VLLM, ServedName: "qwen3-coder", Port: port}
		s := &Supervisor{client: client}
		base := "http://127.0.0.1:" + strconv.Itoa(port)
		var wake, check time.Duration
		for b.Loop() {
			post(base + "/sleep?level=1")
			t0 := time.Now()
			post(base + "/wake_up")
			t1 := time.Now()
			obs, err := s.observe(context.Background(), p, tools, wakeCheckTokens)
			t2 := time.Now()
			if err != nil || tools && !obs.toolsOK {
				b.Fatalf("check: %v, tools %q", err, obs.tools)
			}
			wake, check = wake+t1.Sub(t0), check+t2.Sub(t1)
		}
		report(b, wake, check)
	}
}
