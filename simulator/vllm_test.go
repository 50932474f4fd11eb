package simulator

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"gpuhost/internal/testkit"
	"gpuhost/nvml"
)

// fastVLLM is a vLLM simulator fast enough for tests.
func fastVLLM(t *testing.T, mod func(*Options)) (*sim, Options) {
	t.Helper()
	o := Options{Flavor: FlavorVLLM, Model: "Qwen/Qwen3-Coder-30B-A3B-Instruct", ServedName: "qwen3-coder",
		PrefillTPS: 1e6, DecodeTPS: 20000, EnableAutoToolChoice: true, ToolCallParser: "qwen3_xml"}
	if mod != nil {
		mod(&o)
	}
	return startSim(t, o), o
}

func chatBody(extra map[string]any) map[string]any {
	b := map[string]any{
		"model":    "qwen3-coder",
		"messages": []any{map[string]any{"role": "system", "content": "You are terse."}, map[string]any{"role": "user", "content": "Say hello to the simulator."}},
	}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

func TestVLLMListensAfterLoadWithClaim(t *testing.T) {
	dir := t.TempDir()
	const load = 300 * time.Millisecond
	start := time.Now()
	var claimAtReady []nvml.Claim
	var readyAfter time.Duration
	o := Options{Flavor: FlavorVLLM, Model: "m", GPUMemoryUtilization: 0.92, LoadTime: load, SimDir: dir,
		Addr: "127.0.0.1:0", Logger: discard()}
	ready := make(chan string, 1)
	o.Ready = func(addr string) {
		readyAfter = time.Since(start)
		claimAtReady, _ = nvml.ReadClaims(dir)
		ready <- addr
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, o) }()
	// The claim is there during engine start-up, before the server listens.
	testkit.Eventually(t, 15*time.Second, func() bool {
		c, _ := nvml.ReadClaims(dir)
		return len(c) == 1
	}, "claim during load")
	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("not ready")
	}
	if readyAfter < load {
		t.Fatalf("listened after %s, before the %s load time", readyAfter, load)
	}
	if len(claimAtReady) != 1 || claimAtReady[0].PID != os.Getpid() || claimAtReady[0].MiB != 22599 {
		t.Fatalf("claim at ready = %+v, want pid %d with 0.92×24564 = 22599 MiB", claimAtReady, os.Getpid())
	}
	code, body, _ := doCtx(t, context.Background(), http.MethodGet, "http://"+addr+"/health", nil)
	if code != http.StatusOK || len(body) != 0 {
		t.Fatalf("/health = %d %q, want 200 with an empty body", code, body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after cancel: %v", err)
	}
	if c, _ := nvml.ReadClaims(dir); len(c) != 0 {
		t.Fatalf("claims after exit: %+v", c)
	}
}

func TestVLLMStoppedDuringLoadReleasesClaim(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{Flavor: FlavorVLLM, Model: "m", LoadTime: time.Hour, SimDir: dir, Addr: "127.0.0.1:0", Logger: discard()})
	}()
	testkit.Eventually(t, 15*time.Second, func() bool {
		c, _ := nvml.ReadClaims(dir)
		return len(c) == 1 && c[0].MiB == defaultVLLMVRAM
	}, "claim during load")
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if c, _ := nvml.ReadClaims(dir); len(c) != 0 {
		t.Fatalf("claims after exit: %+v", c)
	}
}

