package appliance

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/internal/testkit"
	"gpuhost/units"
)

func TestJudgeToolReply(t *testing.T) {
	for _, tt := range []struct {
		name string
		r    toolReply
		want units.Severity
		msg  string
	}{
		{"structured", toolReply{names: []string{doctorProbeTool}, args: []string{`{"status":"ok"}`}}, units.SeverityOK, "structured tool_calls"},
		{"arguments not JSON", toolReply{names: []string{doctorProbeTool}, args: []string{`{"status": "ok`}}, units.SeverityFail, "not a JSON object"},
		{"arguments a string", toolReply{names: []string{doctorProbeTool}, args: []string{`"ok"`}}, units.SeverityFail, "not a JSON object"},
		{"other tool", toolReply{names: []string{"bash"}, args: []string{`{}`}}, units.SeverityFail, `called "bash"`},
		{"xml in content", toolReply{content: "<tool_call>\n<function=gpuhost_doctor_probe>\n</function></tool_call>"}, units.SeverityFail, "XML text in content"},
		{"json in content", toolReply{content: `{"name": "gpuhost_doctor_probe", "arguments": {"status": "ok"}}`}, units.SeverityFail, "JSON text in content"},
		{"empty", toolReply{content: "  \n"}, units.SeverityFail, "empty reply"},
		{"prose", toolReply{content: "Sure, the status is ok."}, units.SeverityFail, "without calling the tool"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sev, msg := judgeToolReply(tt.r)
			if sev != tt.want || !strings.Contains(msg, tt.msg) {
				t.Errorf("%s: %q, want %s with %q", sev, msg, tt.want, tt.msg)
			}
		})
	}
}

func TestErrorMessage(t *testing.T) {
	for body, want := range map[string]string{
		`{"error":{"message":"tiny:latest does not support tools","type":"api_error"}}`: "tiny:latest does not support tools",
		`{"error":"model not found"}`: "model not found",
		`{"object":"error","message":"\"auto\" tool choice requires --enable-auto-tool-choice","code":400}`: `"auto" tool choice requires --enable-auto-tool-choice`,
		`Internal Server Error`: "Internal Server Error",
	} {
		if got := errorMessage([]byte(body)); got != want {
			t.Errorf("%s: %q, want %q", body, got, want)
		}
	}
}

// agentCheck runs the doctor and returns one check of the active profile.
func agentCheck(t *testing.T, f *procFixture, id, profile string) api.DoctorCheck {
	t.Helper()
	rep := (&Doctor{Cfg: f.cfg, GPU: f.gpu, Units: f.sup.units}).Run(context.Background())
	c, ok := checkByID(rep, id, profile)
	if !ok {
		t.Fatalf("no %s check for %s in %+v", id, profile, rep.Checks)
	}
	return c
}

