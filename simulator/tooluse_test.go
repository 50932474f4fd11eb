package simulator

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// boxTools are tool definitions shaped like gpuhost's own MCP tools as an
// agent hands them to the model (go-openai's Tool encoding).
func boxTools() []any {
	obj := func(props map[string]any, required ...string) map[string]any {
		s := map[string]any{"type": "object", "properties": props}
		if len(required) > 0 {
			s["required"] = required
		}
		return s
	}
	fn := func(name, desc string, params map[string]any) any {
		return map[string]any{"type": "function", "function": map[string]any{"name": name, "description": desc, "parameters": params}}
	}
	return []any{
		fn("calc_evaluate", "Evaluate an arithmetic expression exactly as a calculator would.",
			obj(map[string]any{"expression": map[string]any{"type": "string"}}, "expression")),
		fn("crm_customer", "History of one customer of the CRM: orders, tickets, last contact.",
			obj(map[string]any{"name": map[string]any{"type": "string"}}, "name")),
		fn("gpu_processes", "Processes holding GPU memory right now.", obj(map[string]any{})),
		fn("gpu_status", "Current GPU snapshot: memory used/free, utilisation, temperature, power.", obj(map[string]any{})),
		fn("inference_doctor", "Run the doctor: checks of the driver, units and profile settings.",
			obj(map[string]any{"profile": map[string]any{"type": "string", "enum": []any{"coder", "coder-greedy", "llama"}}})),
		fn("inference_profiles", "List the configured inference profiles and which one is active.", obj(map[string]any{})),
		fn("weather_forecast", "Weather forecast for a configured place.",
			obj(map[string]any{"place": map[string]any{"type": "string", "enum": []any{"home", "office"}},
				"days": map[string]any{"type": "integer", "minimum": 1, "maximum": 7}}, "place", "days")),
	}
}

func decodeTools(t *testing.T, v []any) []oaiTool {
	t.Helper()
	var tools []oaiTool
	if err := json.Unmarshal(mustJSON(t, v), &tools); err != nil {
		t.Fatal(err)
	}
	return tools
}

func TestChooseCalls(t *testing.T) {
	tools := decodeTools(t, boxTools())
	type call struct{ name, args string }
	for _, tt := range []struct {
		q    string
		want []call
	}{
		{"What is the GPU status?", []call{{"gpu_status", `{}`}}},
		{"Which processes hold memory on the gpu?", []call{{"gpu_processes", `{}`}}},
		{"What is the history of customer Globex?", []call{{"crm_customer", `{"name":"Globex"}`}}},
		{"Please compute (17.5 * 3 - 2) / 4 for me", []call{{"calc_evaluate", `{"expression":"(17.5 * 3 - 2) / 4"}`}}},
		{`Evaluate "sqrt(2)^2"`, []call{{"calc_evaluate", `{"expression":"sqrt(2)^2"}`}}},
		{"Run the doctor for llama", []call{{"inference_doctor", `{"profile":"llama"}`}}},
		{"Run the doctor", []call{{"inference_doctor", `{}`}}},
		{"Weather at the office for 3 days?", []call{{"weather_forecast", `{"days":3,"place":"office"}`}}},
		{"Weather forecast for 30 days", []call{{"weather_forecast", `{"days":1,"place":"home"}`}}},
		{"Hello there", nil},
		{"what is 6*7?", []call{{"calc_evaluate", `{"expression":"6*7"}`}}},
		{"Tell me a joke", nil},
		{"Show the gpu status and the inference profiles", []call{{"gpu_status", `{}`}, {"inference_profiles", `{}`}}},
		{"gpu status and gpu temperature", []call{{"gpu_status", `{}`}}},
	} {
		t.Run(tt.q, func(t *testing.T) {
			got := chooseCalls(tt.q, tools)
			var have []call
			for _, c := range got {
				have = append(have, call{c.Name, c.Arguments})
				if c.Finish != "tool_calls" {
					t.Errorf("finish %q", c.Finish)
				}
			}
			if len(have) != len(tt.want) {
				t.Fatalf("calls %v, want %v", have, tt.want)
			}
			for i := range have {
				if have[i] != tt.want[i] {
					t.Errorf("call %d = %v, want %v", i, have[i], tt.want[i])
				}
			}
		})
	}
	noGPU := decodeTools(t, []any{map[string]any{"type": "function", "function": map[string]any{"name": "nas_volumes"}},
		map[string]any{"type": "function", "function": map[string]any{"name": "shelly_power"}}})
	if got := chooseCalls("anything at all", noGPU); len(got) != 0 {
		t.Errorf("a question that names no tool got calls %+v, want a prose answer", got)
	}
}