func TestVLLMInfoEndpoints(t *testing.T) {
	s, _ := fastVLLM(t, func(o *Options) { o.GPUMemoryUtilization = 0.92; o.MaxModelLen = 65536; o.KVCacheDType = "fp8" })

	code, body, _ := s.do(t, http.MethodGet, "/version", nil)
	if v := decode[map[string]string](t, body); code != 200 || v["version"] != "0.11.0" {
		t.Fatalf("/version = %d %s", code, body)
	}

	code, body, _ = s.do(t, http.MethodGet, "/v1/models", nil)
	models := decode[struct {
		Object string `json:"object"`
		Data   []struct {
			ID          string `json:"id"`
			Object      string `json:"object"`
			OwnedBy     string `json:"owned_by"`
			Root        string `json:"root"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}](t, body)
	if code != 200 || models.Object != "list" || len(models.Data) != 1 {
		t.Fatalf("/v1/models = %d %s", code, body)
	}
	if m := models.Data[0]; m.ID != "qwen3-coder" || m.Object != "model" || m.OwnedBy != "vllm" ||
		m.Root != "Qwen/Qwen3-Coder-30B-A3B-Instruct" || m.MaxModelLen != 65536 {
		t.Fatalf("model card %+v", m)
	}

	samples := scrape(t, s)
	for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
		"vllm:gpu_cache_usage_perc", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
		"vllm:time_to_first_token_seconds_count", "vllm:e2e_request_latency_seconds_sum"} {
		metric(t, samples, name, `model_name="qwen3-coder"`, `engine="0"`)
	}
	if v := metric(t, samples, "vllm:cache_config_info", `gpu_memory_utilization="0.92"`, `block_size="16"`, `cache_dtype="fp8"`); v != 1 {
		t.Fatalf("cache_config_info = %v", v)
	}

	// An alias from --served-model-name is listed and answers.
	alias, _ := fastVLLM(t, func(o *Options) { o.ServedNameAliases = []string{"coder"} })
	_, body, _ = alias.do(t, http.MethodGet, "/v1/models", nil)
	if !strings.Contains(string(body), `"id":"coder"`) || !strings.Contains(string(body), `"id":"qwen3-coder"`) {
		t.Fatalf("/v1/models with an alias: %s", body)
	}
	code, body, _ = alias.do(t, http.MethodPost, "/v1/completions", map[string]any{"model": "coder", "prompt": "x", "max_tokens": 1})
	if r := decode[map[string]any](t, body); code != 200 || r["model"] != "coder" {
		t.Fatalf("alias request = %d %s", code, body)
	}

	code, body, _ = s.do(t, http.MethodGet, "/no/such/route", nil)
	if code != http.StatusNotFound || !strings.Contains(string(body), `"detail":"Not Found"`) {
		t.Fatalf("unknown route = %d %s", code, body)
	}
}

func TestVLLMChatStreamWithUsage(t *testing.T) {
	s, o := fastVLLM(t, nil)
	req := chatBody(map[string]any{"stream": true, "stream_options": map[string]any{"include_usage": true}})
	code, body, hdr := s.do(t, http.MethodPost, "/v1/chat/completions", req)
	if code != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d type %q body %s", code, hdr.Get("Content-Type"), truncate(body))
	}
	st := parseSSE(t, body)
	if !st.done {
		t.Fatal("stream did not end with [DONE]")
	}
	n := o.NaturalTokens
	if n == 0 {
		n = defaultNaturalTokens
	}
	// role chunk + n token chunks + usage chunk
	if len(st.events) != n+2 {
		t.Fatalf("%d events, want %d", len(st.events), n+2)
	}
	var text strings.Builder
	id := ""
	for i, raw := range st.events {
		c := decode[chunk](t, raw)
		if c.Object != "chat.completion.chunk" || c.Model != "qwen3-coder" {
			t.Fatalf("event %d: object %q model %q", i, c.Object, c.Model)
		}
		if id == "" {
			id = c.ID
		} else if c.ID != id {
			t.Fatalf("event %d: id %q differs from %q", i, c.ID, id)
		}
		switch {
		case i == 0:
			if len(c.Choices) != 1 || c.Choices[0].Delta.Role == nil || *c.Choices[0].Delta.Role != "assistant" {
				t.Fatalf("first chunk is not the role chunk: %s", raw)
			}
		case i == len(st.events)-1:
			if len(c.Choices) != 0 || c.Usage == nil {
				t.Fatalf("last chunk is not the usage chunk: %s", raw)
			}
			if c.Usage.CompletionTokens != n || c.Usage.TotalTokens != c.Usage.PromptTokens+n {
				t.Fatalf("usage %+v, want %d completion tokens", c.Usage, n)
			}
		default:
			if c.Usage != nil || len(c.Choices) != 1 || c.Choices[0].Delta.Content == nil {
				t.Fatalf("token chunk %d malformed: %s", i, raw)
			}
			text.WriteString(*c.Choices[0].Delta.Content)
			fr := c.Choices[0].FinishReason
			if i == n && (fr == nil || *fr != "stop") {
				t.Fatalf("last token chunk finish_reason %v, want stop", fr)
			}
			if i < n && fr != nil {
				t.Fatalf("chunk %d has finish_reason %q early", i, *fr)
			}
		}
	}
	if text.String() != replyText(n) {
		t.Fatalf("streamed text %q", text.String())
	}
	// usage.prompt_tokens is what /tokenize says for the same messages.
	usage := decode[chunk](t, st.events[len(st.events)-1]).Usage
	code, body, _ = s.do(t, http.MethodPost, "/tokenize", map[string]any{"model": "qwen3-coder", "messages": req["messages"]})
	tok := decode[struct {
		Count       int   `json:"count"`
		MaxModelLen int   `json:"max_model_len"`
		Tokens      []int `json:"tokens"`
	}](t, body)
	if code != 200 || tok.Count != usage.PromptTokens || len(tok.Tokens) != tok.Count || tok.MaxModelLen != defaultVLLMMaxLen {
		t.Fatalf("/tokenize = %d %+v, usage.prompt_tokens %d", code, tok, usage.PromptTokens)
	}
	// Without include_usage there is no usage chunk.
	_, body, _ = s.do(t, http.MethodPost, "/v1/chat/completions", chatBody(map[string]any{"stream": true, "max_tokens": 3}))
	st = parseSSE(t, body)
	if len(st.events) != 4 || !st.done {
		t.Fatalf("without usage: %d events", len(st.events))
	}
	if c := decode[chunk](t, st.events[3]); c.Usage != nil || *c.Choices[0].FinishReason != "length" {
		t.Fatalf("last chunk %s", st.events[3])
	}
	// continuous_usage_stats puts the running usage on every chunk.
	_, body, _ = s.do(t, http.MethodPost, "/v1/chat/completions", chatBody(map[string]any{"stream": true, "max_tokens": 3,
		"stream_options": map[string]any{"include_usage": true, "continuous_usage_stats": true}}))
	st = parseSSE(t, body)
	for i, raw := range st.events {
		c := decode[chunk](t, raw)
		if c.Usage == nil || c.Usage.CompletionTokens != min(i, 3) || c.Usage.PromptTokens != usage.PromptTokens {
			t.Fatalf("chunk %d usage %+v", i, c.Usage)
		}
	}
}

func TestVLLMTokenLimits(t *testing.T) {
	s, _ := fastVLLM(t, func(o *Options) { o.MaxModelLen = 4096 })
	tests := []struct {
		name       string
		extra      map[string]any
		wantTokens int
		wantFinish string
	}{
		{"natural length", nil, defaultNaturalTokens, "stop"},
		{"max_tokens caps", map[string]any{"max_tokens": 5}, 5, "length"},
		{"max_completion_tokens wins", map[string]any{"max_tokens": 50, "max_completion_tokens": 7}, 7, "length"},
		{"cap above natural length", map[string]any{"max_tokens": 500}, defaultNaturalTokens, "stop"},
		{"ignore_eos runs to the cap", map[string]any{"max_tokens": 300, "ignore_eos": true}, 300, "length"},
		{"min_tokens lengthens", map[string]any{"max_tokens": 300, "min_tokens": 100}, 100, "stop"},
		{"min_tokens beyond the cap", map[string]any{"max_tokens": 80, "min_tokens": 100}, 80, "length"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, stream := range []bool{false, true} {
				extra := map[string]any{"stream": stream}
				if stream {
					extra["stream_options"] = map[string]any{"include_usage": true}
				}
				for k, v := range tt.extra {
					extra[k] = v
				}
				code, body, _ := s.do(t, http.MethodPost, "/v1/chat/completions", chatBody(extra))
				if code != 200 {
					t.Fatalf("status %d: %s", code, body)
				}
				var got int
				var finish, text string
				if stream {
					st := parseSSE(t, body)
					for _, raw := range st.events {
						c := decode[chunk](t, raw)
						if c.Usage != nil {
							got = c.Usage.CompletionTokens
						}
						for _, ch := range c.Choices {
							if ch.Delta.Content != nil {
								text += *ch.Delta.Content
							}
							if ch.FinishReason != nil {
								finish = *ch.FinishReason
							}
						}
					}
				} else {
					r := decode[struct {
						Object  string `json:"object"`
						Choices []struct {
							Message struct {
								Role    string `json:"role"`
								Content string `json:"content"`
							} `json:"message"`
							FinishReason string `json:"finish_reason"`
						} `json:"choices"`
						Usage oaiUsage `json:"usage"`
					}](t, body)
					if r.Object != "chat.completion" || len(r.Choices) != 1 || r.Choices[0].Message.Role != "assistant" {
						t.Fatalf("response %s", truncate(body))
					}
					got, finish, text = r.Usage.CompletionTokens, r.Choices[0].FinishReason, r.Choices[0].Message.Content
				}
				if got != tt.wantTokens || finish != tt.wantFinish || text != replyText(tt.wantTokens) {
					t.Fatalf("stream=%v: %d tokens, finish %q; want %d, %q", stream, got, finish, tt.wantTokens, tt.wantFinish)
				}
			}
		})
	}
}

func TestVLLMCompletions(t *testing.T) {
	s, _ := fastVLLM(t, nil)
	prompt := "Once upon a time, in a data center far away,"
	code, body, _ := s.do(t, http.MethodPost, "/v1/completions", map[string]any{"model": "qwen3-coder", "prompt": prompt, "max_tokens": 10})
	r := decode[struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Choices []struct {
			Text         string `json:"text"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage oaiUsage `json:"usage"`
	}](t, body)
	if code != 200 || r.Object != "text_completion" || !strings.HasPrefix(r.ID, "cmpl-") || len(r.Choices) != 1 {
		t.Fatalf("response %d %s", code, body)
	}
	if r.Choices[0].Text != replyText(10) || r.Choices[0].FinishReason != "length" || r.Usage.CompletionTokens != 10 {
		t.Fatalf("choice %+v usage %+v", r.Choices[0], r.Usage)
	}
	_, body, _ = s.do(t, http.MethodPost, "/tokenize", map[string]any{"prompt": prompt, "return_token_strs": true})
	tok := decode[struct {
		Count     int      `json:"count"`
		TokenStrs []string `json:"token_strs"`
	}](t, body)
	if tok.Count != r.Usage.PromptTokens || strings.Join(tok.TokenStrs, "") != prompt {
		t.Fatalf("/tokenize %+v vs usage %+v", tok, r.Usage)
	}

	_, body, _ = s.do(t, http.MethodPost, "/v1/completions", map[string]any{"prompt": []int{1, 2, 3}, "max_tokens": 4,
		"stream": true, "stream_options": map[string]any{"include_usage": true}})
	st := parseSSE(t, body)
	if len(st.events) != 5 || !st.done {
		t.Fatalf("%d events", len(st.events))
	}
	var text string
	for _, raw := range st.events[:4] {
		c := decode[chunk](t, raw)
		if c.Object != "text_completion" || c.Choices[0].Text == nil {
			t.Fatalf("chunk %s", raw)
		}
		text += *c.Choices[0].Text
	}
	if u := decode[chunk](t, st.events[4]).Usage; text != replyText(4) || u == nil || u.PromptTokens != 3 || u.CompletionTokens != 4 {
		t.Fatalf("text %q usage %+v", text, u)
	}
}

func TestVLLMErrors(t *testing.T) {
	s, _ := fastVLLM(t, func(o *Options) { o.MaxModelLen = 64 })
	noAuto, _ := fastVLLM(t, func(o *Options) { o.EnableAutoToolChoice = false; o.ToolCallParser = "" })
	long := strings.Repeat("word ", 100)
	tools := []any{map[string]any{"type": "function", "function": map[string]any{"name": "f", "parameters": map[string]any{"type": "object"}}}}
	tests := []struct {
		name     string
		srv      *sim
		path     string
		body     any
		status   int
		errType  string
		contains string
	}{
		{"bad json", s, "/v1/chat/completions", `{"model":`, 400, "BadRequestError", "invalid JSON"},
		{"empty body", s, "/v1/chat/completions", ``, 400, "BadRequestError", "empty"},
		{"wrong type", s, "/v1/chat/completions", `{"messages":"hi"}`, 400, "BadRequestError", "invalid JSON"},
		{"no messages", s, "/v1/chat/completions", map[string]any{"model": "qwen3-coder"}, 400, "BadRequestError", "messages"},
		{"unknown model", s, "/v1/chat/completions", map[string]any{"model": "gpt-4", "messages": []any{map[string]any{"role": "user", "content": "x"}}},
			404, "NotFoundError", "The model `gpt-4` does not exist."},
		{"unknown model completions", s, "/v1/completions", map[string]any{"model": "x", "prompt": "p"}, 404, "NotFoundError", "The model `x` does not exist."},
		{"prompt too long", s, "/v1/completions", map[string]any{"prompt": long}, 400, "BadRequestError", "maximum context length is 64 tokens"},
		{"chat too long", s, "/v1/chat/completions", chatBody(map[string]any{"messages": []any{map[string]any{"role": "user", "content": long}}}),
			400, "BadRequestError", "maximum context length is 64 tokens"},
		{"max_tokens too large", s, "/v1/completions", map[string]any{"prompt": "hi", "max_tokens": 100}, 400, "BadRequestError", "'max_tokens' or 'max_completion_tokens' is too large: 100"},
		{"max_tokens zero", s, "/v1/completions", map[string]any{"prompt": "hi", "max_tokens": 0}, 400, "BadRequestError", "at least 1"},
		{"stream options without stream", s, "/v1/chat/completions", chatBody(map[string]any{"stream_options": map[string]any{"include_usage": true}}),
			400, "BadRequestError", "stream=True"},
		{"n above one", s, "/v1/completions", map[string]any{"prompt": "hi", "n": 2}, 400, "BadRequestError", "n=1"},
		{"empty prompt", s, "/v1/completions", map[string]any{"prompt": ""}, 400, "BadRequestError", "cannot be empty"},
		{"tool not in tools", s, "/v1/chat/completions", chatBody(map[string]any{"tools": tools, "tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": "g"}}}),
			400, "BadRequestError", "Tool 'g'"},
		{"auto tools not enabled", noAuto, "/v1/chat/completions", chatBody(map[string]any{"tools": tools}), 400, "BadRequestError", "--enable-auto-tool-choice"},
		{"tokenize wrong model", s, "/tokenize", map[string]any{"model": "x", "prompt": "p"}, 404, "NotFoundError", "does not exist"},
		{"tokenize nothing", s, "/tokenize", map[string]any{}, 400, "BadRequestError", "prompt or messages"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body, hdr := tt.srv.do(t, http.MethodPost, tt.path, tt.body)
			if code != tt.status || hdr.Get("Content-Type") != "application/json" {
				t.Fatalf("status %d (%s), want %d: %s", code, hdr.Get("Content-Type"), tt.status, body)
			}
			e := decode[openAIError](t, body)
			if e.Error.Type != tt.errType || !strings.Contains(e.Error.Message, tt.contains) || e.Error.Code != float64(tt.status) {
				t.Fatalf("error %+v, want type %s containing %q", e.Error, tt.errType, tt.contains)
			}
		})
	}
}

