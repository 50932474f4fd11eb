package bench

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestParseSSE(t *testing.T) {
	for _, c := range []struct {
		name    string
		in      string
		events  int
		wantErr string
	}{
		{"vllm", "data: {\"a\":1}\n\ndata: {\"b\":2}\n\ndata: [DONE]\n\n", 2, ""},
		{"no space, CRLF, comments", ": ping\r\nevent: x\r\ndata:{\"a\":1}\r\n\r\ndata:[DONE]\r\n", 1, ""},
		{"broken off", "data: {\"a\":1}\n\n", 1, "without [DONE]"},
		{"empty", "", 0, "without [DONE]"},
		{"long line", "data: {\"x\":\"" + strings.Repeat("y", 200000) + "\"}\n\ndata: [DONE]\n", 1, ""},
		{"done without newline", "data: [DONE]", 0, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := 0
			err := parseSSE(strings.NewReader(c.in), func(data []byte, _ time.Time) error {
				n++
				if data[0] != '{' {
					t.Errorf("payload %q", data)
				}
				return nil
			})
			if c.wantErr == "" && err != nil || c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
				t.Fatalf("err = %v, want %q", err, c.wantErr)
			}
			var se *StreamError
			if err != nil && !errors.As(err, &se) {
				t.Errorf("error %T is not a StreamError", err)
			}
			if n != c.events {
				t.Errorf("%d events, want %d", n, c.events)
			}
		})
	}
}

