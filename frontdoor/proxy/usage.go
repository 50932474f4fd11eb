package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"mime"
	"time"
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
// token usage out of the stream: for SSE, each complete `data:` line that
// mentions "usage" is decoded (the last usage seen wins: with
// stream_options.include_usage it is the chunk before [DONE]); for a JSON
// answer, the body's "usage" member at EOF. It runs in the goroutine that
// copies the response (httputil.ReverseProxy copies synchronously inside
// ServeHTTP), so its fields are read safely once ServeHTTP returns.
type usageTap struct {
	rc   io.ReadCloser
	mode tapMode

	first     time.Time
	bytes     int64
	line      []byte // the current SSE line when it spans reads
	skipLine  bool   // the current SSE line is too long to examine
	body      []byte // JSON mode: the answer so far
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
	return &usageTap{rc: rc, mode: mode}
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

// feedSSE splits the stream into lines; a line that lies whole inside p is
// examined in place, only a line that spans reads is copied aside.
func (t *usageTap) feedSSE(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			t.keep(p)
			return
		}
		if len(t.line) == 0 && !t.skipLine {
			t.sseLine(p[:i])
		} else {
			t.keep(p[:i])
			if !t.skipLine {
				t.sseLine(t.line)
			}
		}
		t.line, t.skipLine = t.line[:0], false
		p = p[i+1:]
	}
}

func (t *usageTap) keep(p []byte) {
	if t.skipLine {
		return
	}
	if len(t.line)+len(p) > maxSSELine {
		t.line, t.skipLine = t.line[:0], true
		return
	}
	t.line = append(t.line, p...)
}

var (
	dataPrefix = []byte("data:")
	usageKey   = []byte(`"usage"`)
	doneMarker = []byte("[DONE]")
)

// sseLine examines one complete SSE line.
func (t *usageTap) sseLine(line []byte) {
	line = bytes.TrimSuffix(line, []byte{'\r'})
	payload, ok := bytes.CutPrefix(line, dataPrefix)
	if !ok {
		return
	}
	payload = bytes.TrimLeft(payload, " ")
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
		if len(t.line) > 0 && !t.skipLine {
			t.sseLine(t.line)
		}
		t.line = nil
	}
}
