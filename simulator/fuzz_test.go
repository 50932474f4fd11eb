package simulator

import (
	"encoding/json"
	"strings"
	"testing"
)

func fuzzServer(t testing.TB, f Flavor) *server {
	o, err := Options{Flavor: f, Model: "m", MaxModelLen: 512, Logger: discard()}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	return newServer(o)
}

var chatSeeds = []string{
	`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}`,
	`{"messages":[{"role":"system","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]},{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"1","content":"ok"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","$defs":{"a":{"prefixItems":[{"type":"integer"}]}},"properties":{"x":{"type":["string","null"]},"y":{"enum":[3]}},"required":["x","y","z"],"unevaluatedProperties":false}}}],"tool_choice":"required"}`,
	`{"messages":[{"role":"user","content":"x"}],"tools":[{"function":{"name":"g"}}],"tool_choice":{"type":"function","function":{"name":"g"}},"max_completion_tokens":1}`,
	`{"messages":[{"role":"user","content":"x"}],"min_tokens":3,"ignore_eos":true,"max_tokens":9,"n":1}`,
	`{"messages":[{"role":"user","content":5}]}`,
	`{"messages":[]}`,
	`[]`,
	`{"messages":[{"role":"user","content":"x"}],"max_tokens":-1}`,
}

// FuzzPrepareChat drives chat bodies through decoding, templating,
// tokenizing and planning for both flavours: no panic, and an accepted body
// gives a sane plan.
func FuzzPrepareChat(f *testing.F) {
	for _, s := range chatSeeds {
		f.Add([]byte(s))
	}
	vllm, ollama := fuzzServer(f, FlavorVLLM), fuzzServer(f, FlavorOllama)
	vllm.opts.EnableAutoToolChoice = true
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, s := range []*server{vllm, ollama} {
			j, e := s.prepareChat(data)
			if e != nil {
				if e.message == "" || e.status < 400 {
					t.Fatalf("bad error %+v", e)
				}
				continue
			}
			checkPlan(t, s, j)
			for _, c := range j.toolCalls {
				if !json.Valid([]byte(c.Arguments)) {
					t.Fatalf("tool call arguments %q are not JSON", c.Arguments)
				}
			}
		}
	})
}

func FuzzPrepareCompletion(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"hello","max_tokens":3}`, `{"prompt":["a b"]}`, `{"prompt":[1,2,3]}`,
		`{"prompt":[[1,2]],"stream":true,"stream_options":{}}`, `{"prompt":["a","b"]}`, `{"prompt":null}`, `{"prompt":{}}`,
	} {
		f.Add([]byte(s))
	}
	vllm, ollama := fuzzServer(f, FlavorVLLM), fuzzServer(f, FlavorOllama)
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, s := range []*server{vllm, ollama} {
			j, e := s.prepareCompletion(data)
			if e != nil {
				if e.message == "" || e.status < 400 {
					t.Fatalf("bad error %+v", e)
				}
				continue
			}
			checkPlan(t, s, j)
		}
	})
}

func checkPlan(t *testing.T, s *server, j *openAIJob) {
	t.Helper()
	if j.job.tokens < 0 || j.job.promptTokens < 0 {
		t.Fatalf("negative plan %+v", j.job)
	}
	switch j.finish {
	case "stop", "length", "tool_calls":
	default:
		t.Fatalf("finish reason %q", j.finish)
	}
	if s.opts.Flavor == FlavorVLLM && j.job.promptTokens+j.job.tokens > s.opts.MaxModelLen {
		t.Fatalf("vLLM plan exceeds the context: %+v", j.job)
	}
	if s.opts.Flavor == FlavorOllama && j.job.promptTokens > s.opts.MaxModelLen {
		t.Fatalf("Ollama prompt not truncated: %+v", j.job)
	}
	if j.toolCalls != nil && j.job.tokens > len(j.toolCallToks) {
		t.Fatalf("tool call plan %d tokens for %d argument tokens", j.job.tokens, len(j.toolCallToks))
	}
}

func FuzzTokenizeBody(f *testing.F) {
	f.Add([]byte(`{"prompt":"hello world","return_token_strs":true}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"add_generation_prompt":false,"tools":[{"type":"function","function":{"name":"f"}}]}`))
	f.Add([]byte(`{"messages":[]}`))
	s := fuzzServer(f, FlavorVLLM)
	f.Fuzz(func(t *testing.T, data []byte) {
		toks, _, e := s.tokenizeBody(data)
		if e != nil {
			return
		}
		var req struct {
			Prompt *string `json:"prompt"`
		}
		if json.Unmarshal(data, &req) == nil && req.Prompt != nil && strings.Join(toks, "") != *req.Prompt {
			t.Fatalf("prompt tokens do not rebuild the prompt")
		}
	})
}

func FuzzDecodeOllamaRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"qwen3","prompt":"hi","system":"be brief","options":{"num_predict":3,"num_ctx":8},"keep_alive":"1m"}`,
		`{"model":"qwen3","messages":[{"role":"user","content":"hi","images":["aGk="]},{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f","arguments":{}}}]}],"tools":[{"type":"function"}],"stream":false,"keep_alive":0}`,
		`{"model":"qwen3","raw":true,"prompt":"<|im_start|>","context":[1,2,3]}`,
		`{"model":"","keep_alive":-5}`, `{"model":"x","keep_alive":true}`, `{}`, ``,
	} {
		f.Add([]byte(s))
	}
	s := fuzzServer(f, FlavorOllama)
	f.Fuzz(func(t *testing.T, data []byte) {
		req, ka, e := decodeOllamaRequest(data, 5*60e9)
		if e != nil {
			if e.message == "" {
				t.Fatal("empty error message")
			}
			return
		}
		if req.Model == "" {
			t.Fatal("accepted a request without a model")
		}
		if ka < -1 {
			t.Fatalf("keep_alive %v", ka)
		}
		for _, chat := range []bool{false, true} {
			p := s.ollamaPrompt(req, chat)
			if !chat && req.Raw && p != req.Prompt {
				t.Fatalf("raw prompt changed: %q", p)
			}
			_ = tokenize(p)
		}
	})
}
