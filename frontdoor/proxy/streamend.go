package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"time"

	"gpuhost/internal/apishape"
	"gpuhost/internal/sse"
)

// A streamed answer must never look complete when it is not. The APIs'
// streams end with a marker (chat and completions "data: [DONE]",
// Messages message_stop, Responses response.completed, .incomplete or
// .failed); a client that reads the end of the body without it may still
// take the text so far as the whole answer (many do). So when the stream
// to the client cannot reach its marker, the proxy ends it with an error
// event in the API's shape (apishape.StreamError) and then ends the body
// cleanly:
//
//   - a switch cut the request (the drain ran out of switch.drain_timeout,
//     drain.go): 503 switch_cut, Anthropic's overloaded_error, which the
//     SDKs retry; the retry is held until the switch is done;
//   - the backend's body ended without the marker, or broke off (the
//     backend was put to sleep, stopped or died mid-answer): 502
//     stream_incomplete, Anthropic's api_error;
//   - a chat or completions stream that the backend aborted: vLLM ends an
//     aborted request (put to sleep under it, mode abort) with a chunk
//     whose finish_reason is "abort" and then "data: [DONE]", which an
//     OpenAI client takes for a finished answer. The [DONE] is dropped
//     and the error event (502 stream_aborted) takes its place.
//
// When the client itself left, nothing is written (there is no one to
// tell). A backend that sent its own error event (vLLM's, Ollama's) has
// said why; nothing is added after it. The error event is framed by
// internal/sse. If the stream broke in the middle of an event (backends
// write one event per chunk, so this is rare), that event is ended first:
// the client then reads a broken event and the error after it, never a
// complete-looking answer.

// streamEnd is the part of a usageTap that ends a stream (see above).
type streamEnd struct {
	x      *exchange
	open   bool // an event has begun and its blank line has not come yet
	sawErr bool // the backend sent its own error event
	// aborted is set by a chunk with finish_reason "abort"; dropDone by
	// the [DONE] after it, and dropAt to where that line begins in the
	// read that holds it (-1: none).
	aborted, dropDone bool
	dropAt            int
	// respID, model and createdAt are the Responses stream's response,
	// repeated by response.failed.
	respID, model string
	createdAt     int64

	fail *apiErr // why the stream ended with an error event; nil while it runs or when it ended well
	tail []byte  // the rest of the error event, still to be read
}

// guardEnd makes the tap end an answer of status with an error event
// when it cannot reach its end marker: SSE answers with 2xx status of
// the APIs whose streams have one.
func (t *usageTap) guardEnd(x *exchange, status int) {
	if t.mode != tapSSE || status < 200 || status > 299 {
		return
	}
	switch t.kind {
	case apishape.Chat, apishape.Completions, apishape.Messages, apishape.Responses:
		t.end = &streamEnd{x: x, dropAt: -1}
	}
}

// failed is why the stream ended with gpuhost's error event, or nil.
func (t *usageTap) failed() *apiErr {
	if t == nil || t.end == nil {
		return nil
	}
	return t.end.fail
}

// endStream handles the upstream body's end (err io.EOF) or failure; n
// bytes came with it. A stream that is over without its marker gets the
// error event, which the following Reads return, then io.EOF.
func (t *usageTap) endStream(n int, err error) (int, error) {
	e := t.end
	prefix := boundary(t.lines, e.open)
	if err == io.EOF {
		t.eof = true
		t.finish()
		if t.sawDone || e.sawErr {
			return n, err
		}
	}
	if err != io.EOF && e.x.client.Err() != nil {
		return n, err // the client left: there is no one to tell
	}
	if t.sawDone && err != io.EOF {
		return n, err // the whole answer went out; only the body's end broke
	}
	e.fail = streamFailure(e.x, err)
	ev, data := apishape.StreamError(t.kind, &apishape.Error{Status: e.fail.status, Type: e.fail.typ, Code: e.fail.code, Message: e.fail.msg},
		apishape.Stream{ResponseID: e.respID, Model: e.model, Sequence: t.events, Created: e.createdOr(time.Now().Unix())})
	e.tail = sse.AppendEvent(append([]byte(nil), prefix...), sse.Event{Type: ev, Data: data})
	t.eof = false
	if n > 0 {
		return n, nil
	}
	return e.readTail(nil)
}

