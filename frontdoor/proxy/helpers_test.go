package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gpuhost/appliance/appliancetest"
	"gpuhost/config"
	"gpuhost/frontdoor/httpapi"
	"gpuhost/frontdoor/proxy"
	"gpuhost/internal/apishape"
	"gpuhost/internal/sse"
	"gpuhost/internal/testkit"
	"gpuhost/units"
)

// env is a real Supervisor with simulator backends, the daemon's echo API
// with the proxy mounted, served on 127.0.0.1.
type env struct {
	f    *appliancetest.Fixture
	p    *proxy.Proxy
	url  string
	obs  *observer
	logs *logCapture
}

// fastPrefill keeps the ~30 KB opencode requests from spending seconds in
// simulated prefill; decode stays at the fixture's 500 tok/s.
func fastPrefill(cfg *config.Config) {
	cfg.Profiles["coder"].Sim.PrefillTPS = 200000
}

func newEnv(t testing.TB, opts appliancetest.Options) *env {
	t.Helper()
	hook := opts.Hook
	opts.Hook = func(cfg *config.Config) {
		fastPrefill(cfg)
		if hook != nil {
			hook(cfg)
		}
	}
	f := appliancetest.New(t, opts)
	api, err := httpapi.New(f.Sup, f.Doctor, f.Log)
	if err != nil {
		t.Fatal(err)
	}
	logs := &logCapture{}
	p := proxy.New(f.Sup, f.Cfg.Proxy, func() map[string]*units.Profile { return f.Cfg.Profiles }, slog.New(logs))
	obs := &observer{}
	p.SetObserver(obs)
	p.Register(api)
	srv := httptest.NewServer(api)
	t.Cleanup(func() {
		srv.Close()
		p.Close()
	})
	return &env{f: f, p: p, url: srv.URL, obs: obs, logs: logs}
}

// backendURL is the simulator's own address for a profile.
func (e *env) backendURL(profile string) string {
	return "http://127.0.0.1:" + strconv.Itoa(e.f.Cfg.Profiles[profile].Port)
}

// observation is one ObserveRequest call.
type observation struct {
	api                apishape.Kind
	model              string
	status             int
	prompt, completion int
	ttfb, dur          time.Duration
}

type observer struct {
	mu      sync.Mutex
	obs     []observation
	details []detail
}

// detail is one ObserveRequestDetail call.
type detail struct {
	model      string
	held       time.Duration
	stream     bool
	completion int
	ttfb, dur  time.Duration
}

func (o *observer) ObserveRequestDetail(model string, held time.Duration, stream bool, completion int, ttfb, dur time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.details = append(o.details, detail{model, held, stream, completion, ttfb, dur})
}

func (o *observer) allDetails() []detail {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]detail(nil), o.details...)
}

func (o *observer) ObserveRequest(api apishape.Kind, model string, status int, prompt, completion int, ttfb, dur time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.obs = append(o.obs, observation{api, model, status, prompt, completion, ttfb, dur})
}

func (o *observer) all() []observation {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]observation(nil), o.obs...)
}

// waitFor polls until n observations exist (the observer is called after the
// response is complete, which the client may see a moment earlier).
func (o *observer) waitFor(t testing.TB, n int) []observation {
	t.Helper()
	var obs []observation
	if !testkit.Poll(10*time.Second, func() bool { obs = o.all(); return len(obs) >= n }) {
		t.Fatalf("%d observations, want %d: %+v", len(obs), n, obs)
	}
	return obs
}

// logCapture is an slog.Handler that keeps the proxy's records.
type logCapture struct {
	mu   sync.Mutex
	recs []map[string]any
}

func (l *logCapture) Enabled(context.Context, slog.Level) bool { return true }
func (l *logCapture) Handle(_ context.Context, r slog.Record) error {
	m := map[string]any{"msg": r.Message, "level": r.Level.String()}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.Any(); return true })
	l.mu.Lock()
	l.recs = append(l.recs, m)
	l.mu.Unlock()
	return nil
}
func (l *logCapture) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logCapture) WithGroup(string) slog.Handler      { return l }

