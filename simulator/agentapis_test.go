package simulator

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"gpuhost/internal/sse"
)

// anthTools and respTools are boxTools in the Messages and Responses shapes.
func anthTools(t *testing.T) []any {
	var out []any
	for _, tl := range decodeTools(t, boxTools()) {
		out = append(out, map[string]any{"name": tl.Function.Name, "description": tl.Function.Description, "input_schema": tl.Function.Parameters})
	}
	return out
}

func respTools(t *testing.T) []any {
	var out []any
	for _, tl := range decodeTools(t, boxTools()) {
		out = append(out, map[string]any{"type": "function", "name": tl.Function.Name, "description": tl.Function.Description, "parameters": tl.Function.Parameters})
	}
	return out
}

type sseEvent struct {
	typ  string
	data map[string]any
}

// readEvents reads a whole event stream with internal/sse's Reader.
func readEvents(t *testing.T, body []byte) []sseEvent {
	t.Helper()
	r := sse.NewReader(bytes.NewReader(body), 0)
	var out []sseEvent
	for {
		e, err := r.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("reading the stream: %v", err)
		}
		var d map[string]any
		if err := json.Unmarshal(e.Data, &d); err != nil {
			t.Fatalf("event %q data %s: %v", e.Type, e.Data, err)
		}
		if d["type"] != e.Type {
			t.Fatalf("event %q has data type %v", e.Type, d["type"])
		}
		out = append(out, sseEvent{typ: e.Type, data: d})
	}
}

func intOf(v any) int { f, _ := v.(float64); return int(f) }

// anthStream checks a Messages stream's documented order and returns its
// blocks (text, or tool name + arguments), its usage and stop reason.
func anthStream(t *testing.T, evs []sseEvent) (blocks []string, in, out int, stop string) {
	t.Helper()
	if len(evs) < 3 || evs[0].typ != "message_start" || evs[len(evs)-1].typ != "message_stop" || evs[len(evs)-2].typ != "message_delta" {
		t.Fatalf("stream does not go message_start … message_delta, message_stop: %v", evs)
	}
	in = intOf(evs[0].data["message"].(map[string]any)["usage"].(map[string]any)["input_tokens"])
	deltas, open := 0, false
	for _, e := range evs[1 : len(evs)-2] {
		switch e.typ {
		case "content_block_start":
			if open || intOf(e.data["index"]) != len(blocks) {
				t.Fatalf("block start out of order: %v", e.data)
			}
			open = true
			b := e.data["content_block"].(map[string]any)
			blocks = append(blocks, "")
			if b["type"] == "tool_use" {
				blocks[len(blocks)-1] = b["name"].(string) + ":"
			}
		case "content_block_delta":
			d := e.data["delta"].(map[string]any)
			if !open || intOf(e.data["index"]) != len(blocks)-1 {
				t.Fatalf("delta outside its block: %v", e.data)
			}
			blocks[len(blocks)-1] += strOf(d["text"]) + strOf(d["partial_json"])
			deltas++
		case "content_block_stop":
			open = false
		default:
			t.Fatalf("unexpected event %q", e.typ)
		}
	}
	if open {
		t.Fatal("a block was not stopped")
	}
	md := evs[len(evs)-2].data
	out = intOf(md["usage"].(map[string]any)["output_tokens"])
	if out != deltas {
		t.Errorf("message_delta says %d output tokens, %d deltas were sent", out, deltas)
	}
	return blocks, in, out, md["delta"].(map[string]any)["stop_reason"].(string)
}

func strOf(v any) string { s, _ := v.(string); return s }

