package appliance

import (
	"bufio"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"gpuhost/internal/testkit"
)

// Published figures for the reference model (Qwen3-Coder-30B-A3B, vLLM
// sleep mode, A100): cold start ≈ 47 s, wake from level 1 ≈ 2.85 s; an
// Ollama load from the page cache takes a few seconds. The benchmark runs
// them at a tenth (the ratio is what matters): 4.7 s cold, a wake that
// copies 14540 MiB at 53.5 GB/s (0.285 s), a 0.3 s Ollama load.
const (
	benchColdLoad   = "4.7s"
	benchWeightsMiB = 14540
	benchH2DGBps    = 53.5
	benchOllamaLoad = "300ms"
)

// benchWake is the simulated wake (and level-1 sleep) copy time.
func benchWake() time.Duration {
	secs := float64(benchWeightsMiB<<20) / (benchH2DGBps * 1e9)
	return time.Duration(secs * float64(time.Second))
}

func standbyBenchYAML(t testing.TB, standby bool) func(bin, state string) string {
	vport, oport := testkit.FreePort(t), testkit.FreePort(t)
	return func(bin, state string) string {
		y := testConfigYAML(bin, state, "process", "", vport, oport, benchColdLoad)
		y = strings.Replace(y, "sim: {load_time: "+benchColdLoad+", decode_tps: 500}",
			fmt.Sprintf("sim: {load_time: %s, decode_tps: 500, weights_mib: %d, h2d_gbps: %g}", benchColdLoad, benchWeightsMiB, benchH2DGBps), 1)
		y = strings.Replace(y, "sim: {load_time: 50ms, vram_mib: 6200}", "sim: {load_time: "+benchOllamaLoad+", vram_mib: 6200}", 1)
		if standby {
			y = strings.Replace(y, "    served_name: qwen3-coder\n    port: "+fmt.Sprint(vport)+"\n    vllm: {gpu_memory_utilization: 0.92,",
				"    served_name: qwen3-coder\n    standby: auto\n    port: "+fmt.Sprint(vport)+"\n    vllm: {gpu_memory_utilization: 0.92,", 1)
			y = strings.Replace(y, "    model: llama3.1:8b\n", "    model: llama3.1:8b\n    standby: unload\n", 1)
		}
		return y
	}
}

// timed switches and returns the wall time of the whole switch.
func (f *procFixture) timed(b *testing.B, profile string) time.Duration {
	t0 := time.Now()
	if evs, err := f.switchTo(b, profile); err != nil {
		b.Fatalf("switch to %s: %v\n%s", profile, err, describe(evs))
	}
	return time.Since(t0)
}

// firstToken is the time to the first streamed token of a request to the
// profile's server.
func firstToken(b *testing.B, port int, model string) time.Duration {
	body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`, model)
	t0 := time.Now()
	resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port), "application/json", strings.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: {") {
			return time.Since(t0)
		}
	}
	b.Fatalf("no token from %s: %s", model, resp.Status)
	return 0
}

// BenchmarkStandbySwitch compares, side by side in one run, the switch back
// to a vLLM profile cold (standby off: the unit is started again) and from
// standby (the sleeping server is woken), with the published timings at a
// tenth; and the round trip vLLM → Ollama → vLLM to the first token.
// `go test -run '^$' -bench StandbySwitch -benchtime 3x ./appliance/`
func BenchmarkStandbySwitch(b *testing.B) {
	cold := newProcFixtureYAML(b, standbyBenchYAML(b, false))
	warm := newProcFixtureYAML(b, standbyBenchYAML(b, true))
	for _, f := range []*procFixture{cold, warm} {
		awaitReconciled(b, f.sup)
		f.timed(b, "coder")
		f.timed(b, "llama")
		f.timed(b, "coder") // the first sleep measures the residual
	}
	var coldD, warmD, roundD []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		cold.timed(b, "llama")
		coldD = append(coldD, cold.timed(b, "coder"))
		away := warm.timed(b, "llama")
		back := warm.timed(b, "coder")
		warmD = append(warmD, back)
		roundD = append(roundD, away+back+firstToken(b, warm.cfg.Profiles["coder"].Port, "qwen3-coder"))
	}
	b.StopTimer()
	c, w, r := medianMS(coldD), medianMS(warmD), medianMS(roundD)
	wake := float64(benchWake().Microseconds()) / 1000
	load, _ := time.ParseDuration(benchOllamaLoad)
	b.ReportMetric(c, "cold_back_ms")
	b.ReportMetric(w, "standby_back_ms")
	b.ReportMetric(c/w, "speedup_x")
	b.ReportMetric(w-wake, "overhead_beyond_wake_ms")
	b.ReportMetric(r, "round_trip_ms")
	b.ReportMetric(2*wake+float64(load.Milliseconds())+100, "round_trip_budget_ms")
	b.ReportMetric(0, "ns/op")
}