// requests returns the "v1 request" access-log records.
func (l *logCapture) requests() []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, r := range l.recs {
		if r["msg"] == "v1 request" {
			out = append(out, r)
		}
	}
	return out
}

// waitRequests polls until n access-log records exist: the proxy logs a
// request after its response is complete, which the client sees a moment
// earlier.
func (l *logCapture) waitRequests(t testing.TB, n int) []map[string]any {
	t.Helper()
	var recs []map[string]any
	if !testkit.Poll(10*time.Second, func() bool { recs = l.requests(); return len(recs) >= n }) {
		t.Fatalf("%d access-log records, want %d: %v", len(recs), n, recs)
	}
	return recs
}

// chatBody is an opencode-style chat request: a ~30 KB tools list whose
// schemas use JSON Schema 2020-12 keywords, tool_choice "auto", streamed
// with usage. model "" leaves "model" out.
func chatBody(t testing.TB, model string, stream bool, maxTokens int, extra map[string]any) []byte {
	t.Helper()
	req := map[string]any{
		"messages": []any{
			map[string]any{"role": "system", "content": "You are opencode, an interactive CLI tool that helps users with software engineering tasks."},
			map[string]any{"role": "user", "content": "Find where the config is loaded and explain it."},
		},
		"tools":       opencodeTools(),
		"tool_choice": "auto",
		"stream":      stream,
		"max_tokens":  maxTokens,
		"temperature": 0.55,
	}
	if model != "" {
		req["model"] = model
	}
	if stream {
		req["stream_options"] = map[string]any{"include_usage": true}
	}
	for k, v := range extra {
		req[k] = v
	}
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var (
	toolsOnce sync.Once
	toolsList []any
)

// opencodeTools imitates opencode's built-in tools (bash, read, edit, …)
// with 2020-12 schemas ($schema, $defs, $ref, prefixItems,
// unevaluatedProperties, const, dependentRequired), about 30 KB in all.
func opencodeTools() []any {
	toolsOnce.Do(func() {
		names := []string{"bash", "read", "write", "edit", "multiedit", "glob", "grep", "list", "patch", "todowrite",
			"todoread", "webfetch", "task", "lsp_diagnostics", "lsp_hover", "invalid"}
		desc := strings.Repeat("Use this tool with care: paths are absolute, output over 30000 characters is truncated, "+
			"and \"quotes\" or <xml> in arguments are passed as is. ", 10)
		for _, n := range names {
			toolsList = append(toolsList, map[string]any{"type": "function", "function": map[string]any{
				"name": n, "description": desc,
				"parameters": map[string]any{
					"$schema": "https://json-schema.org/draft/2020-12/schema",
					"type":    "object",
					"$defs": map[string]any{
						"pos": map[string]any{"type": "object", "properties": map[string]any{"line": map[string]any{"type": "integer", "minimum": 0}}},
					},
					"properties": map[string]any{
						"filePath": map[string]any{"type": "string", "description": "The absolute path to the file"},
						"offset":   map[string]any{"type": "integer", "exclusiveMinimum": 0},
						"range":    map[string]any{"type": "array", "prefixItems": []any{map[string]any{"$ref": "#/$defs/pos"}, map[string]any{"$ref": "#/$defs/pos"}}, "items": false},
						"mode":     map[string]any{"const": "replace"},
						"options":  map[string]any{"type": "object", "unevaluatedProperties": false, "dependentRequired": map[string]any{"a": []string{"b"}}},
					},
					"required":             []string{"filePath"},
					"additionalProperties": false,
				},
			}})
		}
	})
	return toolsList
}

// post sends a JSON body to the proxy.
func post(t testing.TB, ctx context.Context, url string, body []byte) *http.Response {
	t.Helper()
	resp, err := doPost(ctx, url, body)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// doPost is post for goroutines (which must not call t.Fatal).
func doPost(ctx context.Context, url string, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("POST %s: %w", url, err)
	}
	return resp, nil
}

// countingReader counts the reads that returned data: with a proxy that
// buffers, a whole stream arrives in a handful of reads; passed through, in
// about one per event.
type countingReader struct {
	r     io.Reader
	reads int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		c.reads++
	}
	return n, err
}

