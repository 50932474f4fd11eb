package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"mime"
	"time"

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
// token usage out of the stream: for SSE, each complete `data:` line (as
// internal/sse's Parser splits them: in place, copied aside only when a
// line spans reads) that mentions "usage" is decoded (the last usage seen
// wins: with stream_options.include_usage it is the chunk before [DONE]);
// for a JSON answer, the body's "usage" member at EOF. It runs in the
// goroutine that copies the response (httputil.ReverseProxy copies
// synchronously inside ServeHTTP), so its fields are read safely once
// ServeHTTP returns.
type usageTap struct {
	rc   io.ReadCloser
	mode tapMode

	first     time.Time
	bytes     int64
	lines     *sse.Parser // SSE mode
	body      []byte      // JSON mode: the answer so far
	tooBig    bool
	haveUsage bool
	prompt    int
	compl     int
	sawDone   bool
	events    int
	eof       bool // the backend's whole answer was read
}

// tapModeFor picks how to read usage from a response's media type; encoded
// (compressed) bodies are passed through unexamined.
func tapModeFor(contentType, contentEncoding string) tapMode {
	if contentEncoding != "" && contentEncoding != "identity" {
		return tapNone
	}
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
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

func newUsageTap(rc io.ReadCloser, mode tapMode) *usageTap {
	t := &usageTap{rc: rc, mode: mode}
	if mode == tapSSE {
		t.lines = sse.NewParser(maxSSELine)
	}
	return t
}

func (t *usageTap) Read(p []byte) (int, error) {
	n, err := t.rc.Read(p)
	if n > 0 {
		if t.first.IsZero() {
			t.first = time.Now()
		}
		t.bytes += int64(n)
		t.feed(p[:n])
	}
	if err == io.EOF {
		t.eof = true
		t.finish()
	}
	return n, err
}

func (t *usageTap) Close() error { return t.rc.Close() }

// complete reports whether the client was sent the whole answer: the body
// was read to its end, or a stream reached its "data: [DONE]" (a client
// may close right then, before the backend's end of body is read).
func (t *usageTap) complete() bool {
	return t != nil && (t.eof || (t.mode == tapSSE && t.sawDone))
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
	for t.lines != nil && len(p) > 0 {
		n, f, ok, _ := t.lines.Feed(p)
		p = p[n:]
		if ok {
			t.sseField(f)
		}
	}
}

var (
	usageKey   = []byte(`"usage"`)
	doneMarker = []byte("[DONE]")
)

// sseField examines one field of the stream.
func (t *usageTap) sseField(f sse.Field) {
	if string(f.Name) != "data" {
		return
	}
	payload := bytes.TrimLeft(f.Value, " ")
	t.events++
	if bytes.Equal(payload, doneMarker) {
		t.sawDone = true
		return
	}
	if bytes.Contains(payload, usageKey) {
		t.usageFrom(payload)
	}
}

// usageFrom reads {"usage": {"prompt_tokens", "completion_tokens"}} from a
// chunk or a whole answer; anything else leaves the counts as they were.
func (t *usageTap) usageFrom(doc []byte) {
	var v struct {
		Usage *struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if json.Unmarshal(doc, &v) != nil || v.Usage == nil {
		return
	}
	t.haveUsage, t.prompt, t.compl = true, v.Usage.PromptTokens, v.Usage.CompletionTokens
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
