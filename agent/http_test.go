package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"gpuhost/api"
	"gpuhost/appliance"
	"gpuhost/config"
	"gpuhost/frontdoor/httpapi"
	"gpuhost/internal/sse"
	"gpuhost/internal/testbin"
	"gpuhost/internal/testkit"
)

// scriptAsker replays a fixed timeline (numbered and stamped as the loop
// does) and records the questions it got.
type scriptAsker struct {
	events []Event
	noStop bool // leave out the stop event, as a broken loop would

	mu        sync.Mutex
	questions []string
}

func (s *scriptAsker) Ask(ctx context.Context, q string, emit func(Event)) Result {
	s.mu.Lock()
	s.questions = append(s.questions, q)
	s.mu.Unlock()
	res := Result{ToolsUsed: []string{}}
	for i, e := range s.events {
		if s.noStop && e.Kind == EventStop {
			continue
		}
		e.Seq = i + 1
		e.Time = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
		emit(e)
		res.Events = append(res.Events, e)
		switch e.Kind {
		case EventAnswer:
			res.Answer = e.Text
		case EventStop:
			res.Stop = e.Reason
		}
	}
	if s.noStop {
		res.Stop = StopAnswer
	}
	return res
}

// recoveryTimeline is a question whose first tool call fails and whose
// second step recovers.
func recoveryTimeline() []Event {
	return []Event{
		{Kind: EventStart, Text: "what is 6*7?", Tools: []string{"calc_eval", "gpu_status"}},
		{Kind: EventModel, Step: 1, PromptTokens: 310, CompletionTokens: 22, LatencyMS: 41.5, Model: "qwen3-coder"},
		{Kind: EventToolCall, Step: 1, Tool: "calc_eval", CallID: "c1", Arguments: `{"expression":"6*"}`},
		{Kind: EventToolResult, Step: 1, Tool: "calc_eval", CallID: "c1", Result: "syntax error at 2", IsError: true, LatencyMS: 1.2},
		{Kind: EventModel, Step: 2, PromptTokens: 360, CompletionTokens: 20, LatencyMS: 39},
		{Kind: EventToolCall, Step: 2, Tool: "calc_eval", CallID: "c2", Arguments: `{"expression":"6*7"}`},
		{Kind: EventToolResult, Step: 2, Tool: "calc_eval", CallID: "c2", Result: "42", LatencyMS: 0.9},
		{Kind: EventModel, Step: 3, PromptTokens: 400, CompletionTokens: 12, LatencyMS: 30},
		{Kind: EventAnswer, Step: 3, Text: "6*7 is 42.\n\nevent: stop\ndata: {}\n"},
		{Kind: EventStop, Step: 3, Reason: StopAnswer},
	}
}

// blockAsker holds each question until release is closed or its context
// ends, and reports both moments.
type blockAsker struct {
	entered  chan string
	canceled chan string
	release  chan struct{}
}

func newBlockAsker() *blockAsker {
	return &blockAsker{entered: make(chan string, 16), canceled: make(chan string, 16), release: make(chan struct{})}
}

func (b *blockAsker) Ask(ctx context.Context, q string, emit func(Event)) Result {
	emit(Event{Seq: 1, Kind: EventStart, Text: q})
	b.entered <- q
	select {
	case <-b.release:
		emit(Event{Seq: 2, Kind: EventAnswer, Text: "done"})
		emit(Event{Seq: 3, Kind: EventStop, Reason: StopAnswer})
		return Result{Answer: "done", Stop: StopAnswer}
	case <-ctx.Done():
		b.canceled <- q
		emit(Event{Seq: 2, Kind: EventStop, Reason: StopCanceled})
		return Result{Stop: StopCanceled}
	}
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// serveAsk runs Register on a bare echo server on a real loopback listener.
func serveAsk(t *testing.T, a Asker) *httptest.Server {
	t.Helper()
	e := echo.New()
	Register(e, a, quietLog())
	srv := httptest.NewServer(e)
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	return srv
}

func post(t *testing.T, ctx context.Context, url, body string, header map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+AskPath, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", AskPath, err)
	}
	return resp
}