// stream is a parsed SSE answer.
type stream struct {
	events []string // data payloads, [DONE] excluded
	done   bool
	reads  int
	usage  struct{ Prompt, Completion int }
	model  string
}

// readStream reads an SSE answer; onFirst runs when the first content chunk
// arrives, before the rest is read.
func readStream(t testing.TB, resp *http.Response, onFirst func()) stream {
	t.Helper()
	s, err := parseStream(resp, onFirst)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// parseStream is readStream for goroutines.
func parseStream(resp *http.Response, onFirst func()) (stream, error) {
	defer resp.Body.Close()
	cr := &countingReader{r: resp.Body}
	rd := sse.NewReader(cr, 1<<20)
	var s stream
	first := true
	for {
		ev, err := rd.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil && !errors.Is(err, sse.ErrIncomplete) {
			return s, fmt.Errorf("reading the stream: %w", err)
		}
		if payload := string(ev.Data); payload == "[DONE]" {
			s.done = true
		} else if err := s.chunk(payload, &first, onFirst); err != nil {
			return s, err
		}
		if err != nil { // the stream ended inside this event
			break
		}
	}
	s.reads = cr.reads
	return s, nil
}

// chunk adds one data payload to s; onFirst runs at the first content.
func (s *stream) chunk(payload string, first *bool, onFirst func()) error {
	s.events = append(s.events, payload)
	var chunk struct {
		Model   string `json:"model"`
		Choices []struct {
			Delta struct {
				Content string `json:"content"`
			} `json:"delta"`
		} `json:"choices"`
		Usage *struct {
			Prompt     int `json:"prompt_tokens"`
			Completion int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(payload), &chunk); err != nil {
		return fmt.Errorf("chunk is not JSON: %w: %s", err, payload)
	}
	s.model = chunk.Model
	if chunk.Usage != nil {
		s.usage.Prompt, s.usage.Completion = chunk.Usage.Prompt, chunk.Usage.Completion
	}
	if *first && len(chunk.Choices) > 0 && chunk.Choices[0].Delta.Content != "" {
		*first = false
		if onFirst != nil {
			onFirst()
		}
	}
	return nil
}

// apiError decodes gpuhost's OpenAI-shaped error answer.
type apiError struct {
	Error struct {
		Message   string   `json:"message"`
		Type      string   `json:"type"`
		Code      any      `json:"code"` // vLLM's own errors carry a number
		Param     *string  `json:"param"`
		Loaded    string   `json:"loaded"`
		Available []string `json:"available"`
	} `json:"error"`
}

func decodeError(t testing.TB, resp *http.Response) apiError {
	t.Helper()
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("error answer %d has Content-Type %q: %s", resp.StatusCode, ct, data)
	}
	var e apiError
	if err := json.Unmarshal(data, &e); err != nil || e.Error.Message == "" {
		t.Fatalf("error answer %d is not {\"error\":{\"message\"…}}: %v: %s", resp.StatusCode, err, data)
	}
	return e
}

// metric reads one sample from the simulator's Prometheus text; labels is a
// substring the sample's label set must contain.
func metric(t testing.TB, baseURL, name, labels string) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, baseURL+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s/metrics: %v", baseURL, err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") || !strings.Contains(line, labels) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		return v
	}
	t.Fatalf("no %s{%s} in %s/metrics", name, labels, baseURL)
	return 0
}

func describeObs(obs []observation) string {
	var b strings.Builder
	for _, o := range obs {
		fmt.Fprintf(&b, "\n  %+v", o)
	}
	return b.String()
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }
