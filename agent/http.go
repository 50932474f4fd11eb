package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"gpuhost/api"
	"gpuhost/internal/sse"
)

// Asker runs one question through the loop; *Agent satisfies it, and so do
// *Limiter and the test fakes of the front doors. Ask never fails: what went
// wrong is the timeline's last event (always an EventStop).
type Asker interface {
	Ask(ctx context.Context, question string, emit func(Event)) Result
}

// StopBusy is the stop reason of a question refused because the box already
// runs as many loops as it allows (Limiter).
const StopBusy = "busy"

// DefaultMaxConcurrent is how many loops run at once over all front doors.
// Each loop holds the one local model for several requests in a row; a
// third question would only slow the two before it down.
const DefaultMaxConcurrent = 2

// AskPath is where the API takes questions.
const AskPath = "/api/ask"

// maxAskBody bounds the POST body: a question is at most a few KiB (the
// loop itself refuses anything above agent.max_question_bytes).
const maxAskBody = 1 << 20

// heartbeatEvery keeps proxies and browsers from closing a stream that is
// quiet while a slow model or tool call runs.
const heartbeatEvery = 15 * time.Second

// Limiter bounds the loops running at once, shared by every front door
// that is handed the same Limiter (API, panel, Telegram), so the bound is
// global to the daemon. It is itself an Asker.
type Limiter struct {
	inner Asker
	max   int
	slots chan struct{}
}

// NewLimiter wraps a so that at most max questions run at once; max < 1
// means DefaultMaxConcurrent.
func NewLimiter(a Asker, max int) *Limiter {
	if max < 1 {
		max = DefaultMaxConcurrent
	}
	return &Limiter{inner: a, max: max, slots: make(chan struct{}, max)}
}

// Max is the bound NewLimiter was given (after defaulting).
func (l *Limiter) Max() int { return l.max }

// TryAcquire takes a slot without waiting. The caller runs the question on
// Inner and calls release when it is done; ok is false when every slot is
// taken. The HTTP handler uses it to answer 429 before it starts a stream.
func (l *Limiter) TryAcquire() (release func(), ok bool) {
	select {
	case l.slots <- struct{}{}:
		var once sync.Once
		return func() { once.Do(func() { <-l.slots }) }, true
	default:
		return nil, false
	}
}

// Inner is the wrapped Asker (to run a question whose slot the caller
// already holds).
func (l *Limiter) Inner() Asker { return l.inner }

// BusyMessage says why a question was refused, for every front door alike.
func (l *Limiter) BusyMessage() string {
	return fmt.Sprintf("%d questions are already being answered (the limit is %d); try again when one has finished", l.max, l.max)
}

// Ask runs the question when a slot is free. When none is, it does not
// queue (a waiting question would hold a chat or a browser for minutes):
// the timeline is a single stop event with reason StopBusy and the reason
// in words.
func (l *Limiter) Ask(ctx context.Context, question string, emit func(Event)) Result {
	release, ok := l.TryAcquire()
	if !ok {
		return busyResult(l.BusyMessage(), emit)
	}
	defer release()
	return l.inner.Ask(ctx, question, emit)
}

func busyResult(msg string, emit func(Event)) Result {
	ev := Event{Seq: 1, Kind: EventStop, Time: time.Now(), Reason: StopBusy, Text: msg}
	if emit != nil {
		emit(ev)
	}
	return Result{Stop: StopBusy, Events: []Event{ev}, ToolsUsed: []string{}}
}

// AskRequest is the body of POST /api/ask.
type AskRequest struct {
	Question string `json:"question"`
}

// Handler serves questions as server-sent events: one `event: <kind>` with
// the Event as JSON `data:` per timeline entry, flushed as it happens, the
// stream ending after the stop event. The panel reuses it behind its own
// session and CSRF checks.
type Handler struct {
	lim *Limiter // nil: the agent is disabled
	log *slog.Logger
}

// NewHandler serves a. A *Limiter is used as is (its bound shared with the
// other front doors holding it); any other Asker gets its own Limiter with
// DefaultMaxConcurrent. a nil (also a nil *Limiter, so the daemon can pass
// the variable it did not fill) answers 503 "agent disabled". log is used
// as given (the panel passes its own); nil means slog.Default().
func NewHandler(a Asker, log *slog.Logger) *Handler {
	if log == nil {
		log = slog.Default()
	}
	h := &Handler{log: log}
	if l, ok := a.(*Limiter); ok {
		h.lim = l // a nil *Limiter (the agent not built) stays disabled
	} else if a != nil {
		h.lim = NewLimiter(a, DefaultMaxConcurrent)
	}
	return h
}

// Register mounts POST /api/ask on the daemon's echo server (the one
// httpapi.New built), so beyond loopback it sits behind the API's
// bearer token like every other /api route, and returns the handler. log
// carries the component attribute already (internal/assemble sets it, once).
func Register(e *echo.Echo, a Asker, log *slog.Logger) *Handler {
	if log == nil {
		log = slog.Default()
	}
	h := NewHandler(a, log)
	e.POST(AskPath, h.Serve)
	return h
}

// ParseAskRequest reads a POST /api/ask body: a JSON object with a
// non-blank "question" and nothing else. The error says what is wrong in
// words an API client can act on.
func ParseAskRequest(r io.Reader) (string, error) {
	var req AskRequest
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return "", fmt.Errorf("body must be JSON like {\"question\": \"…\"}: %w", err)
	}
	if dec.More() {
		return "", errors.New("body must be one JSON object like {\"question\": \"…\"}, not several")
	}
	if strings.TrimSpace(req.Question) == "" {
		return "", errors.New("missing \"question\": send {\"question\": \"…\"} with a non-empty question")
	}
	return req.Question, nil
}

