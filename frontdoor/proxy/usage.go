package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"time"

	"gpuhost/internal/apishape"
	"gpuhost/internal/sse"
)

// Limits of what the usage tap keeps aside. They bound memory per request;
// they never hold back a byte from the client (the tap copies, the client
// gets the bytes as they arrive).
const (
	// maxSSELine is the longest SSE line examined for usage; a longer one
	// (a huge tool-call argument chunk) is passed through unexamined.
	maxSSELine = 1 << 20
	// maxJSONBody is the largest non-streamed JSON answer whose usage is
	// read; larger ones (embeddings of long inputs) are logged without it.
	maxJSONBody = 4 << 20
)

type tapMode int

const (
	tapNone tapMode = iota
	tapSSE
	tapJSON
)

// usageTap wraps an upstream response body. Every Read passes the bytes on
// unchanged; on the side it notes when the first byte came and picks the
// token usage out of the answer in the shape of the request's API (kind):
//
//   - chat, completions, embeddings: the "usage" member of the answer, or
//     of the stream's chunks (the last seen wins: with
//     stream_options.include_usage it is the chunk before [DONE]), which
//     ends at "data: [DONE]";
//   - Anthropic Messages: the answer's usage; streamed, message_start's
//     message.usage, then each message_delta's usage (output_tokens is
//     cumulative), ending at message_stop; the prompt counts the cached
//     input too (Anthropic's input_tokens leaves it out);
//   - OpenAI Responses: the answer's usage; streamed, the usage of the
//     response in response.completed (or .incomplete / .failed), which ends
//     the stream.
//
// Only SSE data lines that mention "usage" (or may be the end event) are
// decoded, as internal/sse's Parser splits them: in place, copied aside
// only when a line spans reads. It runs in the goroutine that copies the
// response (httputil.ReverseProxy copies synchronously inside ServeHTTP),
// so its fields are read safely once ServeHTTP returns.
type usageTap struct {
	rc   io.ReadCloser
	mode tapMode
	kind apishape.Kind

	first     time.Time
	bytes     int64
	lines     *sse.Parser // SSE mode
	event     []byte      // SSE mode: the current event's "event:" name
	body      []byte      // JSON mode: the answer so far
	tooBig    bool
	haveUsage bool
	prompt    int
	compl     int
	sawDone   bool   // the stream's own end marker went by
	late      bool   // usage came after the end marker (ignored)
	bad       string // why a usage report was refused (usagecheck.go)
	events    int
	eof       bool // the backend's whole answer was read

	// How the stream ends (streamend.go): set by guardEnd for an SSE
	// answer of an API whose streams have an end marker.
	end *streamEnd
}

// tapModeFor picks how to read usage from a response's media type; encoded
// (compressed) bodies are passed through unexamined.
func tapModeFor(contentType, contentEncoding string) tapMode {
	if contentEncoding != "" && contentEncoding != "identity" {
		return tapNone
	}
	mt, ok := mediaType(contentType)
	if !ok {
		return tapNone
	}
	switch mt {
	case "text/event-stream":
		return tapSSE
	case "application/json":
		return tapJSON
	}
	return tapNone
}

func newUsageTap(rc io.ReadCloser, mode tapMode, kind apishape.Kind) *usageTap {
	t := &usageTap{rc: rc, mode: mode, kind: kind}
	if mode == tapSSE {
		t.lines = sse.NewParser(maxSSELine)
	}
	return t
}

func (t *usageTap) Read(p []byte) (int, error) {
	if t.end != nil && t.end.tail != nil {
		return t.end.readTail(p)
	}
	n, err := t.rc.Read(p)
	if n > 0 {
		if t.first.IsZero() {
			t.first = time.Now()
		}
		t.bytes += int64(n)
		t.feed(p[:n])
	}
	if t.end != nil && t.end.dropAt >= 0 {
		return t.abortedEnd(t.end.dropAt)
	}
	if err != nil && t.end != nil {
		return t.endStream(n, err)
	}
	if err == io.EOF {
		t.eof = true
		t.finish()
	}
	return n, err
}

