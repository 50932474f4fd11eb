package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	"gpuhost/internal/sse"
)

// Flavor is the kind of server behind an endpoint; it decides how output
// length is forced and which cross-checks exist.
type Flavor string

// Known flavours. FlavorOpenAI is any other OpenAI-compatible server: it is
// measured through /v1 alone, without extras.
const (
	FlavorVLLM   Flavor = "vllm"
	FlavorOllama Flavor = "ollama"
	FlavorOpenAI Flavor = "openai"
)

// Target is the endpoint a run measures.
type Target struct {
	// URL is the OpenAI-compatible endpoint, with or without the trailing
	// /v1 (http://127.0.0.1:8000 and http://127.0.0.1:8000/v1 are the same).
	URL string `json:"url"`
	// ServerURL is the backend's own root for the extras (/version,
	// /api/version, /tokenize, /metrics, Ollama's /api/generate and
	// /api/ps); default URL without /v1. Set it when URL is a proxy such as
	// the daemon's /v1, which forwards only the OpenAI routes.
	ServerURL string `json:"server_url,omitempty"`
	// Model is the model name sent in requests; empty means the only model
	// the server lists.
	Model string `json:"model,omitempty"`
	// APIKey, when set, is sent as a bearer token (the daemon's /v1 beyond
	// loopback needs one). It is never stored in results.
	APIKey string `json:"-"`
	// Flavor forces the server kind; empty means detect it from /version
	// (vLLM) or /api/version (Ollama).
	Flavor Flavor `json:"flavor,omitempty"`
}

// normalize splits the target into the /v1 base and the server root.
func (t Target) normalize() (api, root string, err error) {
	u := strings.TrimRight(strings.TrimSpace(t.URL), "/")
	if u == "" {
		return "", "", errors.New("no endpoint URL: give --url or run against the daemon's /v1")
	}
	if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
		return "", "", fmt.Errorf("endpoint URL %q: want http:// or https://", t.URL)
	}
	base := strings.TrimSuffix(u, "/v1")
	api = base + "/v1"
	root = base
	if s := strings.TrimRight(strings.TrimSpace(t.ServerURL), "/"); s != "" {
		if !strings.HasPrefix(s, "http://") && !strings.HasPrefix(s, "https://") {
			return "", "", fmt.Errorf("server URL %q: want http:// or https://", t.ServerURL)
		}
		root = strings.TrimSuffix(s, "/v1")
	}
	return api, root, nil
}

// endpoint talks to the server under test.
type endpoint struct {
	hc     *http.Client
	api    string // .../v1
	root   string // server root for the extras
	key    string
	flavor Flavor
	model  string
}

// maxErrorBody bounds how much of an error answer is read for its message.
const maxErrorBody = 8 << 10

// HTTPError is a non-2xx answer, with the server's own message when it sent
// one in a known shape (OpenAI, Ollama or FastAPI errors).
type HTTPError struct {
	Method, URL string
	Status      int
	Message     string
	// Code is the OpenAI-shaped error's "code" ({"error":{"code"}}), when
	// the server sent one: gpuhost's /v1 says "model_not_loaded",
	// "hold_timeout" … there.
	Code string
}

func (e *HTTPError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	return fmt.Sprintf("%s %s: HTTP %d: %s", e.Method, e.URL, e.Status, msg)
}

// errorMessage extracts the message of an error body in the shapes servers
// use: {"error":{"message"}}, {"error":"…"}, {"message"}, {"detail"}.
func errorMessage(body []byte) string {
	body = bytes.TrimSpace(body)
	var v struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
		Detail  json.RawMessage `json:"detail"`
	}
	if json.Unmarshal(body, &v) == nil {
		if len(v.Error) > 0 && string(v.Error) != "null" {
			var s string
			if json.Unmarshal(v.Error, &s) == nil {
				return s
			}
			var o struct {
				Message string `json:"message"`
			}
			if json.Unmarshal(v.Error, &o) == nil && o.Message != "" {
				return o.Message
			}
		}
		if v.Message != "" {
			return v.Message
		}
		if len(v.Detail) > 0 {
			var s string
			if json.Unmarshal(v.Detail, &s) == nil {
				return s
			}
			return string(v.Detail)
		}
	}
	if len(body) > 0 && body[0] == '<' {
		// An HTML or XML page (a web server's 404, a login page): its
		// markup says nothing to an operator; the status text does.
		return ""
	}
	s := string(body)
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

