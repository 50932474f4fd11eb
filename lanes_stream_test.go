package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/internal/testkit"
)

// TestDemoGPUsStreamThroughSwitches is the two-GPU demo as a coding agent
// meets it: a stream from llama3-8b on GPU 1 keeps flowing while GPU 0
// switches twice (qwen3-coder → gemma3-27b → qwen3-coder). The stream is
// never held: chunks arrive while each switch runs, and it ends with a
// finish reason and [DONE]. The largest gap between chunks is logged, not
// asserted (it is the machine's load as much as gpuhost's).
func TestDemoGPUsStreamThroughSwitches(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo")
	}
	url, _, console := startDemo(t, "--gpus", "2")
	c := api.NewClient(url, "")
	follow := func(profile string) (time.Time, time.Time) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		var first, last time.Time
		err := c.SwitchAndFollow(ctx, api.SwitchRequest{Profile: profile}, func(ev api.Event) {
			if ev.Kind == api.EventStep && first.IsZero() {
				first = ev.Time
			}
			if ev.Kind == api.EventSwitch && ev.Status == api.StatusDone {
				last = ev.Time
			}
		})
		if err != nil {
			t.Fatalf("switch to %s: %v\n%s", profile, err, console())
		}
		return first, last
	}
	follow("llama3-8b")
	// 1,500 tokens at the simulated 120 tokens/s: about 12 s, longer than
	// two switches of GPU 0 (ignore_eos: the simulator's answer would end
	// after 64 tokens).

	body, _ := json.Marshal(map[string]any{"model": "llama3.1:8b", "stream": true, "max_tokens": 1500, "ignore_eos": true,
		"messages": []map[string]string{{"role": "user", "content": "write a long story"}}})
	req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: %s", resp.Status)
	}
	type chunk struct {
		at   time.Time
		line string
	}
	chunks := make(chan chunk, 1<<16)
	go func() {
		defer close(chunks)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if l := sc.Text(); strings.HasPrefix(l, "data: ") {
				chunks <- chunk{time.Now(), l}
			}
		}
	}()
	// The stream runs; GPU 0 switches twice meanwhile.
	first := <-chunks
	s1, e1 := follow("gemma3-27b")
	s2, e2 := follow("qwen3-coder")
	all := []chunk{first}
	for ch := range chunks {
		all = append(all, ch)
	}
	if len(all) < 3 || all[len(all)-1].line != "data: [DONE]" {
		t.Fatalf("the stream did not end with [DONE] (%d chunks; last %q)", len(all), all[len(all)-1].line)
	}
	finished := false
	for _, ch := range all {
		finished = finished || strings.Contains(ch.line, `"finish_reason":"stop"`) || strings.Contains(ch.line, `"finish_reason":"length"`)
	}
	if !finished {
		t.Fatal("the stream ended without a finish reason")
	}
	during := func(a, b time.Time) int {
		n := 0
		for _, ch := range all {
			if !ch.at.Before(a) && !ch.at.After(b) {
				n++
			}
		}
		return n
	}
	n1, n2 := during(s1, e1), during(s2, e2)
	if n1 == 0 || n2 == 0 {
		t.Fatalf("GPU 1's stream was held while GPU 0 switched: %d chunks during the first switch (%s), %d during the second (%s); stream %s–%s",
			n1, e1.Sub(s1), n2, e2.Sub(s2), all[0].at.Format(time.StampMilli), all[len(all)-1].at.Format(time.StampMilli))
	}
	var gap time.Duration
	for i := 1; i < len(all); i++ {
		if all[i].at.After(s1) && all[i].at.Before(e2) {
			gap = max(gap, all[i].at.Sub(all[i-1].at))
		}
	}
	t.Logf("GPU 1 stream: %d chunks; %d during the switch to gemma3-27b (%s), %d during the switch back to qwen3-coder (%s); largest gap between chunks while GPU 0 switched: %s",
		len(all), n1, e1.Sub(s1).Round(time.Millisecond), n2, e2.Sub(s2).Round(time.Millisecond), gap.Round(time.Millisecond))
	st, err := c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range st.State.Lanes {
		t.Logf("lane %s: %s", l.Lane, api.StatusLine(l, nil))
	}
}

// TestAutoSwitchPerLane: with proxy.auto_switch on a box of two GPUs, a
// request for a model that does not serve switches only its lane: coder
// (GPU 0) keeps serving while a request for coder1 starts GPU 1, and a
// request for the tensor-parallel coder-tp takes both GPUs from them. Every
// request is answered.
func TestAutoSwitchPerLane(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the daemon")
	}
	p1, ptp := testkit.FreePort(t), testkit.FreePort(t)
	d := startServeEdited(t, binPath, "127.0.0.1", "", func(y string) string {
		y = strings.Replace(y, "gpu:\n  backend: sim\n", "gpu:\n  backend: sim\n  sim:\n    devices: [{}, {}]\n", 1)
		for _, p := range []struct {
			name string
			port int
			gpus string
		}{{"coder1", p1, "[1]"}, {"coder-tp", ptp, "[0, 1]"}} {
			y += fmt.Sprintf("  %s:\n    backend: vllm\n    model: Qwen/Qwen3-Coder-30B-A3B-Instruct\n    served_name: %s\n    port: %d\n    gpus: %s\n"+
				"    vllm: {gpu_memory_utilization: 0.92, max_num_seqs: 32, enable_auto_tool_choice: true, tool_call_parser: qwen3_xml}\n    sim: {load_time: 50ms}\n",
				p.name, p.name, p.port, p.gpus)
		}
		return y + "proxy:\n  auto_switch: true\n  min_residency: 0s\n"
	}, "50ms")
	c := d.client()
	ask := func(model string) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 8, "messages": []map[string]string{{"role": "user", "content": "hi"}}})
		resp, err := http.Post(d.url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("%s: %s %s", model, resp.Status, b)
		}
	}
	lanes := func() map[string]string {
		st, err := c.Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, l := range st.State.Lanes {
			out[l.Lane] = api.StatusLine(l, nil)
		}
		return out
	}
	ask("qwen3-coder")
	ask("coder1")
	got := lanes()
	if got["GPU 0"] != "active: coder (vllm)" || got["GPU 1"] != "active: coder1 (vllm)" {
		t.Fatalf("after requests for qwen3-coder and coder1: %v; want both lanes serving", got)
	}
	ask("qwen3-coder") // still served on GPU 0: no switch
	ask("coder-tp")
	got = lanes()
	if got["GPU 0+1"] != "active: coder-tp (vllm)" || got["GPU 0"] != "idle" || got["GPU 1"] != "idle" {
		t.Fatalf("after a request for coder-tp: %v; want GPU 0+1 serving, GPU 0 and GPU 1 idle", got)
	}
}