func (t *usageTap) Close() error { return t.rc.Close() }

// complete reports whether the client was sent the whole answer: the body
// was read to its end, or a stream reached its API's end marker ("data:
// [DONE]", message_stop, response.completed): a client may close right
// then, before the backend's end of body is read. A stream that ended
// with gpuhost's error event is not complete.
func (t *usageTap) complete() bool {
	return t != nil && t.failed() == nil && (t.eof || (t.mode == tapSSE && t.sawDone))
}

// feed examines one piece of the body.
func (t *usageTap) feed(p []byte) {
	switch t.mode {
	case tapSSE:
		t.feedSSE(p)
	case tapJSON:
		if t.tooBig {
			return
		}
		if len(t.body)+len(p) > maxJSONBody {
			t.tooBig, t.body = true, nil
			return
		}
		t.body = append(t.body, p...)
	}
}

// feedSSE splits the stream into fields. It acts on each data line as it
// comes, not on the blank line that ends the event: a client may close the
// moment it reads "data: [DONE]" (see complete). An over-long line is
// skipped by the Parser; its usage is not read.
func (t *usageTap) feedSSE(p []byte) {
	off := 0
	for t.lines != nil && off < len(p) {
		n, f, ok, _ := t.lines.Feed(p[off:])
		if ok {
			t.sseField(f)
			if e := t.end; e != nil && e.dropDone && e.dropAt < 0 {
				// An aborted answer's "data: [DONE]": it and what
				// follows are not passed on (streamend.go).
				e.dropAt = off
				return
			}
		}
		off += n
	}
}

var (
	usageKey   = []byte(`"usage"`)
	doneMarker = []byte("[DONE]")
	stopKey    = []byte(`"message_stop"`)
	createdKey = []byte(`"response.created"`)
)

// sseField examines one field of the stream.
func (t *usageTap) sseField(f sse.Field) {
	if t.end != nil {
		t.end.open = len(f.Name) > 0 // a blank line ends the event
	}
	switch string(f.Name) {
	case "event":
		t.event = append(t.event[:0], f.Value...)
		return
	case "":
		t.event = t.event[:0] // a blank line ends the event
		return
	case "data":
	default:
		return
	}
	payload := bytes.TrimLeft(f.Value, " ")
	t.events++
	if t.end != nil && t.end.backendError(t.kind, t.event, payload) {
		return
	}
	if t.sawDone {
		// The final event went by: nothing after it counts.
		if bytes.Contains(payload, usageKey) {
			t.late = true
		}
		return
	}
	switch t.kind {
	case apishape.Messages:
		t.messagesData(payload)
	case apishape.Responses:
		t.responsesData(payload)
	default:
		if bytes.Equal(payload, doneMarker) {
			if t.end != nil && t.end.aborted {
				t.end.dropDone = true
				return
			}
			t.sawDone = true
			return
		}
		if t.end != nil && bytes.Contains(payload, abortKey) {
			t.end.aborted = true
		}
		if bytes.Contains(payload, usageKey) {
			t.usageFrom(payload)
		}
	}
}

// messagesData reads an Anthropic stream event. Its type is the "event:"
// line when the backend sends one (Anthropic, vLLM and Ollama do), else the
// payload's "type".
func (t *usageTap) messagesData(payload []byte) {
	name := string(t.event)
	if name != "" && name != "message_start" && name != "message_delta" && name != "message_stop" {
		return // content blocks and pings carry no usage
	}
	if name == "message_stop" {
		t.sawDone = true
		return
	}
	if name == "" && !bytes.Contains(payload, usageKey) && !bytes.Contains(payload, stopKey) {
		return
	}
	var d usageDoc
	if json.Unmarshal(payload, &d) != nil {
		return
	}
	switch d.Type {
	case "message_stop":
		t.sawDone = true
	case "message_start":
		if d.Message != nil && d.Message.Usage != nil {
			t.anthropicUsage(d.Message.Usage, true)
		}
	case "message_delta":
		if d.Usage != nil {
			t.anthropicUsage(d.Usage, false)
		}
	}
}

