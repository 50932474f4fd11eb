package simulator

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"gpuhost/internal/sse"
)

// sim is a simulator running in the test process on an ephemeral port.
type sim struct {
	base   string
	cancel context.CancelFunc
	done   chan error
}

// startSim runs Run with o on 127.0.0.1:0 and waits until it listens.
func startSim(t *testing.T, o Options) *sim {
	t.Helper()
	o.Addr = "127.0.0.1:0"
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	ready := make(chan string, 1)
	o.Ready = func(addr string) { ready <- addr }
	ctx, cancel := context.WithCancel(context.Background())
	s := &sim{cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- Run(ctx, o) }()
	select {
	case addr := <-ready:
		s.base = "http://" + addr
	case err := <-s.done:
		cancel()
		t.Fatalf("Run exited before listening: %v", err)
	case <-time.After(20 * time.Second):
		cancel()
		t.Fatal("simulator did not start listening within 20s")
	}
	t.Cleanup(func() { _ = s.stop(t) })
	return s
}

// stop cancels Run and returns its result (once; later calls return nil).
func (s *sim) stop(t *testing.T) error {
	t.Helper()
	if s.cancel == nil {
		return nil
	}
	s.cancel()
	s.cancel = nil
	select {
	case err := <-s.done:
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return within 20s of cancel")
		return nil
	}
}

func (s *sim) do(t *testing.T, method, path string, body any) (int, []byte, http.Header) {
	t.Helper()
	return doCtx(t, context.Background(), method, s.base+path, body)
}

func doCtx(t *testing.T, ctx context.Context, method, url string, body any) (int, []byte, http.Header) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			t.Fatalf("marshal request: %v", err)
		}
		rd = bytes.NewReader(data)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Fatalf("new request: %v", err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read %s %s: %v", method, url, err)
	}
	return resp.StatusCode, data, resp.Header
}

func decode[T any](t *testing.T, data []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("decode %s: %v", truncate(data), err)
	}
	return v
}

func truncate(b []byte) string {
	if len(b) > 400 {
		return string(b[:400]) + "…"
	}
	return string(b)
}

// sseStream is a parsed Server-Sent Events body.
type sseStream struct {
	events []json.RawMessage
	done   bool // saw data: [DONE] as the last event
}

// parseSSE parses an SSE body strictly: every event is one "data: " line
// followed by a blank line, and nothing follows [DONE].
func parseSSE(t *testing.T, body []byte) sseStream {
	t.Helper()
	var out sseStream
	for _, block := range strings.SplitAfter(string(body), "\n\n") {
		if block == "" {
			continue
		}
		if out.done {
			t.Fatalf("data after [DONE]: %q", block)
		}
		if !strings.HasPrefix(block, "data: ") || !strings.HasSuffix(block, "\n\n") || strings.Count(block, "\n") != 2 {
			t.Fatalf("malformed SSE event %q", block)
		}
		payload := strings.TrimSuffix(strings.TrimPrefix(block, "data: "), "\n\n")
		if payload == "[DONE]" {
			out.done = true
			continue
		}
		if !json.Valid([]byte(payload)) {
			t.Fatalf("SSE event is not JSON: %q", payload)
		}
		out.events = append(out.events, json.RawMessage(payload))
	}
	return out
}

// sseReader reads SSE events one by one from a live response.
type sseReader struct {
	r *sse.Reader
}

func newSSEReader(r io.Reader) *sseReader {
	return &sseReader{r: sse.NewReader(r, 1<<20)}
}

// next returns the next event's payload, or io.EOF. An OpenAI stream has
// only data: an event with an id or a type is an error.
func (r *sseReader) next() (string, error) {
	e, err := r.r.Next()
	if err != nil {
		return "", err
	}
	if e.ID != "" || e.Type != "" {
		return "", fmt.Errorf("unexpected SSE event: id %q, event %q", e.ID, e.Type)
	}
	return string(e.Data), nil
}

// chunk is the union of the OpenAI stream chunk fields the tests read.
type chunk struct {
	ID                string `json:"id"`
	Object            string `json:"object"`
	Model             string `json:"model"`
	SystemFingerprint string `json:"system_fingerprint"`
	Choices           []struct {
		Index int `json:"index"`
		Delta struct {
			Role      *string `json:"role"`
			Content   *string `json:"content"`
			ToolCalls []struct {
				Index    int    `json:"index"`
				ID       string `json:"id"`
				Type     string `json:"type"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
		Text         *string `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *oaiUsage `json:"usage"`
}

// openAIError is the OpenAI error body.
type openAIError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Param   any    `json:"param"`
		Code    any    `json:"code"`
	} `json:"error"`
}

var metricLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$`)

// scrape fetches /metrics, checks every line is valid text exposition, and
// returns samples keyed by name+labels.
func scrape(t *testing.T, s *sim) map[string]float64 {
	t.Helper()
	code, body, hdr := s.do(t, http.MethodGet, "/metrics", nil)
	if code != http.StatusOK {
		t.Fatalf("/metrics: status %d", code)
	}
	if ct := hdr.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("/metrics content type %q", ct)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(strings.TrimSuffix(string(body), "\n"), "\n") {
		if strings.HasPrefix(line, "# HELP ") || strings.HasPrefix(line, "# TYPE ") {
			continue
		}
		m := metricLine.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("invalid exposition line %q", line)
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			t.Fatalf("invalid sample value in %q", line)
		}
		out[m[1]+m[2]] = v
	}
	return out
}

// metric finds the sample of name whose labels include all of want.
func metric(t *testing.T, samples map[string]float64, name string, want ...string) float64 {
	t.Helper()
	for k, v := range samples {
		if !strings.HasPrefix(k, name+"{") {
			continue
		}
		ok := true
		for _, w := range want {
			if !strings.Contains(k, w) {
				ok = false
			}
		}
		if ok {
			return v
		}
	}
	t.Fatalf("no sample %s with %v", name, want)
	return 0
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
