package agent_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"gpuhost/agent"
	"gpuhost/internal/sse"
)

// memTransport is a model endpoint in memory: it answers every chat
// request at once with canned SSE, so what a benchmark measures is the
// loop itself (request encoding, stream parsing, delta assembly, tool
// dispatch, events), not a model.
type memTransport struct {
	toolSteps int    // replies that call a tool before the answer
	calls     []byte // SSE body of a tool-calling reply
	answer    []byte // SSE body of the final answer
	body      func(n int) []byte
}

func (m *memTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	var body []byte
	if m.body != nil {
		body = m.body(0)
	} else {
		req, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, err
		}
		body = m.answer
		if bytes.Count(req, []byte(`"role":"tool"`)) < m.toolSteps {
			body = m.calls
		}
	}
	_ = r.Body.Close()
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"text/event-stream"}},
		Body: io.NopCloser(bytes.NewReader(body)), Request: r}, nil
}

func sseBody(payloads []string) []byte {
	var b []byte
	for _, p := range payloads {
		b = sse.AppendEvent(b, sse.Event{Data: []byte(p)})
	}
	return sse.AppendEvent(b, sse.Event{Data: []byte("[DONE]")})
}

// memTools is an MCP client in memory with the shape of gpuhost's tools.
type memTools struct{ list *mcpgo.ListToolsResult }

func newMemTools() *memTools {
	ro := []mcpgo.ToolOption{mcpgo.WithReadOnlyHintAnnotation(true), mcpgo.WithDestructiveHintAnnotation(false)}
	var tools []mcpgo.Tool
	for _, name := range []string{"gpu_status", "gpu_processes", "inference_status", "inference_profiles", "calc_evaluate"} {
		tools = append(tools, mcpgo.NewTool(name, append(ro, mcpgo.WithDescription("A read-only tool of the box."),
			mcpgo.WithString("target", mcpgo.Enum("a", "b")))...))
	}
	return &memTools{list: &mcpgo.ListToolsResult{Tools: tools}}
}

func (m *memTools) ListTools(context.Context, mcpgo.ListToolsRequest) (*mcpgo.ListToolsResult, error) {
	return m.list, nil
}

var memResult = strings.Repeat(`{"gpu":"NVIDIA GeForce RTX 4090","memory_used_mib":22000,"memory_total_mib":24564},`, 12)

func (m *memTools) CallTool(context.Context, mcpgo.CallToolRequest) (*mcpgo.CallToolResult, error) {
	return mcpgo.NewToolResultText(memResult), nil
}

// BenchmarkLoopOverhead measures the loop's own cost per step: one Ask of
// six steps (five that call a tool, one that answers) against a model
// and tools that answer at once from memory. ns/step is what the loop
// adds to each model round trip and tool call; the target is ≤ 1 ms.
//
//	go test -run '^$' -bench BenchmarkLoopOverhead -benchmem ./agent/
func BenchmarkLoopOverhead(b *testing.B) {
	const steps = 6
	tr := &memTransport{
		toolSteps: steps - 1,
		calls:     sseBody(sseToolCalls(sseCall{"gpu_status", `{"target":"a"}`})),
		answer:    sseBody(sseText("The GPU uses 22000 of 24564 MiB; the coder profile is active and healthy.")),
	}
	a := agent.New(newMemTools(), agent.Options{BaseURL: "http://model.invalid/v1", Model: "m",
		HTTPClient: &http.Client{Transport: tr}, MaxSteps: steps})
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		res := a.Ask(ctx, "What is the GPU status?", nil)
		if res.Stop != agent.StopAnswer || res.Steps != steps {
			b.Fatalf("stop %q after %d steps: %s", res.Stop, res.Steps, res.Message)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*steps), "ns/step")
}

// FuzzModelStream feeds arbitrary model output (SSE bodies) to the loop:
// whatever the endpoint streams, Ask must not panic or hang, and it ends
// with exactly one stop event, last.
func FuzzModelStream(f *testing.F) {
	f.Add(string(sseBody(sseToolCalls(sseCall{"gpu_status", `{"target":"a"}`}))))
	f.Add(string(sseBody(sseToolCalls(sseCall{"nope", `{`}, sseCall{"", `[]`}))))
	f.Add(string(sseBody(sseText("hello there"))))
	f.Add(string(sseBody(sseText(""))))
	f.Add(`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"function":{"name":"gpu_status","arguments":"{}"}},{"id":"x","function":{"arguments":"{}"}}]}}]}` + "\n\ndata: [DONE]\n\n")
	f.Add("data: {\"error\":{\"message\":\"boom\"}}\n\n")
	f.Add("event: x\n: comment\ndata: not json\n\n")
	f.Add("")
	tools := newMemTools()
	f.Fuzz(func(t *testing.T, body string) {
		tr := &memTransport{body: func(int) []byte { return []byte(body) }}
		a := agent.New(tools, agent.Options{BaseURL: "http://model.invalid/v1", Model: "m",
			HTTPClient: &http.Client{Transport: tr}, MaxSteps: 3})
		var seen []agent.Event
		res := a.Ask(context.Background(), "What is the GPU status?", func(e agent.Event) { seen = append(seen, e) })
		checkTimeline(t, res, seen)
	})
}
