package simulator

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"gpuhost/internal/testkit"
	"gpuhost/nvml"
)

func fastOllama(t *testing.T, mod func(*Options)) (*sim, Options) {
	t.Helper()
	o := Options{Flavor: FlavorOllama, Model: "qwen3:8b", Models: []string{"gemma3", "qwen3:8b"},
		PrefillTPS: 1e6, DecodeTPS: 20000, LoadTime: 50 * time.Millisecond}
	if mod != nil {
		mod(&o)
	}
	return startSim(t, o), o
}

// ollamaFinal is the last object of /api/generate and /api/chat.
type ollamaFinal struct {
	Model     string `json:"model"`
	CreatedAt string `json:"created_at"`
	Response  string `json:"response"`
	Message   *struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	} `json:"message"`
	Done               bool   `json:"done"`
	DoneReason         string `json:"done_reason"`
	Context            []int  `json:"context"`
	TotalDuration      int64  `json:"total_duration"`
	LoadDuration       int64  `json:"load_duration"`
	PromptEvalCount    int    `json:"prompt_eval_count"`
	PromptEvalDuration int64  `json:"prompt_eval_duration"`
	EvalCount          int    `json:"eval_count"`
	EvalDuration       int64  `json:"eval_duration"`
}

// parseNDJSON splits an NDJSON body strictly: one JSON object per line.
func parseNDJSON(t *testing.T, body []byte) []ollamaFinal {
	t.Helper()
	var out []ollamaFinal
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !json.Valid(line) {
			t.Fatalf("NDJSON line is not JSON: %q", line)
		}
		out = append(out, decode[ollamaFinal](t, line))
	}
	if !bytes.HasSuffix(body, []byte("\n")) {
		t.Fatal("NDJSON body does not end with a newline")
	}
	return out
}

type psResponse struct {
	Models []struct {
		Name          string `json:"name"`
		Model         string `json:"model"`
		Size          int64  `json:"size"`
		SizeVRAM      int64  `json:"size_vram"`
		ExpiresAt     string `json:"expires_at"`
		ContextLength int    `json:"context_length"`
		Digest        string `json:"digest"`
		Details       struct {
			Family string `json:"family"`
			Format string `json:"format"`
		} `json:"details"`
	} `json:"models"`
}

func ps(t *testing.T, s *sim) psResponse {
	t.Helper()
	code, body, _ := s.do(t, http.MethodGet, "/api/ps", nil)
	if code != 200 {
		t.Fatalf("/api/ps status %d", code)
	}
	return decode[psResponse](t, body)
}

func TestOllamaInfoEndpoints(t *testing.T) {
	s, _ := fastOllama(t, nil)
	code, body, _ := s.do(t, http.MethodGet, "/", nil)
	if code != 200 || string(body) != "Ollama is running" {
		t.Fatalf("/ = %d %q", code, body)
	}
	if code, _, _ := s.do(t, http.MethodHead, "/", nil); code != 200 {
		t.Fatalf("HEAD / = %d", code)
	}
	_, body, _ = s.do(t, http.MethodGet, "/api/version", nil)
	if v := decode[map[string]string](t, body); v["version"] != "0.17.4" {
		t.Fatalf("/api/version %s", body)
	}
	_, body, _ = s.do(t, http.MethodGet, "/api/tags", nil)
	tags := decode[struct {
		Models []struct {
			Name       string `json:"name"`
			Model      string `json:"model"`
			ModifiedAt string `json:"modified_at"`
			Size       int64  `json:"size"`
			Digest     string `json:"digest"`
			Details    struct {
				Format            string   `json:"format"`
				Family            string   `json:"family"`
				Families          []string `json:"families"`
				ParameterSize     string   `json:"parameter_size"`
				QuantizationLevel string   `json:"quantization_level"`
			} `json:"details"`
		} `json:"models"`
	}](t, body)
	if len(tags.Models) != 2 || tags.Models[0].Name != "qwen3:8b" || tags.Models[1].Name != "gemma3:latest" {
		t.Fatalf("/api/tags %s", body)
	}
	m := tags.Models[0]
	if _, err := time.Parse(time.RFC3339Nano, m.ModifiedAt); err != nil || m.Size <= 0 || len(m.Digest) != 64 ||
		m.Details.Format != "gguf" || m.Details.Family != "qwen3" || m.Details.ParameterSize != "8B" || m.Details.QuantizationLevel == "" {
		t.Fatalf("tag entry %+v", m)
	}
	if p := ps(t, s); len(p.Models) != 0 {
		t.Fatalf("models loaded before any request: %+v", p)
	}
	_, body, _ = s.do(t, http.MethodGet, "/v1/models", nil)
	list := decode[struct {
		Object string `json:"object"`
		Data   []struct {
			ID      string `json:"id"`
			OwnedBy string `json:"owned_by"`
		} `json:"data"`
	}](t, body)
	if list.Object != "list" || len(list.Data) != 2 || list.Data[0].ID != "qwen3:8b" || list.Data[0].OwnedBy != "library" {
		t.Fatalf("/v1/models %s", body)
	}
	if code, _, _ := s.do(t, http.MethodGet, "/v1/models/gemma3", nil); code != 200 {
		t.Fatalf("/v1/models/gemma3 = %d", code)
	}
	code, body, _ = s.do(t, http.MethodPost, "/api/show", map[string]any{"model": "gemma3"})
	if code != 200 || !strings.Contains(string(body), `"capabilities"`) {
		t.Fatalf("/api/show = %d %s", code, body)
	}
}