// TestDoctorAgentChecks: endpoint.tool_calls and endpoint.context pass on
// the simulator (vLLM and Ollama) and fail when the backend answers tool
// calls as text, serves another context, or has no tool calling.
func TestDoctorAgentChecks(t *testing.T) {
	f := newProcFixture(t, "10ms")
	for _, tt := range []struct{ profile, parser, ctx string }{
		{"coder", "parser qwen3_xml (argv)", "serves 32768 tokens of context, as the profile says"},
		{"llama", "Ollama", "serves 4096 tokens of context, as the profile says"},
	} {
		if _, err := f.switchTo(t, tt.profile); err != nil {
			t.Fatal(err)
		}
		c := agentCheck(t, f, "endpoint.tool_calls", tt.profile)
		if c.Severity != units.SeverityOK || !strings.Contains(c.Message, tt.parser) ||
			!strings.Contains(c.Message, "whole and streamed: structured tool_calls "+doctorProbeTool+"({\"status\":") {
			t.Errorf("%s: endpoint.tool_calls %+v", tt.profile, c)
		}
		if c := agentCheck(t, f, "endpoint.context", tt.profile); c.Severity != units.SeverityOK || !strings.Contains(c.Message, tt.ctx) {
			t.Errorf("%s: endpoint.context %+v", tt.profile, c)
		}
		if tt.profile == "coder" {
			// The verdict is kept per backend process: later runs (the
			// background doctor, every minute) send no further probe, and
			// say when the kept verdict was probed.
			before := simRequests(t, f.cfg.Profiles["coder"].Port)
			c2 := agentCheck(t, f, "endpoint.tool_calls", "coder")
			kept := c2
			kept.Message = c.Message
			if after := simRequests(t, f.cfg.Profiles["coder"].Port); after != before || kept != c ||
				!strings.HasPrefix(c2.Message, c.Message+" (probed ") || !strings.Contains(c2.Message, "once per backend process") {
				t.Errorf("a second doctor run sent %v probe requests (check %+v, first %+v)", after-before, c2, c)
			}
		}
	}

	// The served context differs from the profile's: an operator edited
	// the environment file and restarted the unit by hand.
	if _, err := f.switchTo(t, "coder"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	restartWithEditedFlags(t, f, "--max-model-len 32768", "--max-model-len 16384")
	deadline := time.Now().Add(10 * time.Second)
	for {
		rep := (&Doctor{Cfg: f.cfg, GPU: f.gpu, Units: f.sup.units}).Run(ctx)
		if c, ok := checkByID(rep, "endpoint.context", "coder"); ok {
			if c.Severity != units.SeverityFail || !strings.Contains(c.Message, "serves 16384 tokens of context, the profile says 32768") || c.Fix == "" {
				t.Errorf("endpoint.context after a hand edit: %+v", c)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("hand-started vLLM never became healthy: %+v", rep.Checks)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDoctorToolCallFaults: a backend that answers tool calls as text in
// content (--tool-call-fault) fails endpoint.tool_calls; a profile without
// auto tool choice warns without a probe.
func TestDoctorToolCallFaults(t *testing.T) {
	for _, tt := range []struct {
		fault, profile string
		want           units.Severity
		msg            string
	}{
		{"content", "coder", units.SeverityFail, "whole and streamed: the tool call came back as JSON text in content"},
		{"xml", "coder", units.SeverityFail, "whole and streamed: the tool call came back as XML text in content"},
		{"bad-arguments", "coder", units.SeverityFail, "tool_calls arguments are not a JSON object"},
		{"", "coder-notools", units.SeverityWarn, "has no tool calling (no --enable-auto-tool-choice in the argv)"},
	} {
		t.Run(tt.fault+tt.profile, func(t *testing.T) {
			f := newProcFixtureYAML(t, func(bin, state string) string {
				vp := testkit.FreePort(t)
				y := testConfigYAML(bin, state, "process", "", vp, testkit.FreePort(t), "10ms")
				if tt.fault != "" {
					y = strings.Replace(y, "simulate, vllm,", "simulate, vllm, --tool-call-fault, "+tt.fault+",", 1)
				}
				return y + fmt.Sprintf(`  coder-notools:
    backend: vllm
    model: google/gemma-3-27b-it
    served_name: gemma3-27b
    port: %d
    vllm: {gpu_memory_utilization: 0.92, max_num_seqs: 32, max_model_len: 32768}
    sim: {load_time: 10ms}
`, vp)
			})
			if _, err := f.switchTo(t, tt.profile); err != nil {
				t.Fatal(err)
			}
			c := agentCheck(t, f, "endpoint.tool_calls", tt.profile)
			if c.Severity != tt.want || !strings.Contains(c.Message, tt.msg) || c.Fix == "" {
				t.Errorf("endpoint.tool_calls: %+v", c)
			}
			if h := agentCheck(t, f, "endpoint.health", tt.profile); h.Severity != units.SeverityOK {
				t.Errorf("endpoint.health: %+v", h)
			}
		})
	}
}

// simRequests is the simulated vLLM's count of finished requests.
func simRequests(t *testing.T, port int) float64 {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var n float64
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "vllm:request_success_total") {
			var v float64
			fmt.Sscan(line[strings.LastIndex(line, " ")+1:], &v)
			n += v
		}
	}
	if n == 0 {
		t.Fatalf("no vllm:request_success_total in %s", body)
	}
	return n
}