// errorCode is the "code" of an OpenAI-shaped error body, "" when there is
// none (or it is not a string).
func errorCode(body []byte) string {
	var v struct {
		Error struct {
			Code any `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(bytes.TrimSpace(body), &v) != nil {
		return ""
	}
	c, _ := v.Error.Code.(string)
	return c
}

// describeTransport turns a transport failure into a sentence an operator
// acts on: a refused connection means the endpoint is down.
func describeTransport(method, url string, err error) error {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s %s: timed out: %w", method, url, err)
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("%s %s: cancelled: %w", method, url, err)
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("%s %s: endpoint down (connection refused): %w", method, url, err)
	}
	var ne *net.OpError
	if errors.As(err, &ne) && ne.Op == "dial" {
		return fmt.Errorf("%s %s: endpoint unreachable: %w", method, url, err)
	}
	return fmt.Errorf("%s %s: %w", method, url, err)
}

// isTransport reports whether err is a connection-level failure (no HTTP
// answer at all), the sign that the endpoint went away.
func isTransport(err error) bool {
	var he *HTTPError
	var se *StreamError
	return err != nil && !errors.As(err, &he) && !errors.As(err, &se) &&
		!errors.Is(err, context.Canceled)
}

func (e *endpoint) newRequest(ctx context.Context, method, url string, body any) (*http.Request, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("encode %s %s body: %w", method, url, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, fmt.Errorf("build %s %s: %w", method, url, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if e.key != "" {
		req.Header.Set("Authorization", "Bearer "+e.key)
	}
	return req, nil
}

// do sends a request and checks the status; the caller closes the body.
func (e *endpoint) do(ctx context.Context, method, url string, body any) (*http.Response, error) {
	req, err := e.newRequest(ctx, method, url, body)
	if err != nil {
		return nil, err
	}
	resp, err := e.hc.Do(req)
	if err != nil {
		return nil, describeTransport(method, url, err)
	}
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		resp.Body.Close()
		return nil, &HTTPError{Method: method, URL: url, Status: resp.StatusCode, Message: errorMessage(b), Code: errorCode(b)}
	}
	return resp, nil
}

// getJSON fetches url into out with its own timeout.
func (e *endpoint) getJSON(ctx context.Context, url string, out any) error {
	return e.jsonCall(ctx, http.MethodGet, url, nil, out)
}

func (e *endpoint) jsonCall(ctx context.Context, method, url string, body, out any) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := e.do(ctx, method, url, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, url, err)
	}
	return nil
}

// getText fetches a plain-text body (Prometheus metrics), bounded in size.
func (e *endpoint) getText(ctx context.Context, url string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := e.do(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("GET %s: read: %w", url, err)
	}
	return b, nil
}

// detect finds the server's flavour and version: vLLM answers /version,
// Ollama /api/version and "Ollama is running" at /; a server answering
// neither is generic OpenAI.
func (e *endpoint) detect(ctx context.Context, forced Flavor) (Flavor, string) {
	var v struct {
		Version string `json:"version"`
	}
	tryVLLM := func() bool { return e.getJSON(ctx, e.root+"/version", &v) == nil && v.Version != "" }
	// Ollama also says so at its root; requiring both keeps another server
	// with an /api/version (gpuhost's own API, say) from passing as Ollama.
	tryOllama := func() bool {
		if e.getJSON(ctx, e.root+"/api/version", &v) != nil || v.Version == "" {
			return false
		}
		b, err := e.getText(ctx, e.root+"/")
		return err == nil && bytes.Contains(b, []byte("Ollama is running"))
	}
	switch forced {
	case FlavorVLLM:
		tryVLLM()
		return FlavorVLLM, v.Version
	case FlavorOllama:
		tryOllama()
		return FlavorOllama, v.Version
	case FlavorOpenAI:
		return FlavorOpenAI, ""
	}
	if tryOllama() {
		return FlavorOllama, v.Version
	}
	if tryVLLM() {
		return FlavorVLLM, v.Version
	}
	return FlavorOpenAI, ""
}

// modelInfo is one entry of GET /v1/models.
type modelInfo struct {
	ID          string `json:"id"`
	MaxModelLen int    `json:"max_model_len"`
}

// models is the pre-flight probe: one GET /v1/models bounded by timeout.
// An answer that is not an OpenAI model list (an HTML page, a 404, JSON
// without "data") is reported as "not an OpenAI-compatible server" rather
// than with the page's markup.
func (e *endpoint) models(ctx context.Context, timeout time.Duration) ([]modelInfo, error) {
	url := e.api + "/models"
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := e.do(ctx, http.MethodGet, url, nil)
	var he *HTTPError
	switch {
	case errors.As(err, &he) && (he.Status == http.StatusUnauthorized || he.Status == http.StatusForbidden):
		return nil, fmt.Errorf("list the served models (is a token needed? --api-key-env): %w", err)
	case errors.As(err, &he) && he.Status >= 500:
		return nil, fmt.Errorf("list the served models: %w", err)
	case errors.As(err, &he):
		return nil, fmt.Errorf("not an OpenAI-compatible server (HTTP %d from %s)", he.Status, url)
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil:
		return nil, fmt.Errorf("list the served models: no answer from %s within %s (--preflight-timeout): %w", url, timeout, err)
	case err != nil:
		return nil, fmt.Errorf("list the served models: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("list the served models: GET %s: read: %w", url, err)
	}
	var v struct {
		Data *[]modelInfo `json:"data"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		ct := resp.Header.Get("Content-Type")
		if ct == "" {
			ct = "no content type"
		}
		return nil, fmt.Errorf("not an OpenAI-compatible server (HTTP %d from %s is %s, not a JSON model list)", resp.StatusCode, url, ct)
	}
	if v.Data == nil {
		return nil, fmt.Errorf("not an OpenAI-compatible server (the JSON from %s has no \"data\" model list)", url)
	}
	return *v.Data, nil
}

// resolveModel checks that the model is served (Ollama's implicit :latest
// tag counts) and picks the only one when none was named.
func resolveModel(want string, served []modelInfo) (modelInfo, error) {
	ids := make([]string, len(served))
	for i, m := range served {
		ids[i] = m.ID
	}
	if want == "" {
		if len(served) == 1 {
			return served[0], nil
		}
		if len(served) == 0 {
			return modelInfo{}, errors.New("the server lists no models (model not loaded?)")
		}
		return modelInfo{}, fmt.Errorf("the server serves %d models (%s): choose one with --model", len(served), strings.Join(ids, ", "))
	}
	for _, m := range served {
		if m.ID == want || m.ID == want+":latest" {
			return m, nil
		}
	}
	return modelInfo{}, fmt.Errorf("model %q is not served (not loaded?); the server lists: %s", want, strings.Join(ids, ", "))
}

// tokenize counts the tokens of a chat prompt with vLLM's /tokenize; ok is
// false when the server has no such route.
func (e *endpoint) tokenize(ctx context.Context, content string) (n int, ok bool, err error) {
	body := map[string]any{
		"model":                 e.model,
		"messages":              []map[string]string{{"role": "user", "content": content}},
		"add_generation_prompt": true,
	}
	var v struct {
		Count *int `json:"count"`
	}
	err = e.jsonCall(ctx, http.MethodPost, e.root+"/tokenize", body, &v)
	var he *HTTPError
	if errors.As(err, &he) && (he.Status == http.StatusNotFound || he.Status == http.StatusMethodNotAllowed) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	if v.Count == nil {
		return 0, false, fmt.Errorf("POST %s/tokenize: answer has no count", e.root)
	}
	return *v.Count, true, nil
}

// StreamError is a failure the server reported inside a 200 stream, or a
// stream that broke off; it is a recorded request failure, not a transport
// problem.
type StreamError struct{ Msg string }

func (e *StreamError) Error() string { return e.Msg }

// sample is what one streamed request observed. Token times are offsets
// from the request start, one per chunk that carried generated text.
type sample struct {
	start      time.Time
	tokenAt    []time.Duration
	end        time.Duration
	prompt     int // server-reported prompt tokens (-1: not reported)
	completion int // server-reported generated tokens (-1: not reported)
	finish     string
	// Ollama native only: the server's own timing.
	evalCount    int
	evalDuration time.Duration
	server       ollamaTimings
}

// ollamaTimings are the rest of Ollama's own timing of one native request:
// total_duration runs from the handler's start (so it includes loading and
// the wait for a free slot), prompt_eval_duration is the prompt's
// processing, load_duration the model's load (or the scheduler's answer).
type ollamaTimings struct{ prompt, load, total time.Duration }

func (s *sample) ttft() time.Duration {
	if len(s.tokenAt) == 0 {
		return 0
	}
	return s.tokenAt[0]
}

// chatRequest is the body the runner sends to /v1/chat/completions.
type chatRequest struct {
	Model         string        `json:"model"`
	Messages      []chatMessage `json:"messages"`
	Stream        bool          `json:"stream"`
	StreamOptions streamOptions `json:"stream_options"`
	MaxTokens     int           `json:"max_tokens"`
	// vLLM's sampling extras force the output length; other servers ignore
	// them (and are checked against the count they produce).
	MinTokens   int     `json:"min_tokens,omitempty"`
	IgnoreEOS   bool    `json:"ignore_eos,omitempty"`
	Temperature float64 `json:"temperature"`
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// chatChunk is the part of a streamed chunk the runner reads.
type chatChunk struct {
	Choices []struct {
		Delta struct {
			Content          string          `json:"content"`
			ReasoningContent string          `json:"reasoning_content"`
			Reasoning        string          `json:"reasoning"`
			ToolCalls        json.RawMessage `json:"tool_calls"`
		} `json:"delta"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error  json.RawMessage `json:"error"`
	Object string          `json:"object"`
	// Message is set on vLLM's older in-stream error shape
	// {"object":"error","message":…}.
	Message string `json:"message"`
}

var doneMarker = []byte("[DONE]")

// chatStream sends one streamed chat completion and records when each
// generated token arrived and what usage the server reported.
func (e *endpoint) chatStream(ctx context.Context, req chatRequest) (*sample, error) {
	url := e.api + "/chat/completions"
	req.Model, req.Stream, req.StreamOptions = e.model, true, streamOptions{IncludeUsage: true}
	hreq, err := e.newRequest(ctx, http.MethodPost, url, req)
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Accept", "text/event-stream")
	s := &sample{prompt: -1, completion: -1, tokenAt: make([]time.Duration, 0, req.MaxTokens+1)}
	s.start = time.Now()
	resp, err := e.hc.Do(hreq)
	if err != nil {
		return s, describeTransport(http.MethodPost, url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		return s, &HTTPError{Method: http.MethodPost, URL: url, Status: resp.StatusCode, Message: errorMessage(b), Code: errorCode(b)}
	}
	err = parseSSE(resp.Body, func(data []byte, at time.Time) error {
		return s.onChunk(data, at)
	})
	s.end = time.Since(s.start)
	if err == nil {
		drain(resp.Body)
	}
	if err != nil {
		if ctx.Err() != nil {
			return s, describeTransport(http.MethodPost, url, ctx.Err())
		}
		return s, err
	}
	return s, nil
}

// onChunk applies one SSE data payload.
func (s *sample) onChunk(data []byte, at time.Time) error {
	var c chatChunk
	if err := json.Unmarshal(data, &c); err != nil {
		return &StreamError{Msg: fmt.Sprintf("stream chunk is not JSON (%v): %.120q", err, data)}
	}
	if len(c.Error) > 0 && string(c.Error) != "null" {
		return &StreamError{Msg: "server error inside the stream: " + errorMessage(data)}
	}
	if c.Object == "error" {
		return &StreamError{Msg: "server error inside the stream: " + c.Message}
	}
	for _, ch := range c.Choices {
		d := ch.Delta
		if d.Content != "" || d.ReasoningContent != "" || d.Reasoning != "" || ch.Text != "" ||
			(len(d.ToolCalls) > 0 && string(d.ToolCalls) != "null") {
			s.tokenAt = append(s.tokenAt, at.Sub(s.start))
		}
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			s.finish = *ch.FinishReason
		}
	}
	if c.Usage != nil {
		s.prompt, s.completion = c.Usage.PromptTokens, c.Usage.CompletionTokens
	}
	return nil
}

// drain reads what follows the end marker (the chunked encoding's last
// chunk, a trailing newline) so that the connection goes back to the pool:
// a body closed before EOF costs a new connection on the next request,
// which would land in the next TTFT.
func drain(body io.Reader) {
	_, _ = io.Copy(io.Discard, io.LimitReader(body, 64<<10))
}

// readLine returns the next line without copying in the common case; a
// line longer than the buffer is collected into a new slice.
func readLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if !errors.Is(err, bufio.ErrBufferFull) {
		return line, err
	}
	long := append([]byte(nil), line...)
	for errors.Is(err, bufio.ErrBufferFull) {
		line, err = br.ReadSlice('\n')
		long = append(long, line...)
	}
	return long, err
}

// maxSSE bounds one line, and one event, of a chat stream: a token chunk
// is a few hundred bytes, a tool call's arguments far below it.
const maxSSE = sse.DefaultMax

// parseSSE reads server-sent events and calls fn with each data payload and
// its arrival time, until the OpenAI end marker [DONE]. A stream that ends
// without [DONE] is a StreamError: the server broke off mid-answer. An
// event cut by the end of the stream is still read (a last "data: [DONE]"
// without the blank line after it ends the stream well).
func parseSSE(r io.Reader, fn func(data []byte, at time.Time) error) error {
	rd := sse.NewReader(r, maxSSE)
	events := 0
	for {
		ev, err := rd.Next()
		at := time.Now()
		if err == nil || errors.Is(err, sse.ErrIncomplete) {
			data := bytes.TrimSpace(ev.Data)
			if bytes.Equal(data, doneMarker) {
				return nil
			}
			if len(data) > 0 {
				events++
				if ferr := fn(data, at); ferr != nil {
					return ferr
				}
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, sse.ErrIncomplete) {
				return &StreamError{Msg: fmt.Sprintf("stream ended without [DONE] after %d events (server broke off mid-answer)", events)}
			}
			return &StreamError{Msg: fmt.Sprintf("stream broke off after %d events: %v", events, err)}
		}
	}
}

// generateRequest is the body of Ollama's POST /api/generate.
type generateRequest struct {
	Model   string         `json:"model"`
	Prompt  string         `json:"prompt"`
	Stream  bool           `json:"stream"`
	Options map[string]any `json:"options"`
}

// ollamaLine is one NDJSON line of /api/generate or /api/chat (the text
// is in response there, in message here); the last line (done) carries
// the server's own counts and timings (ns).
type ollamaLine struct {
	Response string `json:"response"`
	Thinking string `json:"thinking"`
	Message  struct {
		Content  string `json:"content"`
		Thinking string `json:"thinking"`
	} `json:"message"`
	Done               bool   `json:"done"`
	DoneReason         string `json:"done_reason"`
	PromptEval         int    `json:"prompt_eval_count"`
	PromptEvalDuration int64  `json:"prompt_eval_duration"`
	EvalCount          int    `json:"eval_count"`
	EvalDuration       int64  `json:"eval_duration"`
	LoadDuration       int64  `json:"load_duration"`
	TotalDuration      int64  `json:"total_duration"`
	Error              string `json:"error"`
}

func (l *ollamaLine) hasText() bool {
	return l.Response != "" || l.Thinking != "" || l.Message.Content != "" || l.Message.Thinking != ""
}

// ollamaChatRequest is the body of Ollama's POST /api/chat.
type ollamaChatRequest struct {
	Model    string         `json:"model"`
	Messages []chatMessage  `json:"messages"`
	Stream   bool           `json:"stream"`
	Options  map[string]any `json:"options"`
}

// ollamaGenerate streams Ollama's native /api/generate with num_predict:
// the length is capped (the model may stop earlier), and the last line
// has the server's own eval_count and eval_duration.
func (e *endpoint) ollamaGenerate(ctx context.Context, prompt string, numPredict int) (*sample, error) {
	return e.ollamaStream(ctx, "/api/generate", generateRequest{Model: e.model, Prompt: prompt, Stream: true,
		Options: map[string]any{"num_predict": numPredict, "temperature": 0}}, numPredict)
}

// ollamaChat streams Ollama's native /api/chat (the chat template applied
// as /v1 applies it), for serving runs that want the server's per-request
// timings next to the client's.
func (e *endpoint) ollamaChat(ctx context.Context, content string, numPredict int) (*sample, error) {
	return e.ollamaStream(ctx, "/api/chat", ollamaChatRequest{Model: e.model, Stream: true,
		Messages: []chatMessage{{Role: "user", Content: content}},
		Options:  map[string]any{"num_predict": numPredict, "temperature": 0}}, numPredict)
}

func (e *endpoint) ollamaStream(ctx context.Context, path string, body any, numPredict int) (*sample, error) {
	url := e.root + path
	hreq, err := e.newRequest(ctx, http.MethodPost, url, body)
	if err != nil {
		return nil, err
	}
	s := &sample{prompt: -1, completion: -1, tokenAt: make([]time.Duration, 0, numPredict+1)}
	s.start = time.Now()
	resp, err := e.hc.Do(hreq)
	if err != nil {
		return s, describeTransport(http.MethodPost, url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		return s, &HTTPError{Method: http.MethodPost, URL: url, Status: resp.StatusCode, Message: errorMessage(b), Code: errorCode(b)}
	}
	err = parseNDJSON(resp.Body, func(line []byte, at time.Time) (bool, error) {
		var l ollamaLine
		if err := json.Unmarshal(line, &l); err != nil {
			return false, &StreamError{Msg: fmt.Sprintf("stream line is not JSON (%v): %.120q", err, line)}
		}
		if l.Error != "" {
			return false, &StreamError{Msg: "server error inside the stream: " + l.Error}
		}
		if l.hasText() {
			s.tokenAt = append(s.tokenAt, at.Sub(s.start))
		}
		if l.Done {
			s.finish = l.DoneReason
			s.prompt, s.completion = l.PromptEval, l.EvalCount
			s.evalCount, s.evalDuration = l.EvalCount, time.Duration(l.EvalDuration)
			s.server = ollamaTimings{prompt: time.Duration(l.PromptEvalDuration), load: time.Duration(l.LoadDuration),
				total: time.Duration(l.TotalDuration)}
			return true, nil
		}
		return false, nil
	})
	s.end = time.Since(s.start)
	if err == nil {
		drain(resp.Body)
	}
	if err != nil && ctx.Err() != nil {
		return s, describeTransport(http.MethodPost, url, ctx.Err())
	}
	return s, err
}

// parseNDJSON reads newline-delimited JSON, calling fn per non-empty line
// until it reports done; EOF before that is a StreamError.
func parseNDJSON(r io.Reader, fn func(line []byte, at time.Time) (done bool, err error)) error {
	br := bufio.NewReaderSize(r, 64<<10)
	lines := 0
	for {
		line, err := readLine(br)
		at := time.Now()
		if t := bytes.TrimSpace(line); len(t) > 0 {
			lines++
			done, ferr := fn(t, at)
			if ferr != nil {
				return ferr
			}
			if done {
				return nil
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return &StreamError{Msg: fmt.Sprintf("stream ended after %d lines without a final \"done\": true (server broke off mid-answer)", lines)}
			}
			return &StreamError{Msg: fmt.Sprintf("stream broke off after %d lines: %v", lines, err)}
		}
	}
}

// promCounter sums every sample of one metric in a Prometheus text
// exposition (all label sets, e.g. one per engine); ok is false when the
// metric is absent.
func promCounter(text []byte, name string) (sum float64, ok bool) {
	for len(text) > 0 {
		var line []byte
		if i := bytes.IndexByte(text, '\n'); i >= 0 {
			line, text = text[:i], text[i+1:]
		} else {
			line, text = text, nil
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 || line[0] == '#' || !bytes.HasPrefix(line, []byte(name)) {
			continue
		}
		rest := line[len(name):]
		if len(rest) == 0 {
			continue
		}
		switch rest[0] {
		case '{':
			end := labelsEnd(rest)
			if end < 0 {
				continue
			}
			rest = rest[end+1:]
		case ' ', '\t':
		default:
			continue // a longer name sharing the prefix
		}
		fields := strings.Fields(string(rest))
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			continue
		}
		sum += v
		ok = true
	}
	return sum, ok
}

// labelsEnd returns the index of the '}' closing a label set that starts at
// s[0] == '{', honouring quoted values with escapes; -1 if unterminated.
func labelsEnd(s []byte) int {
	inQuote := false
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case inQuote && c == '\\':
			i++
		case c == '"':
			inQuote = !inQuote
		case !inQuote && c == '}':
			return i
		}
	}
	return -1
}

// ollamaSettings collects what Ollama reveals of the model's settings:
// /api/show's parameters (one "key value" per line; repeated keys such as
// stop are joined with ",") and details, and /api/ps's context length,
// size and VRAM size of the loaded model. Failures leave keys out.
func (e *endpoint) ollamaSettings(ctx context.Context) map[string]string {
	out := map[string]string{}
	type details struct {
		Family            string `json:"family"`
		ParameterSize     string `json:"parameter_size"`
		QuantizationLevel string `json:"quantization_level"`
	}
	var show struct {
		Parameters string  `json:"parameters"`
		Details    details `json:"details"`
	}
	if e.jsonCall(ctx, http.MethodPost, e.root+"/api/show", map[string]string{"model": e.model}, &show) == nil {
		for _, line := range strings.Split(show.Parameters, "\n") {
			k, v, ok := strings.Cut(strings.TrimSpace(line), " ")
			if !ok || k == "" {
				continue
			}
			v = strings.TrimSpace(v)
			key := "ollama.param." + k
			if old, dup := out[key]; dup {
				v = old + "," + v
			}
			out[key] = v
		}
		for k, v := range map[string]string{"ollama.family": show.Details.Family, "ollama.parameter_size": show.Details.ParameterSize,
			"ollama.quantization": show.Details.QuantizationLevel} {
			if v != "" {
				out[k] = v
			}
		}
	}
	var ps struct {
		Models []struct {
			Name          string `json:"name"`
			Model         string `json:"model"`
			ContextLength int    `json:"context_length"`
			Size          int64  `json:"size"`
			SizeVRAM      int64  `json:"size_vram"`
		} `json:"models"`
	}
	if e.getJSON(ctx, e.root+"/api/ps", &ps) == nil {
		for _, m := range ps.Models {
			if m.Name == e.model || m.Model == e.model || m.Name == e.model+":latest" {
				if m.ContextLength > 0 {
					out["ollama.ps.context_length"] = strconv.Itoa(m.ContextLength)
				}
				// The loaded size moves with the KV cache Ollama allocates:
				// OLLAMA_NUM_PARALLEL slots × the context (or another
				// OLLAMA_KV_CACHE_TYPE), neither of which its API reports.
				if m.Size > 0 {
					out["ollama.ps.size"] = strconv.FormatInt(m.Size, 10)
				}
				if m.SizeVRAM > 0 {
					out["ollama.ps.size_vram"] = strconv.FormatInt(m.SizeVRAM, 10)
				}
			}
		}
	}
	return out
}

// vllmCacheConfig returns the labels of vllm:cache_config_info (block
// size, gpu_memory_utilization, num_gpu_blocks, prefix caching …) from a
// /metrics text, keyed "vllm.cache_config.<label>"; the engine label is
// left out.
func vllmCacheConfig(text []byte) map[string]string {
	out := map[string]string{}
	for _, line := range bytes.Split(text, []byte("\n")) {
		rest, ok := bytes.CutPrefix(line, []byte("vllm:cache_config_info{"))
		if !ok {
			continue
		}
		end := bytes.LastIndexByte(rest, '}')
		if end < 0 {
			continue
		}
		for _, kv := range splitLabels(string(rest[:end])) {
			if kv[0] != "engine" {
				out["vllm.cache_config."+kv[0]] = kv[1]
			}
		}
		break
	}
	return out
}

// splitLabels parses Prometheus labels a="x",b="y" (escapes \" and \\).
func splitLabels(s string) [][2]string {
	var out [][2]string
	for len(s) > 0 {
		eq := strings.IndexByte(s, '=')
		if eq < 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			return out
		}
		name := strings.TrimSpace(s[:eq])
		var val strings.Builder
		i := eq + 2
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
			}
			val.WriteByte(s[i])
		}
		out = append(out, [2]string{name, val.String()})
		s = strings.TrimLeft(s[min(i+1, len(s)):], ", ")
	}
	return out
}