func decodeAPIError(t *testing.T, resp *http.Response) api.APIError {
	t.Helper()
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("error answer Content-Type %q, want JSON", ct)
	}
	var ae api.APIError
	if err := json.NewDecoder(resp.Body).Decode(&ae); err != nil {
		t.Fatalf("error answer is not an APIError: %v", err)
	}
	if ae.Error == "" || ae.Detail == "" {
		t.Errorf("APIError without error or detail: %+v", ae)
	}
	return ae
}

// TestAskStream: the timeline arrives as SSE, one named event per entry,
// in order and unchanged (an answer holding SSE syntax included), ending
// with the stop event; the raw stream has the documented framing.
func TestAskStream(t *testing.T) {
	want := recoveryTimeline()
	a := &scriptAsker{events: want}
	srv := serveAsk(t, a)
	resp := post(t, context.Background(), srv.URL, `{"question": "what is 6*7?"}`, nil)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Errorf("Content-Type %q", ct)
	}
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, frag := range []string{"id: 1\nevent: start\ndata: {", "\nevent: tool_result\ndata: {", "\"is_error\":true", "\nevent: stop\ndata: {"} {
		if !bytes.Contains(raw, []byte(frag)) {
			t.Errorf("stream lacks %q:\n%s", frag, raw)
		}
	}
	if n := bytes.Count(raw, []byte("\nevent: stop\n")); n != 1 {
		t.Errorf("%d stop events in the raw stream, want 1 (answer text must not inject one):\n%s", n, raw)
	}
	var got []Event
	if err := ReadEvents(bytes.NewReader(raw), func(e Event) error { got = append(got, e); return nil }); err != nil {
		t.Fatalf("ReadEvents: %v", err)
	}
	if len(got) != len(want) {
		t.Fatalf("got %d events, want %d", len(got), len(want))
	}
	for i := range want {
		w := want[i]
		w.Seq, w.Time = i+1, time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
		if !reflect.DeepEqual(got[i], w) {
			t.Errorf("event %d:\n got %+v\nwant %+v", i, got[i], w)
		}
	}
	if len(a.questions) != 1 || a.questions[0] != "what is 6*7?" {
		t.Errorf("asker got %q", a.questions)
	}
}

// TestAskSynthesizesStop: a loop that forgets its stop event still gives
// the client one, so nobody waits forever.
func TestAskSynthesizesStop(t *testing.T) {
	for _, tc := range []struct {
		name   string
		asker  Asker
		reason string
	}{
		{"result has the reason", &scriptAsker{events: recoveryTimeline(), noStop: true}, StopAnswer},
		{"nothing at all", askerFunc(func(context.Context, string, func(Event)) Result { return Result{} }), StopError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := serveAsk(t, tc.asker)
			resp := post(t, context.Background(), srv.URL, `{"question":"q"}`, nil)
			defer resp.Body.Close()
			var last Event
			if err := ReadEvents(resp.Body, func(e Event) error { last = e; return nil }); err != nil {
				t.Fatal(err)
			}
			if last.Kind != EventStop || last.Reason != tc.reason {
				t.Errorf("last event %+v, want a stop with reason %s", last, tc.reason)
			}
		})
	}
}

// askerFunc adapts a function to Asker (tests only).
type askerFunc func(ctx context.Context, q string, emit func(Event)) Result

func (f askerFunc) Ask(ctx context.Context, q string, emit func(Event)) Result {
	return f(ctx, q, emit)
}

