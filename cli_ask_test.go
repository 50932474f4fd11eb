package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"gopkg.in/yaml.v3"

	"gpuhost/agent"
	"gpuhost/api"
	"gpuhost/appliance"
	"gpuhost/config"
	"gpuhost/frontdoor/httpapi"
	"gpuhost/internal/testbin"
	"gpuhost/internal/testkit"
	"gpuhost/mcp"
)

// timelineAsker replays a timeline ending with stop reason `stop`; when
// hold is set it waits there until its context ends.
type timelineAsker struct {
	stop string
	hold chan struct{}
}

func (a *timelineAsker) Ask(ctx context.Context, q string, emit func(agent.Event)) agent.Result {
	evs := []agent.Event{
		{Kind: agent.EventStart, Text: q, Tools: []string{"calc_eval", "gpu_status"}},
		{Kind: agent.EventModel, Step: 1, PromptTokens: 310, CompletionTokens: 22, LatencyMS: 41.5, Model: "qwen3-coder"},
		{Kind: agent.EventToolCall, Step: 1, Tool: "calc_eval", CallID: "c1", Arguments: `{"expression":"6*"}`},
		{Kind: agent.EventToolResult, Step: 1, Tool: "calc_eval", CallID: "c1", Result: "syntax error\nat 2", IsError: true, LatencyMS: 1.2},
		{Kind: agent.EventModel, Step: 2, PromptTokens: 360, CompletionTokens: 20, LatencyMS: 39},
		{Kind: agent.EventToolCall, Step: 2, Tool: "calc_eval", CallID: "c2", Arguments: `{"expression":"6*7"}`},
		{Kind: agent.EventToolResult, Step: 2, Tool: "calc_eval", CallID: "c2", Result: "42", LatencyMS: 0.9},
	}
	if a.stop == agent.StopAnswer {
		evs = append(evs, agent.Event{Kind: agent.EventAnswer, Step: 3, Text: "6*7 is \x1b[31m42\x1b[0m."})
	}
	if a.hold != nil {
		emit(agent.Event{Seq: 1, Kind: agent.EventStart, Text: q})
		close(a.hold)
		<-ctx.Done()
		emit(agent.Event{Seq: 2, Kind: agent.EventStop, Reason: agent.StopCanceled})
		return agent.Result{Stop: agent.StopCanceled}
	}
	text := ""
	if a.stop == agent.StopMaxSteps {
		text = "the step cap (2) was reached before an answer"
	}
	evs = append(evs, agent.Event{Kind: agent.EventStop, Step: 3, Reason: a.stop, Text: text})
	for i := range evs {
		evs[i].Seq = i + 1
		evs[i].Time = time.Now()
		emit(evs[i])
	}
	return agent.Result{Stop: a.stop}
}

// runCLI runs the real root command in-process and returns its output.
func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRootCmd()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := root.ExecuteContext(ctx)
	return out.String(), err
}

func askServer(t *testing.T, a agent.Asker) *httptest.Server {
	t.Helper()
	e := echo.New()
	agent.Register(e, a, slog.New(slog.NewTextHandler(io.Discard, nil)))
	srv := httptest.NewServer(e)
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	return srv
}