// TestMessagesToolLoop: Claude Code's turn against the scripted model on
// /v1/messages, streamed and whole: the question gets a tool_use block,
// the tool_result gets prose quoting it; usage agrees with count_tokens and
// with the deltas sent.
func TestMessagesToolLoop(t *testing.T) {
	for _, flavor := range []Flavor{FlavorVLLM, FlavorOllama} {
		s := startSim(t, Options{Flavor: flavor, Model: "qwen3:8b", ServedName: "qwen3", PrefillTPS: 1e6, DecodeTPS: 20000, LoadTime: 1,
			ScriptedTools: true, EnableAutoToolChoice: true, ToolCallParser: "qwen3_xml"})
		model := pickS(flavor == FlavorVLLM, "qwen3", "qwen3:8b")
		q := []any{map[string]any{"role": "user", "content": "What is the gpu status?"}}
		req := map[string]any{"model": model, "max_tokens": 1000, "system": []any{map[string]any{"type": "text", "text": "Tools only read."}},
			"messages": q, "tools": anthTools(t), "stream": true}
		code, body, _ := s.do(t, http.MethodPost, "/v1/messages", req)
		if code != http.StatusOK {
			t.Fatalf("%s: status %d: %s", flavor, code, body)
		}
		blocks, in, out, stop := anthStream(t, readEvents(t, body))
		if len(blocks) != 1 || blocks[0] != "gpu_status:{}" || stop != "tool_use" || out != len(tokenize("{}")) {
			t.Fatalf("%s: blocks %q stop %q out %d", flavor, blocks, stop, out)
		}
		delete(req, "stream")
		delete(req, "max_tokens")
		_, cb, _ := s.do(t, http.MethodPost, "/v1/messages/count_tokens", req)
		if got := decode[map[string]int](t, cb)["input_tokens"]; got != in || in <= 0 {
			t.Errorf("%s: count_tokens %d, message_start %d", flavor, got, in)
		}
		// The tool ran; its result goes back as a tool_result block.
		req["messages"] = append(q,
			map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "tool_use", "id": "toolu_1", "name": "gpu_status", "input": map[string]any{}}}},
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result", "tool_use_id": "toolu_1", "content": "memory 20 GiB used of 24 GiB"}}})
		req["max_tokens"] = 1000
		code, body, _ = s.do(t, http.MethodPost, "/v1/messages", req)
		var whole struct {
			Type       string `json:"type"`
			StopReason string `json:"stop_reason"`
			Content    []struct{ Type, Text string }
			Usage      struct {
				InputTokens  int `json:"input_tokens"`
				OutputTokens int `json:"output_tokens"`
			}
		}
		if err := json.Unmarshal(body, &whole); err != nil || code != http.StatusOK {
			t.Fatalf("%s: %d %s", flavor, code, body)
		}
		if whole.Type != "message" || whole.StopReason != "end_turn" || len(whole.Content) != 1 ||
			!strings.Contains(whole.Content[0].Text, "memory 20 GiB used of 24 GiB") || !strings.HasPrefix(whole.Content[0].Text, scriptedPrefix) {
			t.Fatalf("%s: answer on the tool result %s", flavor, body)
		}
		if whole.Usage.OutputTokens != len(tokenize(whole.Content[0].Text)) || whole.Usage.InputTokens <= in {
			t.Errorf("%s: usage %+v for %q (first turn's input %d)", flavor, whole.Usage, whole.Content[0].Text, in)
		}
		// Errors come in Anthropic's shape.
		code, body, _ = s.do(t, http.MethodPost, "/v1/messages", map[string]any{"model": model, "messages": q})
		if e := decode[map[string]any](t, body); code != http.StatusBadRequest || e["type"] != "error" ||
			e["error"].(map[string]any)["type"] != "invalid_request_error" {
			t.Errorf("%s: missing max_tokens: %d %s", flavor, code, body)
		}
	}
}