func TestOllamaGenerateLoadsAndClaims(t *testing.T) {
	dir := t.TempDir()
	s, o := fastOllama(t, func(o *Options) { o.SimDir = dir; o.LoadTime = 200 * time.Millisecond; o.VRAMMiB = 5000 })
	if c, _ := nvml.ReadClaims(dir); len(c) != 0 {
		t.Fatalf("claim before any load: %+v", c)
	}
	code, body, hdr := s.do(t, http.MethodPost, "/api/generate", map[string]any{"model": "qwen3:8b", "prompt": "Why is the sky blue?"})
	if code != 200 || hdr.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("status %d type %q: %s", code, hdr.Get("Content-Type"), truncate(body))
	}
	lines := parseNDJSON(t, body)
	if len(lines) != defaultNaturalTokens+1 {
		t.Fatalf("%d lines, want %d tokens + final", len(lines), defaultNaturalTokens)
	}
	var text string
	for i, l := range lines[:len(lines)-1] {
		if l.Done || l.Model != "qwen3:8b" || l.Response == "" {
			t.Fatalf("line %d: %+v", i, l)
		}
		if _, err := time.Parse(time.RFC3339Nano, l.CreatedAt); err != nil {
			t.Fatalf("created_at %q: %v", l.CreatedAt, err)
		}
		text += l.Response
	}
	f := lines[len(lines)-1]
	if text != replyText(defaultNaturalTokens) || !f.Done || f.DoneReason != "stop" || f.Response != "" || f.EvalCount != defaultNaturalTokens {
		t.Fatalf("final %+v text %q", f, text)
	}
	if f.LoadDuration < int64(o.LoadTime) || f.TotalDuration < f.LoadDuration+f.PromptEvalDuration ||
		f.PromptEvalCount < 5 || f.EvalDuration <= 0 || len(f.Context) != f.PromptEvalCount+f.EvalCount {
		t.Fatalf("timings/counts %+v", f)
	}

	claims, _ := nvml.ReadClaims(dir)
	if len(claims) != 1 || claims[0].PID != os.Getpid() || claims[0].MiB != 5000 || claims[0].Name != "ollama qwen3:8b" {
		t.Fatalf("claims while loaded: %+v", claims)
	}
	p := ps(t, s)
	if len(p.Models) != 1 || p.Models[0].Name != "qwen3:8b" || p.Models[0].SizeVRAM != 5000<<20 || p.Models[0].Size != 5000<<20 ||
		p.Models[0].ContextLength != defaultOllamaCtx {
		t.Fatalf("/api/ps %+v", p)
	}
	exp, err := time.Parse(time.RFC3339Nano, p.Models[0].ExpiresAt)
	if err != nil || time.Until(exp) < 4*time.Minute || time.Until(exp) > 5*time.Minute+time.Second {
		t.Fatalf("expires_at %q (%v), want about now+5m", p.Models[0].ExpiresAt, err)
	}

	// A second request finds the model loaded.
	_, body, _ = s.do(t, http.MethodPost, "/api/generate", map[string]any{"model": "qwen3:8b", "prompt": "Again", "stream": false})
	f = decode[ollamaFinal](t, body)
	if f.LoadDuration != 0 || f.Response != replyText(defaultNaturalTokens) || f.DoneReason != "stop" {
		t.Fatalf("second request %+v", f)
	}

	// keep_alive 0 with an empty prompt unloads and releases the claim.
	code, body, _ = s.do(t, http.MethodPost, "/api/generate", map[string]any{"model": "qwen3:8b", "keep_alive": 0})
	if f := decode[ollamaFinal](t, body); code != 200 || !f.Done || f.DoneReason != "unload" {
		t.Fatalf("unload = %d %s", code, body)
	}
	if p := ps(t, s); len(p.Models) != 0 {
		t.Fatalf("still loaded after unload: %+v", p)
	}
	if c, _ := nvml.ReadClaims(dir); len(c) != 0 {
		t.Fatalf("claims after unload: %+v", c)
	}

	// An empty chat loads the model again; stopping the server releases it.
	code, body, _ = s.do(t, http.MethodPost, "/api/chat", map[string]any{"model": "qwen3:8b", "messages": []any{}})
	if f := decode[ollamaFinal](t, body); code != 200 || f.DoneReason != "load" || f.Message == nil || f.Message.Role != "assistant" {
		t.Fatalf("load = %d %s", code, body)
	}
	if c, _ := nvml.ReadClaims(dir); len(c) != 1 {
		t.Fatalf("claims after load: %+v", c)
	}
	if err := s.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if c, _ := nvml.ReadClaims(dir); len(c) != 0 {
		t.Fatalf("claims after exit: %+v", c)
	}
}