// opencode's bash tool: the scripted model runs a quoted command as
// written, turns arithmetic into a command that prints it, and never
// hands prose to the shell (the demo once ran `what is 6*7?` as a command).
func TestChooseCallsShellTool(t *testing.T) {
	bash := decodeTools(t, []any{map[string]any{"type": "function", "function": map[string]any{
		"name": "bash", "description": "Executes a given bash command in a persistent shell session with optional timeout.",
		"parameters": map[string]any{"type": "object", "properties": map[string]any{
			"command":     map[string]any{"type": "string"},
			"timeout":     map[string]any{"type": "number"},
			"description": map[string]any{"type": "string"},
		}, "required": []any{"command", "description"}}}}})
	for _, tt := range []struct{ q, command string }{
		{"what is 6*7? use bash to compute it", `awk 'BEGIN { print 6*7 }'`},
		{`run the bash command "echo $((6*7))xyz"`, `echo $((6*7))xyz`},
		{"use bash to compute (17.5 × 3 − 2) / 4", `awk 'BEGIN { print (17.5 * 3 - 2) / 4 }'`},
		{"use bash to tell me a joke", ""},
		{"what is the meaning of life?", ""},
	} {
		got := chooseCalls(tt.q, bash)
		if tt.command == "" {
			if len(got) != 0 {
				t.Errorf("%q: calls %+v, want a prose answer", tt.q, got)
			}
			continue
		}
		var args map[string]any
		if len(got) != 1 || json.Unmarshal([]byte(got[0].Arguments), &args) != nil || args["command"] != tt.command || args["description"] == "" {
			t.Errorf("%q: calls %+v, want bash with command %q and a description", tt.q, got, tt.command)
		}
	}
	for q, want := range map[string]string{
		`"what is 6*7? use bash to compute it"`: "what is 6*7? use bash to compute it",
		`run the bash command "echo hi"`:        `run the bash command "echo hi"`,
		`"a" and "b"`:                           `"a" and "b"`,
		`""`:                                    "",
		`"`:                                     `"`,
	} {
		if got := unquoteWhole(q); got != want {
			t.Errorf("unquoteWhole(%q) = %q, want %q", q, got, want)
		}
	}
	if a := noToolAnswer("what is the meaning of life?", bash); !strings.HasPrefix(a, scriptedPrefix) || !strings.Contains(a, "bash") {
		t.Errorf("prose answer %q", a)
	}
}