// TestAskCommand runs `gpuhost ask` against a real HTTP server with
// agent.Register: the human timeline, --json lines, and the exit status
// for an answer, a loop that gave up, and a busy daemon.
func TestAskCommand(t *testing.T) {
	t.Setenv("GPUHOST_API_TOKEN", "")
	answered := askServer(t, &timelineAsker{stop: agent.StopAnswer})
	capped := askServer(t, &timelineAsker{stop: agent.StopMaxSteps})

	t.Run("human", func(t *testing.T) {
		out, err := runCLI(t, "ask", "--url", answered.URL, "what", "is", "6*7?")
		if err != nil {
			t.Fatalf("ask: %v\n%s", err, out)
		}
		for _, want := range []string{
			"? what is 6*7?  [2 tools: calc_eval, gpu_status]",
			"step 1  model        310+22 tokens  42 ms  qwen3-coder",
			`step 1  call         calc_eval {"expression":"6*"}`,
			"step 1  result     ✗ calc_eval  1.2 ms  FAILED  syntax error at 2",
			"step 2  result     ✓ calc_eval  0.9 ms  42",
			"\n6*7 is [31m42[0m.\n",
			"stopped: answer",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
		if strings.Contains(out, "\x1b") {
			t.Errorf("a terminal escape from the answer reached the output: %q", out)
		}
	})
	t.Run("json", func(t *testing.T) {
		out, err := runCLI(t, "ask", "--json", "--url", answered.URL, "what is 6*7?")
		if err != nil {
			t.Fatalf("ask --json: %v\n%s", err, out)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 9 {
			t.Fatalf("%d lines, want 9 (one per event):\n%s", len(lines), out)
		}
		for i, l := range lines {
			var e agent.Event
			if err := json.Unmarshal([]byte(l), &e); err != nil {
				t.Fatalf("line %d is not an event: %v: %s", i+1, err, l)
			}
			if e.Seq != i+1 {
				t.Errorf("line %d has seq %d", i+1, e.Seq)
			}
			if i == 3 && !e.IsError {
				t.Errorf("line 4 lost is_error: %s", l)
			}
			if i == len(lines)-1 && (e.Kind != agent.EventStop || e.Reason != agent.StopAnswer) {
				t.Errorf("last line %s", l)
			}
		}
	})
	t.Run("gave up", func(t *testing.T) {
		out, err := runCLI(t, "ask", "--url", capped.URL, "loop forever")
		var ee exitError
		if !errors.As(err, &ee) || ee.code != askExitNotAnswered {
			t.Fatalf("err %v, want exit status %d", err, askExitNotAnswered)
		}
		if !strings.Contains(out, "stopped: max_steps — the step cap (2) was reached before an answer") {
			t.Errorf("output lacks the stop line:\n%s", out)
		}
	})
	t.Run("busy", func(t *testing.T) {
		hold := &timelineAsker{hold: make(chan struct{})}
		busy := askServer(t, agent.NewLimiter(hold, 1))
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			_ = api.NewClient(busy.URL, "").Ask(ctx, "first", func(stream io.Reader) error {
				return agent.ReadEvents(stream, func(agent.Event) error { return nil })
			})
		}()
		<-hold.hold
		out, err := runCLI(t, "ask", "--url", busy.URL, "second")
		var re *api.RemoteError
		if !errors.As(err, &re) || re.Status != 429 || !strings.Contains(re.Error(), "limit is 1") {
			t.Fatalf("err %v, want the 429 with the limit\n%s", err, out)
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		srv := askServer(t, &timelineAsker{stop: agent.StopAnswer})
		url := srv.URL
		srv.Close()
		_, err := runCLI(t, "ask", "--url", url, "q")
		if err == nil || !strings.Contains(err.Error(), "reach gpuhost at "+url) {
			t.Errorf("err %v", err)
		}
	})
	t.Run("blank question", func(t *testing.T) {
		_, err := runCLI(t, "ask", "--url", answered.URL, "  ")
		if err == nil || !strings.Contains(err.Error(), "empty") {
			t.Errorf("err %v", err)
		}
	})
}

// TestAskCommandToken: beyond loopback the daemon's API wants the bearer
// token; the CLI sends $GPUHOST_API_TOKEN as `status` does.
func TestAskCommandToken(t *testing.T) {
	state := t.TempDir()
	token := "cli-ask-token-0123456789"
	tokenFile := filepath.Join(state, "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("ask-cli", []byte(testbin.ConfigYAML("/nonexistent/gpuhost", state, "process", "", testkit.FreePort(t), testkit.FreePort(t), "10ms")))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen, cfg.APITokenFile = "0.0.0.0:0", tokenFile
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	sup := appliance.NewSupervisor(cfg, nil, nil, nil, log)
	defer sup.Close()
	httpAPI, err := httpapi.New(sup, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	agent.Register(httpAPI, &timelineAsker{stop: agent.StopAnswer}, log)
	srv := httptest.NewServer(httpAPI)
	defer srv.Close()

	t.Setenv("GPUHOST_API_TOKEN", "wrong")
	_, err = runCLI(t, "ask", "--url", srv.URL, "q")
	var re *api.RemoteError
	if !errors.As(err, &re) || re.Status != 401 {
		t.Fatalf("wrong token: %v, want the API's 401", err)
	}
	t.Setenv("GPUHOST_API_TOKEN", token)
	if out, err := runCLI(t, "ask", "--url", srv.URL, "q"); err != nil || !strings.Contains(out, "stopped: answer") {
		t.Fatalf("with the token: %v\n%s", err, out)
	}
}

func TestFormatAskEvent(t *testing.T) {
	for _, tc := range []struct {
		e    agent.Event
		want string
	}{
		{agent.Event{Kind: agent.EventStart, Text: "hi\nthere"}, "? hi there"},
		{agent.Event{Kind: agent.EventModel, Step: 2, PromptTokens: 5, CompletionTokens: 1}, "step 2  model        5+1 tokens"},
		{agent.Event{Kind: agent.EventModel, Step: 1, LatencyMS: 12345}, "step 1  model        0+0 tokens  12.3 s"},
		{agent.Event{Kind: agent.EventToolCall, Step: 1, Tool: "nas_status", Arguments: "{}"}, "step 1  call         nas_status {}"},
		{agent.Event{Kind: agent.EventToolResult, Step: 1, Tool: "t", LatencyMS: 250, Result: "ok"}, "step 1  result     ✓ t  250 ms  ok"},
		{agent.Event{Kind: agent.EventToolResult, Step: 1, Tool: "t", IsError: true, Result: "\x1b[2Jboom"}, "step 1  result     ✗ t  –  FAILED  [2Jboom"},
		{agent.Event{Kind: agent.EventToolResult, Step: 1, Tool: "t", Result: strings.Repeat("é", 300)}, "step 1  result     ✓ t  –  " + strings.Repeat("é", 160) + "…"},
		{agent.Event{Kind: agent.EventAnswer, Text: "  line 1\nline 2\x07 "}, "\nline 1\nline 2\n"},
		{agent.Event{Kind: agent.EventStop, Reason: agent.StopDeadline, Text: "120 s passed"}, "stopped: deadline — 120 s passed"},
		{agent.Event{Kind: "future", Step: 4}, "step 4  future"},
	} {
		if got := formatAskEvent(tc.e); got != tc.want {
			t.Errorf("formatAskEvent(%+v)\n got %q\nwant %q", tc.e, got, tc.want)
		}
	}
}

// TestAskCommandRealAgent runs `gpuhost ask` end to end: the real agent
// loop behind agent.Register, tools from the real MCP server's calc
// connector over the in-process client, and the simulator binary in its
// scripted tool-use mode as the model.
func TestAskCommandRealAgent(t *testing.T) {
	t.Setenv("GPUHOST_API_TOKEN", "")
	port := testkit.FreePort(t)
	sim := exec.Command(binPath, "simulate", "vllm", "serve", "qwen3-coder", "--port", strconv.Itoa(port),
		"--enable-auto-tool-choice", "--tool-call-parser", "qwen3_xml", "--scripted-tools",
		"--load-time", "0s", "--prefill-tps", "1000000", "--decode-tps", "20000")
	if err := sim.Start(); err != nil {
		t.Fatalf("start the simulator: %v", err)
	}
	t.Cleanup(func() { _ = sim.Process.Kill(); _ = sim.Wait() })
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(base + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("simulator not healthy within 60 s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ms, err := mcp.NewServer(mcp.ServerOptions{Config: map[string]yaml.Node{"calc": {Kind: yaml.MappingNode, Tag: "!!map"}}, Log: log, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := ms.InProcessClient(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	srv := askServer(t, agent.New(cl, agent.Options{BaseURL: base + "/v1", Log: log}))

	out, err := runCLI(t, "ask", "--url", srv.URL, `Evaluate "6*7" with calc`)
	if err != nil {
		t.Fatalf("ask: %v\n%s", err, out)
	}
	for _, want := range []string{`call         calc_evaluate {"expression":"6*7"}`, "result     ✓ calc_evaluate", "[simulated model]", "42", "stopped: answer"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	out, err = runCLI(t, "ask", "--json", "--url", srv.URL, `Evaluate "6 x 7" with calc`)
	if err != nil {
		t.Fatalf("ask --json: %v\n%s", err, out)
	}
	failed := 0
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var e agent.Event
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("not an event line: %q: %v", l, err)
		}
		if e.Kind == agent.EventToolResult && e.IsError {
			failed++
		}
	}
	if failed == 0 {
		t.Errorf("the bad expression left no failed call in the events:\n%s", out)
	}
}