func TestOllamaChatAndLimits(t *testing.T) {
	s, _ := fastOllama(t, nil)
	// <|im_start|> user \n Hello " there" <|im_end|> \n <|im_start|> assistant \n
	msgs := []any{map[string]any{"role": "user", "content": "Hello there"}}
	tests := []struct {
		name       string
		options    map[string]any
		wantTokens int
		wantReason string
	}{
		{"natural", nil, defaultNaturalTokens, "stop"},
		{"num_predict caps", map[string]any{"num_predict": 7}, 7, "length"},
		{"num_predict -1 is natural", map[string]any{"num_predict": -1}, defaultNaturalTokens, "stop"},
		{"num_predict above natural", map[string]any{"num_predict": 500}, defaultNaturalTokens, "stop"},
		{"num_predict -2 caps at the context", map[string]any{"num_predict": -2, "num_ctx": 40}, 40 - 10, "length"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, stream := range []bool{true, false} {
				req := map[string]any{"model": "gemma3", "messages": msgs, "stream": stream}
				if tt.options != nil {
					req["options"] = tt.options
				}
				code, body, _ := s.do(t, http.MethodPost, "/api/chat", req)
				if code != 200 {
					t.Fatalf("status %d %s", code, body)
				}
				var text string
				var final ollamaFinal
				if stream {
					lines := parseNDJSON(t, body)
					for _, l := range lines[:len(lines)-1] {
						text += l.Message.Content
					}
					final = lines[len(lines)-1]
				} else {
					final = decode[ollamaFinal](t, body)
					text = final.Message.Content
				}
				if final.Model != "gemma3" || !final.Done || final.DoneReason != tt.wantReason || final.EvalCount != tt.wantTokens ||
					text != replyText(tt.wantTokens) || final.PromptEvalCount != 10 {
					t.Fatalf("stream=%v final %+v, %d chars", stream, final, len(text))
				}
			}
		})
	}
}

func TestOllamaErrors(t *testing.T) {
	s, _ := fastOllama(t, nil)
	tests := []struct {
		name   string
		path   string
		body   any
		status int
		want   string
	}{
		{"unknown model generate", "/api/generate", map[string]any{"model": "llama9", "prompt": "x"}, 404, "model 'llama9' not found"},
		{"unknown model chat", "/api/chat", map[string]any{"model": "x:1b", "messages": []any{}}, 404, "model 'x:1b' not found"},
		{"no model", "/api/generate", map[string]any{"prompt": "x"}, 400, "model is required"},
		{"bad json", "/api/chat", `{"model":`, 400, "unexpected end of JSON input"},
		{"empty body", "/api/generate", ``, 400, "missing request body"},
		{"bad keep_alive", "/api/generate", map[string]any{"model": "gemma3", "keep_alive": "10"}, 400, "keep_alive"},
		{"show unknown", "/api/show", map[string]any{"model": "nope"}, 404, "model 'nope' not found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body, _ := s.do(t, http.MethodPost, tt.path, tt.body)
			e := decode[map[string]string](t, body)
			if code != tt.status || !strings.Contains(e["error"], tt.want) {
				t.Fatalf("= %d %s, want %d containing %q", code, body, tt.status, tt.want)
			}
		})
	}
	code, body, _ := s.do(t, http.MethodPost, "/v1/chat/completions", map[string]any{"model": "nope", "messages": []any{map[string]any{"role": "user", "content": "x"}}})
	e := decode[openAIError](t, body)
	if code != 404 || e.Error.Type != "not_found_error" || e.Error.Message != "model 'nope' not found" || e.Error.Code != nil {
		t.Fatalf("/v1 unknown model = %d %s", code, body)
	}
}

