package simulator

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// probeTool is one tool with one required string parameter, as the
// doctor's endpoint.tool_calls check offers it.
func probeTool() []any {
	return []any{map[string]any{"type": "function", "function": map[string]any{
		"name": "report_status", "description": "Report a status word.",
		"parameters": map[string]any{"type": "object", "required": []any{"status"},
			"properties": map[string]any{"status": map[string]any{"type": "string"}}}}}}
}

// streamedChat folds a streamed chat completion into content and calls.
func streamedChat(t *testing.T, body []byte) (content string, names, args []string) {
	t.Helper()
	for _, ev := range parseSSE(t, body).events {
		var c struct {
			Choices []struct {
				Delta struct {
					Content   *string `json:"content"`
					ToolCalls []struct {
						Index    int `json:"index"`
						Function struct {
							Name      string `json:"name"`
							Arguments string `json:"arguments"`
						} `json:"function"`
					} `json:"tool_calls"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(ev, &c); err != nil {
			t.Fatal(err)
		}
		for _, ch := range c.Choices {
			if ch.Delta.Content != nil {
				content += *ch.Delta.Content
			}
			for _, tc := range ch.Delta.ToolCalls {
				for len(names) <= tc.Index {
					names, args = append(names, ""), append(args, "")
				}
				names[tc.Index] += tc.Function.Name
				args[tc.Index] += tc.Function.Arguments
			}
		}
	}
	return content, names, args
}

// TestNamedToolCallAndFaults: without the scripted mode a user turn that
// names an offered tool gets a structured call (vLLM with auto tool choice
// and Ollama's /v1); --tool-call-fault turns it into text or broken JSON.
func TestNamedToolCallAndFaults(t *testing.T) {
	ask := func(model string, stream bool) map[string]any {
		return map[string]any{"model": model, "stream": stream, "tools": probeTool(), "tool_choice": "auto",
			"messages": []any{map[string]any{"role": "user", "content": "Call report_status with status ok."}}}
	}
	for _, tt := range []struct {
		name, fault, flavor string
		wantCall            bool   // a tool_calls entry named report_status
		validArgs           bool   // its arguments are valid JSON
		contentHas          string // text in content
	}{
		{"vllm structured", "", "vllm", true, true, ""},
		{"ollama structured", "", "ollama", true, true, ""},
		{"content fault", ToolCallFaultContent, "vllm", false, false, `{"name":"report_status","arguments":{"status":`},
		{"xml fault", ToolCallFaultXML, "vllm", false, false, "<tool_call>\n<function=report_status>\n<parameter=status>"},
		{"bad arguments", ToolCallFaultBadArguments, "vllm", true, false, ""},
		{"ollama content fault", ToolCallFaultContent, "ollama", false, false, `"name":"report_status"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var s *sim
			model := "qwen3-coder"
			if tt.flavor == "vllm" {
				s, _ = fastVLLM(t, func(o *Options) { o.ToolCallFault = tt.fault })
			} else {
				model = "qwen3:8b"
				s = startSim(t, Options{Flavor: FlavorOllama, Model: model, PrefillTPS: 1e6, DecodeTPS: 20000, LoadTime: 1, ToolCallFault: tt.fault})
			}
			for _, stream := range []bool{false, true} {
				code, body, _ := s.do(t, http.MethodPost, "/v1/chat/completions", ask(model, stream))
				if code != http.StatusOK {
					t.Fatalf("stream %v: status %d: %s", stream, code, body)
				}
				var content string
				var names, args []string
				if stream {
					content, names, args = streamedChat(t, body)
				} else {
					m := decode[wholeChat](t, body).Choices[0].Message
					if m.Content != nil {
						content = *m.Content
					}
					for _, c := range m.ToolCalls {
						names, args = append(names, c.Function.Name), append(args, c.Function.Arguments)
					}
				}
				gotCall := len(names) == 1 && names[0] == "report_status"
				if gotCall != tt.wantCall || (!tt.wantCall && len(names) != 0) {
					t.Fatalf("stream %v: calls %v, want a call %v (content %q)", stream, names, tt.wantCall, content)
				}
				if gotCall && json.Valid([]byte(args[0])) != tt.validArgs {
					t.Errorf("stream %v: arguments %q, want valid JSON %v", stream, args[0], tt.validArgs)
				}
				if !strings.Contains(content, tt.contentHas) || (tt.contentHas == "" && content != "") {
					t.Errorf("stream %v: content %q, want %q", stream, content, tt.contentHas)
				}
			}
		})
	}
}

// TestNamedToolCallNeedsAutoToolChoice: vLLM without
// --enable-auto-tool-choice refuses tool_choice auto (vLLM's own 400); a
// question that names no tool keeps the filler words.
func TestNamedToolCallNeedsAutoToolChoice(t *testing.T) {
	off, _ := fastVLLM(t, func(o *Options) { o.EnableAutoToolChoice, o.ToolCallParser = false, "" })
	code, body, _ := off.do(t, http.MethodPost, "/v1/chat/completions", chatBody(map[string]any{"tools": probeTool(), "tool_choice": "auto",
		"messages": []any{map[string]any{"role": "user", "content": "Call report_status."}}}))
	if code != http.StatusBadRequest || !strings.Contains(string(body), "--enable-auto-tool-choice") {
		t.Fatalf("status %d: %s", code, body)
	}
	on, _ := fastVLLM(t, nil)
	_, body, _ = on.do(t, http.MethodPost, "/v1/chat/completions", chatBody(map[string]any{"tools": probeTool(),
		"messages": []any{map[string]any{"role": "user", "content": "What is the status report?"}}}))
	if m := decode[wholeChat](t, body).Choices[0].Message; len(m.ToolCalls) != 0 {
		t.Fatalf("a question naming no tool got calls: %s", body)
	}
}

func TestToolCallFaultValidated(t *testing.T) {
	if _, err := (Options{Flavor: FlavorVLLM, Model: "m", ToolCallFault: "sometimes"}).withDefaults(); err == nil || !strings.Contains(err.Error(), "tool call fault") {
		t.Fatalf("err %v", err)
	}
}