func TestCorrectedArguments(t *testing.T) {
	enumSchema := json.RawMessage(`{"type":"object","properties":{"profile":{"type":"string","enum":["coder","coder-greedy","llama"]}},"required":["profile"]}`)
	nameSchema := json.RawMessage(`{"type":"object","properties":{"name":{"type":"string"},"verbose":{"type":"boolean"}},"required":["name"]}`)
	for _, tt := range []struct {
		name, prev, errText string
		schema              json.RawMessage
		want                string
	}{
		{"enum value named in the error", `{"profile":"coder"}`, "profile llama is the one that is down; try llama", enumSchema, `{"profile":"llama"}`},
		{"validator message lists the enum", `{"profile":"gpu"}`, "invalid arguments for inference_doctor: argument profile: value must be one of 'coder', 'coder-greedy', 'llama'", enumSchema, `{"profile":"coder"}`},
		{"enum, nothing named: first other value", `{"profile":"coder"}`, "error: the unit failed", enumSchema, `{"profile":"coder-greedy"}`},
		{"free string from a known list", `{"name":"Globx"}`, `no customer named "Globx"; known customers: Globex, Initech`, nameSchema, `{"name":"Globex"}`},
		{"quoted suggestion", `{"name":"acme"}`, `unknown name "acme", did you mean 'ACME Corp'?`, nameSchema, `{"name":"ACME Corp"}`},
		{"nothing to take: unchanged", `{"name":"x"}`, `the CRM timed out`, nameSchema, `{"name":"x"}`},
		{"invalid previous JSON: required filled", `{"name":`, `arguments are not valid JSON`, nameSchema, `{"name":""}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := correctedArguments(tt.schema, tt.prev, tt.errText); got != tt.want {
				t.Errorf("correctedArguments = %s, want %s", got, tt.want)
			}
		})
	}
}

// conversation builds an agent-side chat after one tool call.
func conversation(question, tool, args, result string, retried bool) []any {
	msgs := []any{
		map[string]any{"role": "system", "content": "Tools only read."},
		map[string]any{"role": "user", "content": question},
	}
	n := 1
	if retried {
		n = 2
	}
	for i := 0; i < n; i++ {
		id := "call_" + string(rune('a'+i))
		msgs = append(msgs,
			map[string]any{"role": "assistant", "tool_calls": []any{map[string]any{"id": id, "type": "function",
				"function": map[string]any{"name": tool, "arguments": args}}}},
			map[string]any{"role": "tool", "tool_call_id": id, "content": result})
	}
	return msgs
}

func TestScriptedTurnAfterResults(t *testing.T) {
	tools := boxTools()
	for _, tt := range []struct {
		name      string
		msgs      []any
		offer     bool
		wantCall  string // tool name and arguments of the retry, or ""
		wantText  []string
		wantNoRun bool
	}{
		{"success quoted", conversation("gpu status?", "gpu_status", "{}", "{\n  \"backend\": \"sim\",\n  \"memory_used_mib\": 20000\n}", false), true,
			"", []string{"[simulated model] Based on gpu_status: {", `"backend": "sim", "memory_used_mib": 20000 }`}, false},
		{"error retried with a listed value", conversation("history of Globx", "crm_customer", `{"name":"Globx"}`,
			"[tool error] no customer named \"Globx\"; known customers: Globex, Initech", false), true,
			`crm_customer {"name":"Globex"}`, nil, false},
		{"error after the retry answered honestly", conversation("history of Globx", "crm_customer", `{"name":"Globx"}`,
			"[tool error] the CRM timed out", true), true,
			"", []string{"[simulated model] crm_customer failed: [tool error] the CRM timed out", "could not get the answer"}, false},
		{"error of an unknown tool is not retried", conversation("x", "gpu_reset", `{}`, "unknown tool gpu_reset; available: gpu_status", false), true,
			"", []string{"gpu_reset failed: unknown tool"}, false},
		{"results without tools offered: prose", conversation("gpu?", "gpu_status", "{}", "error: NVML", false), false,
			"", []string{"gpu_status failed"}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var req oaiChatRequest
			body := mustJSON(t, map[string]any{"messages": tt.msgs, "tools": tools})
			if err := json.Unmarshal(body, &req); err != nil {
				t.Fatal(err)
			}
			r, ok := scriptedTurn(&req, tt.offer)
			if !ok {
				t.Fatal("not a scripted turn")
			}
			// The unit log names the tool whose result the request carried.
			if len(r.results) != 1 || r.results[0] != conversationTool(tt.msgs) {
				t.Errorf("results %q", r.results)
			}
			if tt.wantCall != "" {
				if len(r.calls) != 1 || r.calls[0].Name+" "+r.calls[0].Arguments != tt.wantCall {
					t.Fatalf("calls %+v, want %s", r.calls, tt.wantCall)
				}
				return
			}
			if len(r.calls) != 0 {
				t.Fatalf("unexpected calls %+v", r.calls)
			}
			for _, w := range tt.wantText {
				if !strings.Contains(r.text, w) {
					t.Errorf("answer %q lacks %q", r.text, w)
				}
			}
		})
	}
}

// conversationTool is the tool name of conversation's call.
func conversationTool(msgs []any) string {
	b, _ := json.Marshal(msgs)
	var ms []oaiMessage
	_ = json.Unmarshal(b, &ms)
	for _, m := range ms {
		if calls := parseHistCalls(m.ToolCalls); len(calls) > 0 {
			return calls[0].Name
		}
	}
	return ""
}

// streamedCall is one tool call rebuilt from stream deltas.
type streamedCall struct {
	id, name, args string
}

// readToolStream rebuilds tool calls from a chat stream by index, as
// OpenAI clients do, and returns them with the finish reason and usage.
func readToolStream(t *testing.T, body []byte) ([]streamedCall, string, *oaiUsage, string) {
	t.Helper()
	st := parseSSE(t, body)
	if !st.done {
		t.Fatal("stream did not end with [DONE]")
	}
	var calls []streamedCall
	var finish, content string
	var usage *oaiUsage
	for _, ev := range st.events {
		c := decode[chunk](t, ev)
		if c.Usage != nil {
			usage = c.Usage
		}
		for _, ch := range c.Choices {
			if ch.Delta.Content != nil {
				content += *ch.Delta.Content
			}
			for _, d := range ch.Delta.ToolCalls {
				if d.Index == len(calls) {
					if d.ID == "" || d.Function.Name == "" || d.Type != "function" {
						t.Fatalf("first delta of call %d lacks id/name/type: %+v", d.Index, d)
					}
					calls = append(calls, streamedCall{id: d.ID, name: d.Function.Name})
				} else if d.Index != len(calls)-1 || d.ID != "" || d.Function.Name != "" {
					t.Fatalf("delta out of order or repeating id/name: %+v after %d calls", d, len(calls))
				}
				calls[d.Index].args += d.Function.Arguments
			}
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
	}
	return calls, finish, usage, content
}

func TestScriptedToolsHTTP(t *testing.T) {
	vllm, _ := fastVLLM(t, func(o *Options) { o.ScriptedTools = true })
	ollama := startSim(t, Options{Flavor: FlavorOllama, Model: "qwen3:8b", PrefillTPS: 1e6, DecodeTPS: 20000, LoadTime: 1, ScriptedTools: true})
	tools := boxTools()
	ask := func(q string) []any {
		return []any{map[string]any{"role": "system", "content": "Tools only read."}, map[string]any{"role": "user", "content": q}}
	}

	t.Run("vllm streamed: two parallel calls", func(t *testing.T) {
		code, body, _ := vllm.do(t, http.MethodPost, "/v1/chat/completions", chatBody(map[string]any{
			"messages": ask("Show the gpu status and the inference profiles"), "tools": tools, "tool_choice": "auto",
			"stream": true, "stream_options": map[string]any{"include_usage": true}}))
		if code != http.StatusOK {
			t.Fatalf("status %d: %s", code, truncate(body))
		}
		calls, finish, usage, content := readToolStream(t, body)
		if len(calls) != 2 || calls[0].name != "gpu_status" || calls[1].name != "inference_profiles" || calls[0].id == calls[1].id {
			t.Fatalf("calls %+v", calls)
		}
		for _, c := range calls {
			if c.args != "{}" {
				t.Errorf("%s arguments %q", c.name, c.args)
			}
		}
		if finish != "tool_calls" || content != "" {
			t.Errorf("finish %q content %q", finish, content)
		}
		if usage == nil || usage.CompletionTokens != len(tokenize("{}"))*2 {
			t.Errorf("usage %+v", usage)
		}
	})

	t.Run("vllm whole: one call with arguments", func(t *testing.T) {
		code, body, _ := vllm.do(t, http.MethodPost, "/v1/chat/completions", chatBody(map[string]any{
			"messages": ask("What is the history of customer Globex?"), "tools": tools}))
		if code != http.StatusOK {
			t.Fatalf("status %d: %s", code, truncate(body))
		}
		resp := decode[wholeChat](t, body)
		m := resp.Choices[0].Message
		if resp.Choices[0].FinishReason != "tool_calls" || m.Content != nil || len(m.ToolCalls) != 1 {
			t.Fatalf("response %s", body)
		}
		if tc := m.ToolCalls[0]; tc.Function.Name != "crm_customer" || tc.Function.Arguments != `{"name":"Globex"}` || !strings.HasPrefix(tc.ID, "chatcmpl-tool-") {
			t.Errorf("tool call %+v", tc)
		}
	})

	t.Run("vllm whole: two calls", func(t *testing.T) {
		_, body, _ := vllm.do(t, http.MethodPost, "/v1/chat/completions", chatBody(map[string]any{
			"messages": ask("gpu processes and gpu status"), "tools": tools, "tool_choice": "auto"}))
		m := decode[wholeChat](t, body).Choices[0].Message
		if len(m.ToolCalls) != 2 || m.ToolCalls[0].Function.Name != "gpu_processes" || m.ToolCalls[1].Function.Name != "gpu_status" {
			t.Fatalf("response %s", body)
		}
	})

	t.Run("vllm: a failed call is retried, then results answered in prose", func(t *testing.T) {
		msgs := conversation("history of Globx", "crm_customer", `{"name":"Globx"}`,
			"[tool error] no customer named \"Globx\"; known customers: Globex, Initech", false)
		code, body, _ := vllm.do(t, http.MethodPost, "/v1/chat/completions", chatBody(map[string]any{
			"messages": msgs, "tools": tools, "tool_choice": "auto", "stream": true}))
		if code != http.StatusOK {
			t.Fatalf("status %d: %s", code, truncate(body))
		}
		calls, _, _, _ := readToolStream(t, body)
		if len(calls) != 1 || calls[0].name != "crm_customer" || calls[0].args != `{"name":"Globex"}` {
			t.Fatalf("retry %+v", calls)
		}
		msgs = append(msgs, map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": calls[0].id,
			"type": "function", "function": map[string]any{"name": "crm_customer", "arguments": calls[0].args}}}},
			map[string]any{"role": "tool", "tool_call_id": calls[0].id, "content": `{"customer":"Globex","orders":3}`})
		_, body, _ = vllm.do(t, http.MethodPost, "/v1/chat/completions", chatBody(map[string]any{
			"messages": msgs, "tools": tools, "stream": true}))
		calls, finish, _, content := readToolStream(t, body)
		want := `[simulated model] Based on crm_customer: {"customer":"Globex","orders":3}.`
		if len(calls) != 0 || finish != "stop" || content != want {
			t.Fatalf("answer %q finish %q calls %+v, want %q", content, finish, calls, want)
		}
	})

	t.Run("vllm: 2020-12 schemas accepted", func(t *testing.T) {
		code, body, _ := vllm.do(t, http.MethodPost, "/v1/chat/completions", chatBody(map[string]any{
			"messages": ask("edit with tool_05 please"), "tools": bigTools(t), "tool_choice": "auto"}))
		if code != http.StatusOK {
			t.Fatalf("status %d: %s", code, truncate(body))
		}
		m := decode[wholeChat](t, body).Choices[0].Message
		if len(m.ToolCalls) != 1 || !json.Valid([]byte(m.ToolCalls[0].Function.Arguments)) {
			t.Fatalf("response %s", truncate(body))
		}
	})

	t.Run("vllm: tool_choice none is honoured", func(t *testing.T) {
		_, body, _ := vllm.do(t, http.MethodPost, "/v1/chat/completions", chatBody(map[string]any{
			"messages": ask("gpu status?"), "tools": tools, "tool_choice": "none"}))
		m := decode[wholeChat](t, body).Choices[0].Message
		if len(m.ToolCalls) != 0 || m.Content == nil || *m.Content == "" {
			t.Fatalf("response %s", body)
		}
	})

	t.Run("vllm: max_tokens cuts the second call", func(t *testing.T) {
		_, body, _ := vllm.do(t, http.MethodPost, "/v1/chat/completions", chatBody(map[string]any{
			"messages": ask("gpu processes and gpu status"), "tools": tools, "max_tokens": 1}))
		resp := decode[wholeChat](t, body)
		if resp.Choices[0].FinishReason != "length" || len(resp.Choices[0].Message.ToolCalls) != 1 {
			t.Fatalf("response %s", body)
		}
	})

	t.Run("ollama /v1 streamed", func(t *testing.T) {
		body := chatBody(map[string]any{"model": "qwen3:8b", "messages": ask("Which processes use the GPU?"), "tools": tools,
			"stream": true, "stream_options": map[string]any{"include_usage": true}})
		code, data, _ := ollama.do(t, http.MethodPost, "/v1/chat/completions", body)
		if code != http.StatusOK {
			t.Fatalf("status %d: %s", code, truncate(data))
		}
		calls, finish, _, _ := readToolStream(t, data)
		if len(calls) != 1 || calls[0].name != "gpu_processes" || finish != "tool_calls" {
			t.Fatalf("calls %+v finish %q", calls, finish)
		}
	})
}

func TestScriptedToolsOffKeepsFiller(t *testing.T) {
	s, _ := fastVLLM(t, nil)
	_, body, _ := s.do(t, http.MethodPost, "/v1/chat/completions", chatBody(map[string]any{"tools": boxTools()}))
	m := decode[wholeChat](t, body).Choices[0].Message
	if len(m.ToolCalls) != 0 || m.Content == nil || !strings.HasPrefix(*m.Content, replyToken(0)) {
		t.Fatalf("response %s", body)
	}
}

// wholeChat is a non-streamed chat completion.
type wholeChat struct {
	Choices []struct {
		FinishReason string `json:"finish_reason"`
		Message      struct {
			Content   *string `json:"content"`
			ToolCalls []struct {
				ID       string `json:"id"`
				Type     string `json:"type"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"message"`
	} `json:"choices"`
}

// FuzzScriptedChat drives chat bodies through the scripted mode of both
// flavours: no panic, and every planned call has JSON arguments and a name
// from the offered tools.
func FuzzScriptedChat(f *testing.F) {
	for _, s := range chatSeeds {
		f.Add([]byte(s))
	}
	tb, err := json.Marshal(boxTools())
	if err != nil {
		f.Fatal(err)
	}
	tools := string(tb)
	f.Add([]byte(`{"messages":[{"role":"user","content":"gpu status and inference profiles"}],"tools":` + tools + `}`))
	f.Add([]byte(`{"messages":[{"role":"user","content":"q"},{"role":"assistant","tool_calls":[{"id":"a","function":{"name":"crm_customer","arguments":"{\"name\":1}"}}]},{"role":"tool","tool_call_id":"a","content":"error: known customers: 'A', B"}],"tools":` + tools + `}`))
	f.Add([]byte(`{"messages":[{"role":"tool","content":"error"}],"tools":[{"function":{"name":"f","parameters":{"properties":{"x":{"enum":[]}},"required":["x","y"]}}}]}`))
	f.Add([]byte(`{"messages":[{"role":"user","content":"x"}],"tools":[{"function":{"name":"f","parameters":[1]}}],"tool_choice":"auto"}`))
	vllm, ollama := fuzzServer(f, FlavorVLLM), fuzzServer(f, FlavorOllama)
	vllm.opts.EnableAutoToolChoice = true
	vllm.opts.ScriptedTools, ollama.opts.ScriptedTools = true, true
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, s := range []*server{vllm, ollama} {
			j, e := s.prepareChat(data)
			if e != nil {
				continue
			}
			checkPlan(t, s, j)
			var req oaiChatRequest
			_ = json.Unmarshal(data, &req)
			for _, c := range j.toolCalls {
				if !json.Valid([]byte(c.Arguments)) {
					t.Fatalf("arguments %q are not JSON", c.Arguments)
				}
				if findTool(req.Tools, c.Name) == nil {
					t.Fatalf("called %q, not an offered tool", c.Name)
				}
			}
		}
	})
}

func TestFixLookalike(t *testing.T) {
	for _, tc := range []struct {
		arg   string
		cands []string
		want  string
		ok    bool
	}{
		{"6 x 7", []string{"x"}, "6 * 7", true},
		{"6x7", []string{"x"}, "6*7", true},
		{"(2+3) X 4", []string{"X"}, "(2+3) * 4", true},
		{"10 : 2", []string{":"}, "10 / 2", true},
		{"max(1, 2) x 3", []string{"x"}, "max(1, 2) * 3", true}, // the x of max stays
		{"max(1, 2)", []string{"x"}, "", false},
		{"6 y 7", []string{"y"}, "", false},
		{"6 x 7", nil, "", false},
	} {
		got, ok := fixLookalike(tc.arg, tc.cands)
		if got != tc.want || ok != tc.ok {
			t.Errorf("fixLookalike(%q, %q) = %q, %v; want %q, %v", tc.arg, tc.cands, got, ok, tc.want, tc.ok)
		}
	}
}

// FuzzCommandFromQuestion: any question text gives no panic, and a command
// only from a quoted part or from arithmetic (never the question itself).
func FuzzCommandFromQuestion(f *testing.F) {
	for _, s := range []string{"what is 6*7? use bash to compute it", `"echo hi"`, `“x”`, `"`, "", "1+1", "−2×3÷4"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, q string) {
		u := unquoteWhole(q)
		c := commandFromQuestion(u)
		if c != "" && !strings.HasPrefix(c, "awk 'BEGIN { print ") && quotedRe.FindStringSubmatch(u) == nil {
			t.Errorf("command %q from %q without a quoted part", c, q)
		}
	})
}