func TestOllamaOpenAIStream(t *testing.T) {
	s, _ := fastOllama(t, nil)
	code, body, _ := s.do(t, http.MethodPost, "/v1/chat/completions", map[string]any{
		"model": "qwen3:8b", "messages": []any{map[string]any{"role": "user", "content": "Hi"}},
		"stream": true, "stream_options": map[string]any{"include_usage": true}, "max_tokens": 6,
	})
	if code != 200 {
		t.Fatalf("status %d %s", code, body)
	}
	st := parseSSE(t, body)
	// 6 token chunks + final finish chunk + usage chunk
	if !st.done || len(st.events) != 8 {
		t.Fatalf("%d events, done %v", len(st.events), st.done)
	}
	var text string
	for i, raw := range st.events[:7] {
		c := decode[chunk](t, raw)
		if c.SystemFingerprint != "fp_ollama" || c.Model != "qwen3:8b" || len(c.Choices) != 1 ||
			c.Choices[0].Delta.Role == nil || *c.Choices[0].Delta.Role != "assistant" {
			t.Fatalf("chunk %d %s", i, raw)
		}
		text += *c.Choices[0].Delta.Content
		if fr := c.Choices[0].FinishReason; (i == 6) != (fr != nil) || (fr != nil && *fr != "length") {
			t.Fatalf("chunk %d finish_reason %v", i, fr)
		}
	}
	u := decode[chunk](t, st.events[7])
	if text != replyText(6) || u.Usage == nil || len(u.Choices) != 0 || u.Usage.CompletionTokens != 6 || u.Usage.PromptTokens != 9 {
		t.Fatalf("text %q usage chunk %s", text, st.events[7])
	}
	// The /v1 request loaded the model like a native one.
	if p := ps(t, s); len(p.Models) != 1 || p.Models[0].Name != "qwen3:8b" {
		t.Fatalf("/api/ps %+v", p)
	}
}

// Asking for another model swaps it in: the resident one is unloaded first,
// so one claim names the new model.
func TestOllamaSwitchesModels(t *testing.T) {
	dir := t.TempDir()
	s, _ := fastOllama(t, func(o *Options) { o.SimDir = dir })
	for _, m := range []string{"qwen3:8b", "gemma3", "qwen3:8b"} {
		_, body, _ := s.do(t, http.MethodPost, "/api/generate", map[string]any{"model": m, "prompt": "hi", "stream": false, "options": map[string]any{"num_predict": 1}})
		if f := decode[ollamaFinal](t, body); f.LoadDuration == 0 || f.EvalCount != 1 {
			t.Fatalf("%s: %+v, want a load", m, f)
		}
		p := ps(t, s)
		claims, _ := nvml.ReadClaims(dir)
		if len(p.Models) != 1 || p.Models[0].Name != normalizeTag(m) || len(claims) != 1 || claims[0].Name != "ollama "+normalizeTag(m) {
			t.Fatalf("after %s: ps %+v claims %+v", m, p, claims)
		}
	}
}

func TestOllamaKeepAliveExpires(t *testing.T) {
	dir := t.TempDir()
	s, _ := fastOllama(t, func(o *Options) { o.SimDir = dir })
	_, body, _ := s.do(t, http.MethodPost, "/api/generate", map[string]any{"model": "gemma3", "prompt": "hi", "stream": false, "keep_alive": "150ms"})
	if f := decode[ollamaFinal](t, body); !f.Done {
		t.Fatalf("%s", body)
	}
	testkit.Eventually(t, 15*time.Second, func() bool { return len(ps(t, s).Models) == 0 }, "model to unload after keep_alive")
	if c, _ := nvml.ReadClaims(dir); len(c) != 0 {
		t.Fatalf("claims after expiry: %+v", c)
	}
	// keep_alive -1 keeps it "forever".
	s.do(t, http.MethodPost, "/api/generate", map[string]any{"model": "gemma3", "keep_alive": -1})
	p := ps(t, s)
	exp, _ := time.Parse(time.RFC3339Nano, p.Models[0].ExpiresAt)
	if len(p.Models) != 1 || time.Until(exp) < 100*365*24*time.Hour {
		t.Fatalf("keep_alive -1: %+v", p)
	}
}