// TestAskBadRequest: every malformed body is a 400 (413 when too large)
// with the API's JSON error, and the loop never runs.
func TestAskBadRequest(t *testing.T) {
	a := &scriptAsker{events: recoveryTimeline()}
	srv := serveAsk(t, a)
	for _, tc := range []struct {
		name, body, detail string
	}{
		{"not JSON", `what is up`, "body must be JSON"},
		{"empty body", ``, "body must be JSON"},
		{"empty question", `{"question": ""}`, "missing \"question\""},
		{"blank question", `{"question": " \n\t "}`, "missing \"question\""},
		{"no question", `{}`, "missing \"question\""},
		{"wrong type", `{"question": 42}`, "body must be JSON"},
		{"unknown field", `{"question": "q", "model": "x"}`, "unknown field"},
		{"two objects", `{"question": "a"} {"question": "b"}`, "not several"},
		{"array", `["q"]`, "body must be JSON"},
		{"too large", `{"question": "` + strings.Repeat("x", maxAskBody) + `"}`, "larger than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := post(t, context.Background(), srv.URL, tc.body, nil)
			want := http.StatusBadRequest
			if tc.name == "too large" {
				want = http.StatusRequestEntityTooLarge
			}
			if resp.StatusCode != want {
				t.Errorf("status %d, want %d", resp.StatusCode, want)
			}
			ae := decodeAPIError(t, resp)
			if !strings.Contains(ae.Detail, tc.detail) {
				t.Errorf("detail %q lacks %q", ae.Detail, tc.detail)
			}
		})
	}
	if len(a.questions) != 0 {
		t.Errorf("the loop ran for bad requests: %q", a.questions)
	}
}