// Serve is the echo handler of POST /api/ask.
func (h *Handler) Serve(c echo.Context) error {
	if h.lim == nil {
		return c.JSON(http.StatusServiceUnavailable, api.APIError{Error: "agent disabled",
			Detail: "the agent is not running in this daemon (agent.disabled in the config, or no MCP tools to offer)"})
	}
	q, err := ParseAskRequest(http.MaxBytesReader(c.Response(), c.Request().Body, maxAskBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return c.JSON(http.StatusRequestEntityTooLarge, api.APIError{Error: "request too large",
				Detail: fmt.Sprintf("the body is larger than %d bytes; a question is a few KiB at most (agent.max_question_bytes)", maxAskBody)})
		}
		return c.JSON(http.StatusBadRequest, api.APIError{Error: "bad request", Detail: err.Error()})
	}
	release, ok := h.lim.TryAcquire()
	if !ok {
		h.log.Warn("question refused: loop limit reached", "limit", h.lim.Max(), "remote", c.RealIP())
		c.Response().Header().Set("Retry-After", "10")
		return c.JSON(http.StatusTooManyRequests, api.APIError{Error: "too many questions",
			Detail: h.lim.BusyMessage(), Extra: map[string]any{"limit": h.lim.Max()}})
	}
	defer release()
	h.stream(c, q)
	return nil
}

// stream runs q on the held slot and writes its timeline as SSE. The
// request's context ends the loop when the client goes away.
func (h *Handler) stream(c echo.Context, q string) {
	ctx, cancel := context.WithCancel(c.Request().Context())
	defer cancel()
	w := c.Response()
	w.Header().Set("Cache-Control", "no-store") // sse.Writer sets the other SSE headers
	sw := sse.NewWriter(w)
	// After the first failed write (the client left) the writer writes
	// nothing more; the loop is cancelled.
	cancelOnErr := func(err error) {
		if err != nil {
			cancel()
		}
	}
	cancelOnErr(sw.Comment("gpuhost ask"))

	hbDone := make(chan struct{})
	go func() {
		defer close(hbDone)
		t := time.NewTicker(heartbeatEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				cancelOnErr(sw.Comment("keep-alive"))
			}
		}
	}()

	t0 := time.Now()
	sawStop := false
	res := h.lim.Inner().Ask(ctx, q, func(e Event) {
		if e.Kind == EventStop {
			sawStop = true
		}
		cancelOnErr(writeEvent(sw, e))
	})
	if !sawStop {
		// The loop promises a stop event; a client must never wait for one
		// that does not come.
		stop := Event{Seq: len(res.Events) + 1, Kind: EventStop, Time: time.Now(), Reason: res.Stop}
		if stop.Reason == "" {
			stop.Reason, stop.Text = StopError, "the agent loop ended without saying why"
		}
		cancelOnErr(writeEvent(sw, stop))
	}
	cancel()
	<-hbDone
	h.log.Info("ask stream ended", "stop", res.Stop, "steps", res.Steps, "tools", strings.Join(res.ToolsUsed, ","),
		"tool_errors", res.Errors, "question_bytes", len(q), "ms", time.Since(t0).Milliseconds(),
		"remote", c.RealIP(), "client_gone", sw.Err() != nil)
}

// writeEvent sends e as one SSE event: its Seq the id, its Kind the event
// type, the Event as JSON the data.
func writeEvent(sw *sse.Writer, e Event) error {
	data, err := json.Marshal(e)
	if err != nil { // an Event always marshals; stay safe regardless
		data = []byte(`{"kind":"stop","reason":"error","text":"event not encodable"}`)
	}
	return sw.Send(sse.Event{ID: strconv.Itoa(e.Seq), Type: e.Kind, Data: data})
}

// maxSSELine bounds one line, and one event, of a stream ReadEvents
// accepts; an event is a tool result excerpt or an answer, far below it.
const maxSSELine = 4 << 20

// ErrStreamEnded is returned by ReadEvents when the stream closes before
// its stop event (the daemon went away mid-question).
var ErrStreamEnded = errors.New("the answer stream ended before the loop's stop event")

// ReadEvents reads a POST /api/ask answer stream (server-sent events) and
// calls fn for each event in order. It returns nil after the stop event,
// fn's error as is, ErrStreamEnded when the stream ends first, and an error
// naming the bad event when data is not an Event. Comments, ids and
// unknown fields are skipped as the SSE format prescribes.
func ReadEvents(r io.Reader, fn func(Event) error) error {
	rd := sse.NewReader(r, maxSSELine)
	for n := 1; ; n++ {
		ev, err := rd.Next()
		if errors.Is(err, io.EOF) || errors.Is(err, sse.ErrIncomplete) {
			return ErrStreamEnded
		}
		if err != nil {
			return fmt.Errorf("read answer stream: %w", err)
		}
		var e Event
		if err := json.Unmarshal(ev.Data, &e); err != nil {
			return fmt.Errorf("read answer stream: event %d (%q) is not an agent event: %w", n, sseClip(string(ev.Data), 80), err)
		}
		if e.Kind == "" {
			e.Kind = ev.Type
		}
		if err := fn(e); err != nil {
			return err
		}
		if e.Kind == EventStop {
			return nil
		}
	}
}

// sseClip shortens s to n runes for an error message.
func sseClip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "…"
}