// Unloading while a request runs waits for it, then frees the model.
func TestOllamaUnloadWaitsForRunningRequest(t *testing.T) {
	s, _ := fastOllama(t, func(o *Options) { o.DecodeTPS = 50 })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.base+"/api/generate",
		strings.NewReader(`{"model":"gemma3","prompt":"hi","options":{"num_predict":60}}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	if !sc.Scan() { // generating now
		t.Fatal("no first line")
	}
	_, body, _ := s.do(t, http.MethodPost, "/api/generate", map[string]any{"model": "gemma3", "keep_alive": 0})
	if f := decode[ollamaFinal](t, body); f.DoneReason != "unload" {
		t.Fatalf("%s", body)
	}
	if len(ps(t, s).Models) != 1 {
		t.Fatal("unloaded while a request was generating")
	}
	lines := 1
	for sc.Scan() {
		lines++
	}
	if lines != 61 {
		t.Fatalf("running request got %d lines, want 61", lines)
	}
	testkit.Eventually(t, 15*time.Second, func() bool { return len(ps(t, s).Models) == 0 }, "unload after the request")
}

func TestParseKeepAlive(t *testing.T) {
	tests := []struct {
		raw  string
		want time.Duration
		ok   bool
	}{
		{``, 5 * time.Minute, true}, {`null`, 5 * time.Minute, true}, {`0`, 0, true}, {`"0"`, 0, true},
		{`"10m"`, 10 * time.Minute, true}, {`30`, 30 * time.Second, true}, {`1.5`, 1500 * time.Millisecond, true},
		{`-1`, -1, true}, {`"-1m"`, -1, true}, {`1e300`, -1, true},
		{`"10"`, 0, false}, {`true`, 0, false}, {`{}`, 0, false}, {`"`, 0, false},
	}
	for _, tt := range tests {
		got, err := parseKeepAlive(json.RawMessage(tt.raw), 5*time.Minute)
		if (err == nil) != tt.ok || (tt.ok && got != tt.want) {
			t.Errorf("parseKeepAlive(%s) = %v, %v; want %v ok=%v", tt.raw, got, err, tt.want, tt.ok)
		}
	}
}