// bigTools builds a tool list of about 30 KB using JSON Schema 2020-12
// keywords, like an agent (opencode, Claude Code) sends.
func bigTools(t *testing.T) []any {
	t.Helper()
	var tools []any
	for i := 0; len(mustJSON(t, tools)) < 30<<10; i++ {
		tools = append(tools, map[string]any{
			"type": "function",
			"function": map[string]any{
				"name":        fmt.Sprintf("tool_%02d", i),
				"description": "Edits a file <with> \"quotes\" & symbols; returns a diff of the change applied to the workspace.",
				"parameters": map[string]any{
					"$schema": "https://json-schema.org/draft/2020-12/schema",
					"type":    "object",
					"$defs": map[string]any{
						"range": map[string]any{"type": "array", "prefixItems": []any{map[string]any{"type": "integer"}, map[string]any{"type": "integer"}}, "items": false},
						"edit":  map[string]any{"type": "object", "properties": map[string]any{"range": map[string]any{"$ref": "#/$defs/range"}, "text": map[string]any{"type": "string"}}, "unevaluatedProperties": false},
					},
					"properties": map[string]any{
						"path":   map[string]any{"type": "string", "pattern": "^[^<>]+$"},
						"edits":  map[string]any{"type": "array", "items": map[string]any{"$ref": "#/$defs/edit"}, "minItems": 1},
						"mode":   map[string]any{"enum": []any{"replace", "insert"}},
						"dryRun": map[string]any{"type": []any{"boolean", "null"}},
						"opts":   map[string]any{"type": "object", "dependentSchemas": map[string]any{"a": map[string]any{"required": []any{"b"}}}, "if": map[string]any{"properties": map[string]any{"a": map[string]any{"const": 1}}}, "then": map[string]any{"required": []any{"c"}}},
					},
					"required":              []any{"path", "edits", "mode", "dryRun"},
					"unevaluatedProperties": false,
				},
			},
		})
	}
	return tools
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestVLLMLargeToolRequest(t *testing.T) {
	s, _ := fastVLLM(t, nil)
	tools := bigTools(t)
	if n := len(mustJSON(t, tools)); n < 30<<10 {
		t.Fatalf("tool list only %d bytes", n)
	}
	messages := []any{map[string]any{"role": "user", "content": "Fix the bug in main.go"}}

	t.Run("auto answers with text", func(t *testing.T) {
		code, body, _ := s.do(t, http.MethodPost, "/v1/chat/completions", map[string]any{"model": "qwen3-coder", "messages": messages,
			"tools": tools, "tool_choice": "auto", "stream": true, "stream_options": map[string]any{"include_usage": true}})
		if code != 200 {
			t.Fatalf("status %d: %s", code, truncate(body))
		}
		st := parseSSE(t, body)
		u := decode[chunk](t, st.events[len(st.events)-1]).Usage
		_, tb, _ := s.do(t, http.MethodPost, "/tokenize", map[string]any{"messages": messages, "tools": tools})
		count := decode[struct {
			Count int `json:"count"`
		}](t, tb).Count
		if u == nil || u.PromptTokens != count || u.CompletionTokens != defaultNaturalTokens || count < 5000 {
			t.Fatalf("usage %+v, /tokenize count %d", u, count)
		}
	})

	t.Run("required calls the first tool", func(t *testing.T) {
		code, body, _ := s.do(t, http.MethodPost, "/v1/chat/completions", map[string]any{"model": "qwen3-coder", "messages": messages,
			"tools": tools, "tool_choice": "required", "stream": true})
		if code != 200 {
			t.Fatalf("status %d: %s", code, truncate(body))
		}
		st := parseSSE(t, body)
		var name, args, finish string
		for _, raw := range st.events {
			c := decode[chunk](t, raw)
			for _, ch := range c.Choices {
				for _, tc := range ch.Delta.ToolCalls {
					if tc.Function.Name != "" {
						name = tc.Function.Name
					}
					args += tc.Function.Arguments
				}
				if ch.FinishReason != nil {
					finish = *ch.FinishReason
				}
			}
		}
		var parsed map[string]any
		if err := json.Unmarshal([]byte(args), &parsed); err != nil {
			t.Fatalf("arguments %q are not JSON: %v", args, err)
		}
		if name != "tool_00" || finish != "tool_calls" || parsed["path"] != "" || parsed["mode"] != "replace" || len(parsed) != 4 {
			t.Fatalf("tool call %s(%s) finish %q", name, args, finish)
		}
	})

	t.Run("named function non-stream", func(t *testing.T) {
		code, body, _ := s.do(t, http.MethodPost, "/v1/chat/completions", map[string]any{"model": "qwen3-coder", "messages": messages,
			"tools": tools, "tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": "tool_03"}}})
		r := decode[struct {
			Choices []struct {
				Message struct {
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
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
		}](t, body)
		if code != 200 || len(r.Choices) != 1 || len(r.Choices[0].Message.ToolCalls) != 1 || r.Choices[0].Message.Content != nil {
			t.Fatalf("response %d %s", code, truncate(body))
		}
		tc := r.Choices[0].Message.ToolCalls[0]
		if tc.Function.Name != "tool_03" || tc.Type != "function" || !strings.HasPrefix(tc.ID, "chatcmpl-tool-") || !json.Valid([]byte(tc.Function.Arguments)) {
			t.Fatalf("tool call %+v", tc)
		}
	})
}

// With one sequence slot, a second request waits (and is counted as
// waiting) until the first is done.
func TestVLLMMaxNumSeqsQueues(t *testing.T) {
	s, _ := fastVLLM(t, func(o *Options) { o.MaxNumSeqs = 1; o.DecodeTPS = 200 })
	first := openStream(t, s, chatBody(map[string]any{"stream": true, "max_tokens": 400, "ignore_eos": true}))
	defer first.close()
	if _, err := first.r.next(); err != nil { // running now
		t.Fatal(err)
	}
	secondDone := make(chan int, 1)
	go func() {
		st := openStream(t, s, chatBody(map[string]any{"stream": true, "max_tokens": 3, "stream_options": map[string]any{"include_usage": true}}))
		defer st.close()
		n := 0
		for {
			ev, err := st.r.next()
			if err != nil || ev == "[DONE]" {
				break
			}
			n++
		}
		secondDone <- n
	}()
	testkit.Eventually(t, 15*time.Second, func() bool {
		m := scrape(t, s)
		return metric(t, m, "vllm:num_requests_waiting") == 1 && metric(t, m, "vllm:num_requests_running") == 1
	}, "second request waiting")
	select {
	case <-secondDone:
		t.Fatal("second request finished while the only slot was busy")
	default:
	}
	first.close() // the client goes away; its slot frees up
	select {
	case n := <-secondDone:
		if n != 5 { // role + 3 tokens + usage
			t.Fatalf("second request got %d events", n)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("second request never ran")
	}
	m := scrape(t, s)
	if metric(t, m, "vllm:num_requests_waiting") != 0 || metric(t, m, "vllm:num_requests_running") != 0 {
		t.Fatalf("queue not drained: %v", m)
	}
}

type liveStream struct {
	r      *sseReader
	cancel context.CancelFunc
	body   io.Closer
}

func (l *liveStream) close() {
	l.cancel()
	l.body.Close()
}

func openStream(t *testing.T, s *sim, body any) *liveStream {
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.base+"/v1/chat/completions", strings.NewReader(string(mustJSON(t, body))))
	if err != nil {
		cancel()
		t.Error(err)
		return nil
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Error(err)
		return nil
	}
	if resp.StatusCode != 200 {
		cancel()
		t.Errorf("stream status %d", resp.StatusCode)
	}
	return &liveStream{r: newSSEReader(resp.Body), cancel: cancel, body: resp.Body}
}

func TestVLLMDisconnectCancelsGeneration(t *testing.T) {
	s, _ := fastVLLM(t, func(o *Options) { o.DecodeTPS = 500 })
	st := openStream(t, s, chatBody(map[string]any{"stream": true, "max_tokens": 20000, "ignore_eos": true}))
	for i := 0; i < 5; i++ {
		if _, err := st.r.next(); err != nil {
			t.Fatal(err)
		}
	}
	st.close()
	testkit.Eventually(t, 15*time.Second, func() bool {
		m := scrape(t, s)
		return metric(t, m, "vllm:num_requests_running") == 0 &&
			metric(t, m, "vllm:request_success_total", `finished_reason="abort"`) == 1
	}, "aborted request to leave the engine")
	m := scrape(t, s)
	if g := metric(t, m, "vllm:generation_tokens_total"); g >= 20000 || g < 4 {
		t.Fatalf("generation_tokens_total = %v after an early disconnect", g)
	}
	if u := metric(t, m, "vllm:kv_cache_usage_perc"); u != 0 {
		t.Fatalf("KV cache still used after abort: %v", u)
	}
}

func TestVLLMMetricsCount(t *testing.T) {
	s, _ := fastVLLM(t, nil)
	for _, mt := range []int{3, 4} {
		if code, body, _ := s.do(t, http.MethodPost, "/v1/completions", map[string]any{"prompt": "a b c", "max_tokens": mt}); code != 200 {
			t.Fatalf("status %d %s", code, body)
		}
	}
	s.do(t, http.MethodPost, "/v1/completions", map[string]any{"prompt": "a b c", "max_tokens": 100})
	m := scrape(t, s)
	checks := map[string]float64{
		"vllm:prompt_tokens_total":               9,
		"vllm:generation_tokens_total":           3 + 4 + defaultNaturalTokens,
		"vllm:time_to_first_token_seconds_count": 3,
		"vllm:e2e_request_latency_seconds_count": 3,
		"vllm:num_requests_running":              0,
	}
	for name, want := range checks {
		if got := metric(t, m, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if got := metric(t, m, "vllm:request_success_total", `finished_reason="length"`); got != 2 {
		t.Errorf("length finishes = %v", got)
	}
	if got := metric(t, m, "vllm:request_success_total", `finished_reason="stop"`); got != 1 {
		t.Errorf("stop finishes = %v", got)
	}
	if got := metric(t, m, "vllm:time_to_first_token_seconds_bucket", `le="+Inf"`); got != 3 {
		t.Errorf("+Inf bucket = %v", got)
	}
}

// Time to first token is at least prompt/PrefillTPS (a lower bound only, so
// a slow machine cannot fail it).
func TestVLLMTimeToFirstTokenLowerBound(t *testing.T) {
	s, _ := fastVLLM(t, func(o *Options) { o.PrefillTPS = 1000 })
	prompt := strings.TrimSpace(strings.Repeat("word ", 250)) // 250 tokens → ≥ 250 ms
	start := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.base+"/v1/completions",
		strings.NewReader(string(mustJSON(t, map[string]any{"prompt": prompt, "max_tokens": 2, "stream": true}))))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := newSSEReader(resp.Body).next(); err != nil {
		t.Fatal(err)
	}
	if ttft := time.Since(start); ttft < 250*time.Millisecond {
		t.Fatalf("first token after %s, want ≥ 250ms for 250 prompt tokens at 1000 tok/s", ttft)
	}
}

func TestVLLMShutdownWithStreamInFlight(t *testing.T) {
	dir := t.TempDir()
	s, _ := fastVLLM(t, func(o *Options) { o.DecodeTPS = 100; o.SimDir = dir })
	st := openStream(t, s, chatBody(map[string]any{"stream": true, "max_tokens": 20000, "ignore_eos": true}))
	defer st.close()
	if _, err := st.r.next(); err != nil {
		t.Fatal(err)
	}
	if err := s.stop(t); err != nil {
		t.Fatalf("Run = %v, want nil after a graceful stop", err)
	}
	for {
		ev, err := st.r.next()
		if err != nil || ev == "[DONE]" {
			break
		}
	}
	if c, _ := nvml.ReadClaims(dir); len(c) != 0 {
		t.Fatalf("claims after exit: %+v", c)
	}
}

// Each event is flushed as it is generated: when the client sees the first
// token, the server has generated only a few (an unflushed response would
// arrive in one 4 KiB lump, dozens of tokens later).
func TestVLLMStreamFlushesEachEvent(t *testing.T) {
	s, _ := fastVLLM(t, func(o *Options) { o.DecodeTPS = 10 })
	st := openStream(t, s, chatBody(map[string]any{"stream": true, "max_tokens": 1000, "ignore_eos": true}))
	defer st.close()
	for i := 0; i < 2; i++ { // role chunk, first token
		if _, err := st.r.next(); err != nil {
			t.Fatal(err)
		}
	}
	if g := metric(t, scrape(t, s), "vllm:generation_tokens_total"); g > 6 {
		t.Fatalf("client saw its first token only after %v were generated", g)
	}
}

func TestRunErrors(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	dir := t.TempDir()
	err = Run(context.Background(), Options{Flavor: FlavorVLLM, Model: "m", Addr: busy.Addr().String(), SimDir: dir, Logger: discard()})
	if err == nil || !strings.Contains(err.Error(), "listen on "+busy.Addr().String()) {
		t.Fatalf("Run on a busy port = %v", err)
	}
	if c, _ := nvml.ReadClaims(dir); len(c) != 0 {
		t.Fatalf("claim left after a failed start: %+v", c)
	}
	err = Run(context.Background(), Options{Flavor: FlavorOllama, Addr: busy.Addr().String(), Logger: discard()})
	if err == nil || !strings.Contains(err.Error(), "simulated ollama: listen") {
		t.Fatalf("Ollama Run on a busy port = %v", err)
	}
	if err := Run(context.Background(), Options{Flavor: FlavorVLLM}); err == nil || !strings.Contains(err.Error(), "needs a model") {
		t.Fatalf("Run without a model = %v", err)
	}
	// A claims path that cannot be a directory makes vLLM fail to start.
	file := dir + "/file"
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err = Run(context.Background(), Options{Flavor: FlavorVLLM, Model: "m", Addr: "127.0.0.1:0", SimDir: file + "/sub", Logger: discard()})
	if err == nil || !strings.Contains(err.Error(), "claim 20000 MiB of simulated VRAM") {
		t.Fatalf("Run with a bad claims dir = %v", err)
	}
}