func TestSampleOnChunk(t *testing.T) {
	s := &sample{start: time.Now(), prompt: -1, completion: -1}
	chunks := []string{
		`{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`, // vLLM role chunk: no token
		`{"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}`,
		`{"choices":[{"index":0,"delta":{"reasoning_content":"hm"}}]}`,
		`{"choices":[{"index":0,"text":" there","finish_reason":"length"}]}`,
		`{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}`,
	}
	for _, c := range chunks {
		if err := s.onChunk([]byte(c), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if len(s.tokenAt) != 3 || s.prompt != 12 || s.completion != 3 || s.finish != "length" {
		t.Fatalf("sample = %+v", s)
	}
	for _, bad := range []string{
		`{"error":{"message":"boom","type":"InternalServerError","code":500}}`,
		`{"object":"error","message":"engine dead"}`,
		`not json`,
	} {
		if err := s.onChunk([]byte(bad), time.Now()); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

func TestParseNDJSON(t *testing.T) {
	in := "{\"response\":\"a\",\"done\":false}\n\n{\"response\":\"b\",\"done\":false}\n{\"done\":true,\"eval_count\":2}\n{\"ignored\":true}\n"
	n := 0
	err := parseNDJSON(strings.NewReader(in), func(line []byte, _ time.Time) (bool, error) {
		n++
		return strings.Contains(string(line), `"done":true`), nil
	})
	if err != nil || n != 3 {
		t.Fatalf("n=%d err=%v", n, err)
	}
	err = parseNDJSON(strings.NewReader("{\"done\":false}\n"), func([]byte, time.Time) (bool, error) { return false, nil })
	if err == nil || !strings.Contains(err.Error(), "without a final") {
		t.Fatalf("broken-off stream: %v", err)
	}
}

func TestPromCounter(t *testing.T) {
	text := []byte(`# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="qwen"} 1234.0
vllm:prompt_tokens_total{engine="1",model_name="we}ird \"x\""} 66 1700000000
vllm:prompt_tokens_total_created{engine="0"} 1.7e9
vllm:prompt_tokens_totalx 5
vllm:generation_tokens_total 7e2
`)
	if v, ok := promCounter(text, "vllm:prompt_tokens_total"); !ok || v != 1300 {
		t.Errorf("prompt = %v %v, want 1300", v, ok)
	}
	if v, ok := promCounter(text, "vllm:generation_tokens_total"); !ok || v != 700 {
		t.Errorf("generation = %v %v, want 700", v, ok)
	}
	if _, ok := promCounter(text, "vllm:absent_total"); ok {
		t.Error("absent metric found")
	}
}

func TestErrorMessage(t *testing.T) {
	for body, want := range map[string]string{
		`{"error":{"message":"The model x does not exist.","type":"NotFoundError","code":404}}`: "The model x does not exist.",
		`{"error":"model 'x' not found"}`:         "model 'x' not found",
		`{"detail":"Not Found"}`:                  "Not Found",
		`{"object":"error","message":"bad"}`:      "bad",
		`<html>gateway</html>`:                    "", // markup: the HTTP status text says more
		`  <!DOCTYPE html><p>Not Found</p>`:       "",
		`{"detail":[{"loc":["body"],"msg":"x"}]}`: `[{"loc":["body"],"msg":"x"}]`,
	} {
		if got := errorMessage([]byte(body)); got != want {
			t.Errorf("errorMessage(%s) = %q, want %q", body, got, want)
		}
	}
}

func TestErrorCode(t *testing.T) {
	for body, want := range map[string]string{
		`{"error":{"message":"model \"x\" is not loaded and proxy.auto_switch is off","type":"invalid_request_error","code":"model_not_loaded"}}`: "model_not_loaded",
		`{"error":{"message":"The model x does not exist.","code":404}}`:                                                                          "", // not a string code
		`{"error":"model 'x' not found"}`: "",
		`<html>gateway</html>`:            "",
	} {
		if got := errorCode([]byte(body)); got != want {
			t.Errorf("errorCode(%s) = %q, want %q", body, got, want)
		}
	}
}

func TestTargetNormalize(t *testing.T) {
	for _, c := range []struct {
		t         Target
		api, root string
		bad       bool
	}{
		{t: Target{URL: "http://h:8000"}, api: "http://h:8000/v1", root: "http://h:8000"},
		{t: Target{URL: "http://h:8000/v1/"}, api: "http://h:8000/v1", root: "http://h:8000"},
		{t: Target{URL: "https://box/v1", ServerURL: "http://127.0.0.1:8001"}, api: "https://box/v1", root: "http://127.0.0.1:8001"},
		{t: Target{URL: ""}, bad: true},
		{t: Target{URL: "h:8000"}, bad: true},
		{t: Target{URL: "http://h", ServerURL: "ftp://x"}, bad: true},
	} {
		api, root, err := c.t.normalize()
		if c.bad != (err != nil) || api != c.api || root != c.root {
			t.Errorf("%+v: %q %q %v", c.t, api, root, err)
		}
	}
}

func TestResolveModel(t *testing.T) {
	served := []modelInfo{{ID: "tiny:latest"}, {ID: "llama3.1:8b"}}
	if m, err := resolveModel("tiny", served); err != nil || m.ID != "tiny:latest" {
		t.Errorf("tiny → %v %v", m, err)
	}
	if _, err := resolveModel("", served); err == nil || !strings.Contains(err.Error(), "--model") {
		t.Errorf("two models, none named: %v", err)
	}
	if _, err := resolveModel("qwen", served); err == nil || !strings.Contains(err.Error(), "not served") {
		t.Errorf("unknown model: %v", err)
	}
	if _, err := resolveModel("", nil); err == nil {
		t.Error("no models: no error")
	}
}

func FuzzParseSSE(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}],\"usage\":{\"prompt_tokens\":1}}\n\ndata: [DONE]\n"))
	f.Add([]byte("data: {\"error\":\"x\"}\n"))
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"tool_calls\":[{}]}}]}\ndata:"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s := &sample{start: time.Now(), prompt: -1, completion: -1}
		_ = parseSSE(strings.NewReader(string(data)), func(d []byte, at time.Time) error { return s.onChunk(d, at) })
		if len(s.tokenAt) > len(data) {
			t.Fatalf("%d tokens from %d bytes", len(s.tokenAt), len(data))
		}
	})
}

func FuzzParseNDJSON(f *testing.F) {
	f.Add([]byte("{\"response\":\"a\"}\n{\"done\":true,\"eval_count\":1,\"eval_duration\":5}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_ = parseNDJSON(strings.NewReader(string(data)), func(line []byte, _ time.Time) (bool, error) {
			return strings.Contains(string(line), "done"), nil
		})
	})
}

func FuzzPromCounter(f *testing.F) {
	f.Add([]byte("vllm:x_total{a=\"}\\\"\"} 3\nvllm:x_total 4 5\n"), "vllm:x_total")
	f.Fuzz(func(t *testing.T, text []byte, name string) {
		_, _ = promCounter(text, name)
	})
}

func FuzzErrorMessage(f *testing.F) {
	f.Add([]byte(`{"error":{"message":"x"}}`))
	f.Fuzz(func(t *testing.T, body []byte) { _ = errorMessage(body) })
}