// Standby the Ollama way: an empty generate or chat with keep_alive 0 (in
// any of its spellings) unloads the model, which empties /api/ps and
// releases all of the process's simulated VRAM (an idle `ollama serve` holds
// none, so no claim remains); an empty request, or one with a positive
// keep_alive, loads it again in the load time and claims the VRAM back.
func TestOllamaStandbyUnloadAndLoad(t *testing.T) {
	unloads := []struct {
		name string
		path string
		body map[string]any
	}{
		{"generate number 0", "/api/generate", map[string]any{"model": "qwen3:8b", "keep_alive": 0}},
		{"generate string 0", "/api/generate", map[string]any{"model": "qwen3:8b", "keep_alive": "0"}},
		{"generate 0s and empty prompt", "/api/generate", map[string]any{"model": "qwen3:8b", "prompt": "", "keep_alive": "0s"}},
		{"chat number 0", "/api/chat", map[string]any{"model": "qwen3:8b", "keep_alive": 0}},
		{"chat empty messages 0s", "/api/chat", map[string]any{"model": "qwen3:8b", "messages": []any{}, "keep_alive": "0s"}},
	}
	loads := []struct {
		name string
		path string
		body map[string]any
	}{
		{"empty generate", "/api/generate", map[string]any{"model": "qwen3:8b"}},
		{"empty chat with keep_alive 10m", "/api/chat", map[string]any{"model": "qwen3:8b", "keep_alive": "10m"}},
		{"generate with keep_alive 60", "/api/generate", map[string]any{"model": "qwen3:8b", "keep_alive": 60}},
		{"a real request", "/api/generate", map[string]any{"model": "qwen3:8b", "prompt": "hi", "stream": false}},
	}
	for i, un := range unloads {
		ld := loads[i%len(loads)]
		t.Run(un.name+" then "+ld.name, func(t *testing.T) {
			dir := t.TempDir()
			gpu := nvml.NewSim(nvml.SimConfig{Dir: dir})
			used := func() (uint64, int) {
				snap, err := gpu.Snapshot(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				d, _ := snap.Device0()
				return d.MemoryUsedMiB - nvml.DefaultSimBaselineMiB, len(d.Processes)
			}
			s, _ := fastOllama(t, func(o *Options) { o.SimDir = dir; o.VRAMMiB = 5000 })
			s.do(t, http.MethodPost, "/api/generate", map[string]any{"model": "qwen3:8b"})
			if mib, n := used(); mib != 5000 || n != 1 || len(ps(t, s).Models) != 1 {
				t.Fatalf("loaded: %d MiB in %d processes", mib, n)
			}

			code, body, _ := s.do(t, http.MethodPost, un.path, un.body)
			raw := decode[map[string]any](t, body)
			f := decode[ollamaFinal](t, body)
			if code != 200 || !f.Done || f.DoneReason != "unload" || f.Model != "qwen3:8b" {
				t.Fatalf("unload = %d %s", code, body)
			}
			if _, err := time.Parse(time.RFC3339Nano, f.CreatedAt); err != nil {
				t.Fatalf("created_at %q: %v", f.CreatedAt, err)
			}
			wantKeys := []string{"created_at", "done", "done_reason", "model", "response"}
			if un.path == "/api/chat" {
				wantKeys = []string{"created_at", "done", "done_reason", "message", "model"}
				if f.Message == nil || f.Message.Role != "assistant" || f.Message.Content != "" {
					t.Fatalf("chat unload message %+v", f.Message)
				}
			} else if f.Response != "" {
				t.Fatalf("generate unload response %q", f.Response)
			}
			if len(raw) != len(wantKeys) {
				t.Fatalf("unload answer %s; want exactly the keys %v", body, wantKeys)
			}
			for _, k := range wantKeys {
				if _, ok := raw[k]; !ok {
					t.Fatalf("unload answer %s lacks %q", body, k)
				}
			}
			if p := ps(t, s); len(p.Models) != 0 {
				t.Fatalf("/api/ps after unload: %+v", p)
			}
			if mib, n := used(); mib != 0 || n != 0 {
				t.Fatalf("after unload: %d MiB in %d processes; want none", mib, n)
			}
			// Unloading what is not loaded is answered the same way.
			if code, body, _ := s.do(t, http.MethodPost, un.path, un.body); code != 200 || decode[ollamaFinal](t, body).DoneReason != "unload" {
				t.Fatalf("second unload = %d %s", code, body)
			}

			code, body, _ = s.do(t, http.MethodPost, ld.path, ld.body)
			if f := decode[ollamaFinal](t, body); code != 200 || !f.Done || (f.DoneReason != "load" && f.LoadDuration == 0) {
				t.Fatalf("load = %d %s", code, body)
			}
			p := ps(t, s)
			if len(p.Models) != 1 || p.Models[0].Name != "qwen3:8b" || p.Models[0].SizeVRAM != 5000<<20 {
				t.Fatalf("/api/ps after load: %+v", p)
			}
			if mib, n := used(); mib != 5000 || n != 1 {
				t.Fatalf("after load: %d MiB in %d processes; want 5000 in one", mib, n)
			}
		})
	}
}

// A load claims the VRAM when it begins; the model shows in /api/ps only
// once loaded (here never: the load outlasts the test, which then stops the
// server, and the claim goes with it).
func TestOllamaLoadClaimsBeforeListing(t *testing.T) {
	dir := t.TempDir()
	s, _ := fastOllama(t, func(o *Options) { o.SimDir = dir; o.LoadTime = time.Hour })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.base+"/api/generate", strings.NewReader(`{"model":"gemma3"}`))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	testkit.Eventually(t, 15*time.Second, func() bool {
		c, _ := nvml.ReadClaims(dir)
		return len(c) == 1 && c[0].Name == "ollama gemma3:latest"
	}, "claim when the load begins")
	if p := ps(t, s); len(p.Models) != 0 {
		t.Fatalf("/api/ps lists a model still loading: %+v", p)
	}
	cancel()
	if err := s.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if c, _ := nvml.ReadClaims(dir); len(c) != 0 {
		t.Fatalf("claims after a stop during the load: %+v", c)
	}
}