// TestAskLimit: with two loops running, a third question is a 429 that
// says why; when one finishes, questions are taken again. A Limiter shared
// with another front door counts that door's loops too.
func TestAskLimit(t *testing.T) {
	b := newBlockAsker()
	lim := NewLimiter(b, 2)
	srv := serveAsk(t, lim)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type outcome struct {
		events []Event
		err    error
	}
	results := make(chan outcome, 2)
	for _, q := range []string{"one", "two"} {
		resp := post(t, ctx, srv.URL, `{"question":"`+q+`"}`, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("question %s: status %d", q, resp.StatusCode)
		}
		go func() {
			defer resp.Body.Close()
			var o outcome
			o.err = ReadEvents(resp.Body, func(e Event) error { o.events = append(o.events, e); return nil })
			results <- o
		}()
		<-b.entered
	}
	resp := post(t, ctx, srv.URL, `{"question":"three"}`, nil)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("third question: status %d, want 429", resp.StatusCode)
	}
	if resp.Header.Get("Retry-After") == "" {
		t.Error("429 without Retry-After")
	}
	ae := decodeAPIError(t, resp)
	if !strings.Contains(ae.Detail, "limit is 2") {
		t.Errorf("429 detail %q does not name the limit", ae.Detail)
	}
	// The same Limiter, asked directly (as the panel or the bot would),
	// refuses with a single busy stop event.
	var busy []Event
	res := lim.Ask(ctx, "four", func(e Event) { busy = append(busy, e) })
	if res.Stop != StopBusy || len(busy) != 1 || busy[0].Kind != EventStop || busy[0].Reason != StopBusy || !strings.Contains(busy[0].Text, "limit is 2") {
		t.Errorf("direct Ask while full: %+v, events %+v", res, busy)
	}
	close(b.release)
	for range 2 {
		o := <-results
		if o.err != nil || len(o.events) != 3 || o.events[2].Reason != StopAnswer {
			t.Errorf("a held question ended with %v, events %+v", o.err, o.events)
		}
	}
	// Slots are free again (released when each handler returned).
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp := post(t, ctx, srv.URL, `{"question":"again"}`, nil)
		code := resp.StatusCode
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %d after both questions finished", code)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAskClientGoneCancels: a client that disconnects mid-question ends
// the loop (its context is canceled), and the slot is free again.
func TestAskClientGoneCancels(t *testing.T) {
	b := newBlockAsker()
	lim := NewLimiter(b, 1)
	srv := serveAsk(t, lim)
	ctx, cancel := context.WithCancel(context.Background())
	resp := post(t, ctx, srv.URL, `{"question":"slow"}`, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	<-b.entered
	cancel()
	resp.Body.Close()
	select {
	case q := <-b.canceled:
		if q != "slow" {
			t.Errorf("canceled %q", q)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the loop was not canceled within 30 s of the client leaving")
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		release, ok := lim.TryAcquire()
		if ok {
			release()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the slot of the abandoned question was never released")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestAskDisabled: without an agent (nil, or the nil *Limiter a daemon
// that built none holds) the route answers 503 in words.
func TestAskDisabled(t *testing.T) {
	for name, a := range map[string]Asker{"nil": nil, "nil limiter": (*Limiter)(nil)} {
		t.Run(name, func(t *testing.T) {
			srv := serveAsk(t, a)
			resp := post(t, context.Background(), srv.URL, `{"question":"q"}`, nil)
			if resp.StatusCode != http.StatusServiceUnavailable {
				t.Errorf("status %d, want 503", resp.StatusCode)
			}
			if ae := decodeAPIError(t, resp); ae.Error != "agent disabled" {
				t.Errorf("error %q", ae.Error)
			}
		})
	}
}

// TestAskBehindBearer: registered on the daemon's API listening beyond
// loopback, /api/ask needs the bearer token like every /api route.
func TestAskBehindBearer(t *testing.T) {
	state := t.TempDir()
	token := "ask-test-token-0123456789"
	tokenFile := filepath.Join(state, "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	yaml := testbin.ConfigYAML("/nonexistent/gpuhost", state, "process", "", testkit.FreePort(t), testkit.FreePort(t), "10ms")
	cfg, err := config.Parse("ask-test", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen, cfg.APITokenFile = "0.0.0.0:0", tokenFile
	sup := appliance.NewSupervisor(cfg, nil, nil, nil, quietLog())
	defer sup.Close()
	httpAPI, err := httpapi.New(sup, nil, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	a := &scriptAsker{events: recoveryTimeline()}
	Register(httpAPI, a, quietLog())
	srv := httptest.NewServer(httpAPI)
	defer srv.Close()

	for _, tc := range []struct {
		name   string
		header map[string]string
		want   int
	}{
		{"no token", nil, http.StatusUnauthorized},
		{"wrong token", map[string]string{"Authorization": "Bearer nope"}, http.StatusUnauthorized},
		{"token", map[string]string{"Authorization": "Bearer " + token}, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := post(t, context.Background(), srv.URL, `{"question":"q"}`, tc.header)
			defer resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.want)
			}
			if tc.want == http.StatusOK {
				if err := ReadEvents(resp.Body, func(Event) error { return nil }); err != nil {
					t.Errorf("stream: %v", err)
				}
			}
		})
	}
	if len(a.questions) != 1 {
		t.Errorf("the loop ran %d times, want once (only with the token)", len(a.questions))
	}
}

// TestReadEvents covers the SSE reader on its own: framing variants, a
// stream cut before the stop, bad data, and fn's error passed through.
func TestReadEvents(t *testing.T) {
	errStop := errors.New("enough")
	for _, tc := range []struct {
		name    string
		stream  string
		fnErr   error
		kinds   []string
		wantErr error
		errText string
	}{
		{"plain", "event: start\ndata: {\"kind\":\"start\"}\n\nevent: stop\ndata: {\"kind\":\"stop\",\"reason\":\"answer\"}\n\n", nil, []string{"start", "stop"}, nil, ""},
		{"CRLF, comments, ids", ": hi\r\nid: 1\r\nevent: start\r\ndata: {\"kind\":\"start\"}\r\n\r\n: keep-alive\r\n\r\nevent: stop\r\ndata:{\"kind\":\"stop\"}\r\n\r\n", nil, []string{"start", "stop"}, nil, ""},
		{"kind from event field", "event: stop\ndata: {\"reason\":\"answer\"}\n\n", nil, []string{"stop"}, nil, ""},
		{"data over two lines", "event: stop\ndata: {\"kind\":\ndata: \"stop\"}\n\n", nil, []string{"stop"}, nil, ""},
		{"stops at the stop event", "event: stop\ndata: {\"kind\":\"stop\"}\n\nevent: answer\ndata: {\"kind\":\"answer\"}\n\n", nil, []string{"stop"}, nil, ""},
		{"cut before stop", "event: start\ndata: {\"kind\":\"start\"}\n\nevent: model\ndata: {\"ki", nil, []string{"start"}, ErrStreamEnded, ""},
		{"empty", "", nil, nil, ErrStreamEnded, ""},
		{"not JSON", "event: start\ndata: <html>\n\n", nil, nil, nil, "is not an agent event"},
		{"fn error", "event: start\ndata: {\"kind\":\"start\"}\n\n", errStop, []string{"start"}, errStop, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var kinds []string
			err := ReadEvents(strings.NewReader(tc.stream), func(e Event) error {
				kinds = append(kinds, e.Kind)
				return tc.fnErr
			})
			switch {
			case tc.wantErr != nil:
				if !errors.Is(err, tc.wantErr) {
					t.Errorf("err %v, want %v", err, tc.wantErr)
				}
			case tc.errText != "":
				if err == nil || !strings.Contains(err.Error(), tc.errText) {
					t.Errorf("err %v, want one containing %q", err, tc.errText)
				}
			case err != nil:
				t.Errorf("err %v", err)
			}
			if !reflect.DeepEqual(kinds, tc.kinds) {
				t.Errorf("kinds %q, want %q", kinds, tc.kinds)
			}
		})
	}
}

// FuzzReadEvents: any byte stream is read without panic; a nil error means
// the last event handed out was the stop event.
func FuzzReadEvents(f *testing.F) {
	for _, s := range []string{
		"event: stop\ndata: {\"kind\":\"stop\"}\n\n",
		": c\n\nevent: start\ndata: {\"kind\":\"start\",\"tools\":[\"a\"]}\n\n",
		"data: {\"kind\":\"stop\"}\r\n\r\n",
		"data:\ndata:\n\n",
		"event:\n\n\n",
		"data: {\"seq\":\"x\"}\n\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var last Event
		n := 0
		err := ReadEvents(bytes.NewReader(data), func(e Event) error { last = e; n++; return nil })
		if err == nil && (n == 0 || last.Kind != EventStop) {
			t.Fatalf("nil error after %d events, last %+v", n, last)
		}
	})
}

// FuzzAskRequest: ParseAskRequest never panics and accepts only a single
// object with a non-blank question.
func FuzzAskRequest(f *testing.F) {
	for _, s := range []string{`{"question":"hi"}`, `{"question":""}`, `{}`, `[]`, `{"question":"a"}{}`, `{"question":"\u0000"}`, "\xff"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		q, err := ParseAskRequest(bytes.NewReader(data))
		if err == nil && strings.TrimSpace(q) == "" {
			t.Fatalf("accepted blank question from %q", data)
		}
		if err != nil && q != "" {
			t.Fatalf("question %q returned with error %v", q, err)
		}
	})
}

// TestSSEWriterEventFraming: whatever an event's strings hold, it goes out
// as exactly one SSE event that reads back equal.
func TestSSEWriterEventFraming(t *testing.T) {
	rec := httptest.NewRecorder()
	in := Event{Seq: 7, Kind: "stop\nevent: answer", Reason: StopAnswer, Text: "a\r\n\r\ndata: x\n\nevent: stop"}
	if err := writeEvent(sse.NewWriter(rec), in); err != nil {
		t.Fatal(err)
	}
	buf := rec.Body
	if n := strings.Count(buf.String(), "\n\n"); n != 1 {
		t.Fatalf("one event became %d blank-line-separated blocks:\n%q", n, buf.String())
	}
	if !strings.Contains(buf.String(), "event: stop event: answer\n") {
		t.Errorf("event field not kept on one line: %q", buf.String())
	}
	var got Event
	_ = ReadEvents(buf, func(e Event) error { got = e; return nil })
	if got.Text != in.Text || got.Seq != 7 {
		t.Errorf("read back %+v", got)
	}
}