// anthropicUsage takes an Anthropic usage object: a whole one (a message's)
// sets both counts; a delta's sets the output and, when it carries one, the
// input.
func (t *usageTap) anthropicUsage(u *usageFields, whole bool) {
	if !t.takeCounts(u.InputTokens, u.CacheCreationInputTokens, u.CacheReadInputTokens, u.OutputTokens) {
		return
	}
	if whole || u.InputTokens != nil {
		t.prompt = deref(u.InputTokens) + deref(u.CacheCreationInputTokens) + deref(u.CacheReadInputTokens)
	}
	if whole || u.OutputTokens != nil {
		t.compl = deref(u.OutputTokens)
	}
	t.haveUsage = true
}

// responsesData reads an OpenAI Responses stream event: only the final
// response (completed, incomplete or failed) carries the usage.
func (t *usageTap) responsesData(payload []byte) {
	name := string(t.event)
	if t.end != nil && t.end.respID == "" && (name == "response.created" || name == "" && bytes.Contains(payload, createdKey)) {
		t.end.created(payload)
		return
	}
	if name != "" && !terminalResponseEvent(name) {
		return
	}
	if name == "" && !bytes.Contains(payload, usageKey) {
		return
	}
	var d usageDoc
	if json.Unmarshal(payload, &d) != nil || !terminalResponseEvent(d.Type) {
		return
	}
	t.sawDone = true
	if d.Response != nil && d.Response.Usage != nil {
		t.responsesUsage(d.Response.Usage)
	}
}

func terminalResponseEvent(typ string) bool {
	return typ == "response.completed" || typ == "response.incomplete" || typ == "response.failed"
}

func (t *usageTap) responsesUsage(u *usageFields) {
	if !t.takeCounts(u.InputTokens, u.OutputTokens) {
		return
	}
	t.haveUsage, t.prompt, t.compl = true, deref(u.InputTokens), deref(u.OutputTokens)
}

// usageFields is a usage object of any of the APIs: OpenAI chat's
// prompt/completion tokens, Anthropic's and Responses' input/output tokens.
type usageFields struct {
	PromptTokens             *int `json:"prompt_tokens"`
	CompletionTokens         *int `json:"completion_tokens"`
	InputTokens              *int `json:"input_tokens"`
	OutputTokens             *int `json:"output_tokens"`
	CacheCreationInputTokens *int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     *int `json:"cache_read_input_tokens"`
}

// usageDoc is the part of an answer or stream event that holds usage.
type usageDoc struct {
	Type     string       `json:"type"`
	Usage    *usageFields `json:"usage"`
	Message  *usageHolder `json:"message"`
	Response *usageHolder `json:"response"`
}

type usageHolder struct {
	Usage *usageFields `json:"usage"`
}

func deref(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}

// usageFrom reads the usage of a chat chunk or of a whole answer of any
// API; anything else leaves the counts as they were.
func (t *usageTap) usageFrom(doc []byte) {
	var v usageDoc
	if json.Unmarshal(doc, &v) != nil || v.Usage == nil {
		return
	}
	switch t.kind {
	case apishape.Messages:
		t.anthropicUsage(v.Usage, true)
	case apishape.Responses:
		t.responsesUsage(v.Usage)
	default:
		if !t.takeCounts(v.Usage.PromptTokens, v.Usage.CompletionTokens) {
			return
		}
		t.haveUsage, t.prompt, t.compl = true, deref(v.Usage.PromptTokens), deref(v.Usage.CompletionTokens)
	}
}

// finish handles the end of the body: a JSON answer is read for usage; an
// SSE stream's unterminated last line is examined.
func (t *usageTap) finish() {
	switch t.mode {
	case tapJSON:
		if !t.tooBig && len(t.body) > 0 {
			t.usageFrom(t.body)
		}
		t.body = nil
	case tapSSE:
		if t.lines == nil {
			return
		}
		if f, ok := t.lines.End(); ok {
			t.sseField(f)
		}
		t.lines = nil
	}
}