// abortedEnd returns the n bytes of the read before the aborted answer's
// "data: [DONE]"; the error event follows in the next Reads, then io.EOF.
func (t *usageTap) abortedEnd(n int) (int, error) {
	e := t.end
	e.dropAt = -1
	e.fail = &apiErr{status: http.StatusBadGateway, typ: "server_error", code: "stream_aborted",
		msg: `the backend aborted the answer (finish_reason "abort": it was put to sleep or stopped under it): the answer is incomplete; retry the request`}
	prefix := ""
	if n == 0 && e.open {
		prefix = "\n\n" // the [DONE] line began in an earlier read, which went out
	}
	ev, data := apishape.StreamError(t.kind, &apishape.Error{Status: e.fail.status, Type: e.fail.typ, Code: e.fail.code, Message: e.fail.msg}, apishape.Stream{})
	e.tail = sse.AppendEvent([]byte(prefix), sse.Event{Type: ev, Data: data})
	t.lines = nil // nothing more of the backend is read
	if n > 0 {
		return n, nil
	}
	return e.readTail(nil)
}

// boundary is what ends the event the stream stopped in: "\n\n" in the
// middle of a line, "\n" after an event's last line, nothing between
// events.
func boundary(lines *sse.Parser, open bool) string {
	switch {
	case lines != nil && lines.Pending():
		return "\n\n"
	case open:
		return "\n"
	}
	return ""
}

// streamFailure says why a stream did not reach its end marker.
func streamFailure(x *exchange, err error) *apiErr {
	if x.flight != nil && x.flight.cut.Load() {
		return switchCut(x)
	}
	what := "the backend ended the stream without its end marker"
	if err != io.EOF {
		what = "the backend broke off the stream (" + err.Error() + ")"
	}
	return &apiErr{status: http.StatusBadGateway, typ: "server_error", code: "stream_incomplete",
		msg: what + ": the answer is incomplete (the backend was stopped, put to sleep or crashed mid-answer); retry the request"}
}

// switchCut is the error of a request a switch cut.
func switchCut(x *exchange) *apiErr {
	return &apiErr{status: http.StatusServiceUnavailable, typ: "service_unavailable", code: "switch_cut", retryAfter: true,
		msg: "the GPU is switching away from profile " + x.prof.Name + " and this request was still running when switch.drain_timeout ran out; the answer is incomplete, retry the request"}
}

// readTail returns the error event's bytes, then io.EOF. A nil p only
// starts it (the caller had bytes of its own to return).
func (e *streamEnd) readTail(p []byte) (int, error) {
	n := copy(p, e.tail)
	e.tail = e.tail[n:]
	if len(e.tail) == 0 {
		e.tail = nil
		return n, io.EOF
	}
	return n, nil
}

func (e *streamEnd) createdOr(now int64) int64 {
	if e.createdAt > 0 {
		return e.createdAt
	}
	return now
}

var (
	errorKey = []byte(`{"error"`)
	abortKey = []byte(`"finish_reason":"abort"`)
)

// backendError notes an error event of the backend's own (an "error"
// event, or chat's data-only {"error":…}); after it the stream may end
// without a marker.
func (e *streamEnd) backendError(kind apishape.Kind, event, payload []byte) bool {
	if string(event) == "error" || (kind == apishape.Chat || kind == apishape.Completions) && bytes.HasPrefix(payload, errorKey) {
		e.sawErr = true
		return true
	}
	return false
}

// created reads the Responses stream's response.created event: the id,
// model and creation time its response.failed would repeat.
func (e *streamEnd) created(payload []byte) {
	var d struct {
		Response struct {
			ID        string `json:"id"`
			Model     string `json:"model"`
			CreatedAt int64  `json:"created_at"`
		} `json:"response"`
	}
	if json.Unmarshal(payload, &d) == nil {
		e.respID, e.model, e.createdAt = d.Response.ID, d.Response.Model, d.Response.CreatedAt
	}
}