// TestResponsesToolLoop: Codex's turn on /v1/responses, streamed and
// whole: a function_call item, then prose on the function_call_output.
func TestResponsesToolLoop(t *testing.T) {
	s, o := fastVLLM(t, func(o *Options) { o.ScriptedTools = true })
	input := []any{map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "What is the history of customer Globex?"}}}}
	req := map[string]any{"model": o.ServedName, "instructions": "Tools only read.", "input": input, "tools": respTools(t), "stream": true}
	code, body, _ := s.do(t, http.MethodPost, "/v1/responses", req)
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, body)
	}
	evs := readEvents(t, body)
	var types []string
	args, deltas := "", 0
	for i, e := range evs {
		if intOf(e.data["sequence_number"]) != i {
			t.Fatalf("event %d has sequence_number %v", i, e.data["sequence_number"])
		}
		types = append(types, e.typ)
		if e.typ == "response.function_call_arguments.delta" {
			args += e.data["delta"].(string)
			deltas++
		}
	}
	want := "response.created response.in_progress response.output_item.added" + strings.Repeat(" response.function_call_arguments.delta", deltas) +
		" response.function_call_arguments.done response.output_item.done response.completed"
	if strings.Join(types, " ") != want || args != `{"name":"Globex"}` {
		t.Fatalf("events %v, arguments %q", types, args)
	}
	final := evs[len(evs)-1].data["response"].(map[string]any)
	item := final["output"].([]any)[0].(map[string]any)
	usage := final["usage"].(map[string]any)
	if item["type"] != "function_call" || item["name"] != "crm_customer" || item["arguments"] != args || intOf(usage["output_tokens"]) != deltas || intOf(usage["input_tokens"]) <= 0 {
		t.Fatalf("final response %v", final)
	}
	req["input"] = append(input, map[string]any{"type": "function_call", "call_id": item["call_id"], "name": "crm_customer", "arguments": args},
		map[string]any{"type": "function_call_output", "call_id": item["call_id"], "output": "Globex: 3 orders, last contact May"})
	delete(req, "stream")
	code, body, _ = s.do(t, http.MethodPost, "/v1/responses", req)
	var whole struct {
		Object, Status string
		Output         []struct {
			Type    string
			Content []struct{ Type, Text string }
		}
		Usage struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
			TotalTokens  int `json:"total_tokens"`
		}
	}
	if err := json.Unmarshal(body, &whole); err != nil || code != http.StatusOK {
		t.Fatalf("%d %s", code, body)
	}
	if whole.Object != "response" || whole.Status != "completed" || len(whole.Output) != 1 || whole.Output[0].Type != "message" ||
		!strings.Contains(whole.Output[0].Content[0].Text, "Globex: 3 orders") {
		t.Fatalf("answer on the tool output %s", body)
	}
	text := whole.Output[0].Content[0].Text
	if whole.Usage.OutputTokens != len(tokenize(text)) || whole.Usage.TotalTokens != whole.Usage.InputTokens+whole.Usage.OutputTokens {
		t.Errorf("usage %+v", whole.Usage)
	}
	// A cap ends the response as incomplete.
	code, body, _ = s.do(t, http.MethodPost, "/v1/responses", map[string]any{"model": o.ServedName, "input": "hi", "max_output_tokens": 3, "stream": true})
	evs = readEvents(t, body)
	last := evs[len(evs)-1]
	if code != http.StatusOK || last.typ != "response.incomplete" || intOf(last.data["response"].(map[string]any)["usage"].(map[string]any)["output_tokens"]) != 3 {
		t.Errorf("capped: %d, last event %v", code, last)
	}
}

// FuzzAgentRequests: any body is translated or refused with a 4xx, never
// a panic; a translated body is a chat request decodeChatRequest accepts.
func FuzzAgentRequests(f *testing.F) {
	f.Add([]byte(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"x","content":[{"type":"text","text":"r"}]}]}],"tools":[{"name":"t","input_schema":{}}]}`), true)
	f.Add([]byte(`{"model":"m","input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"o"}],"tools":[{"type":"function","name":"f"}]}`), false)
	f.Add([]byte(`{"model":"m","input":"hi","tool_choice":{"type":"function","name":"f"}}`), false)
	f.Fuzz(func(t *testing.T, body []byte, messages bool) {
		var chat []byte
		var e *apiError
		if messages {
			_, chat, e = chatFromMessages(body, false)
		} else {
			_, chat, e = chatFromResponses(body)
		}
		if e != nil {
			if e.status != http.StatusBadRequest || e.message == "" {
				t.Fatalf("refusal %+v", e)
			}
			return
		}
		if _, e := decodeChatRequest(chat); e != nil && len(json.RawMessage(chat)) > 0 && !strings.Contains(e.message, "messages") {
			t.Fatalf("translated body refused: %v: %s", e, chat)
		}
	})
}
