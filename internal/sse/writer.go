package sse

import (
	"errors"
	"net/http"
	"sync"
)

// Header values Writer.Start sets on the response unless the caller has
// set that header already (a caller wanting another Cache-Control, or a
// Content-Type without the charset, sets it before the first write).
var defaultHeaders = [...][2]string{
	{"Content-Type", "text/event-stream; charset=utf-8"},
	{"Cache-Control", "no-cache"},
	// nginx and other reverse proxies hold a response back unless told not to.
	{"X-Accel-Buffering", "no"},
}

// maxKeptBuffer is the largest framing buffer a Writer keeps between
// writes; a larger event's buffer is let go once it is sent.
const maxKeptBuffer = 64 << 10

// Writer writes an SSE response. Each Send or Comment is one write and one
// flush, so the client sees it at once. After the first failed write (the
// client went away) it writes nothing more and every call returns that
// error. Its methods may be called from several goroutines (the loop and a
// heartbeat); their frames never interleave.
type Writer struct {
	w  http.ResponseWriter
	rc *http.ResponseController

	mu      sync.Mutex
	started bool
	err     error
	buf     []byte
}

// NewWriter returns a Writer on w. Nothing is sent before the first Start,
// Send or Comment.
func NewWriter(w http.ResponseWriter) *Writer {
	return &Writer{w: w, rc: http.NewResponseController(w)}
}

// Start sends the response header: status 200 with Content-Type
// "text/event-stream; charset=utf-8", Cache-Control "no-cache" and
// X-Accel-Buffering "no", each unless already set. It does so once; Send
// and Comment call it first.
func (w *Writer) Start() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.start()
}

func (w *Writer) start() {
	if w.started {
		return
	}
	w.started = true
	h := w.w.Header()
	for _, kv := range defaultHeaders {
		if h.Get(kv[0]) == "" {
			h.Set(kv[0], kv[1])
		}
	}
	w.w.WriteHeader(http.StatusOK)
}

// Send writes e and flushes it (see Event for how its fields are written).
// The error is the write's or the flush's; a ResponseWriter that cannot
// flush is written to regardless.
func (w *Writer) Send(e Event) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	w.buf = AppendEvent(w.buf[:0], e)
	return w.write()
}

// Comment writes text as a comment, which every reader skips (a
// keep-alive, a greeting), followed by a blank line, and flushes it.
func (w *Writer) Comment(text string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	w.buf = AppendComment(w.buf[:0], text)
	return w.write()
}

// Err returns the error that stopped the Writer, nil while it writes.
func (w *Writer) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// write sends w.buf; w.mu is held.
func (w *Writer) write() error {
	w.start()
	_, err := w.w.Write(w.buf)
	if cap(w.buf) > maxKeptBuffer {
		w.buf = nil
	}
	if err == nil {
		if ferr := w.rc.Flush(); ferr != nil && !errors.Is(ferr, http.ErrNotSupported) {
			err = ferr
		}
	}
	if err != nil {
		w.err = err
	}
	return err
}

// AppendEvent appends e, framed as Writer.Send writes it, to dst: "id: "
// and "event: " lines when set (a CR or LF in them becomes a space, as it
// would otherwise end the field), one "data: " line per line of e.Data,
// and the blank line that ends the event.
func AppendEvent(dst []byte, e Event) []byte {
	if e.ID != "" {
		dst = appendField(dst, "id", e.ID)
	}
	if e.Type != "" {
		dst = appendField(dst, "event", e.Type)
	}
	dst = appendLines(dst, "data: ", e.Data)
	return append(dst, '\n')
}

// AppendComment appends text as Writer.Comment writes it: ": " and the
// text (one comment line per line of it), then a blank line.
func AppendComment(dst []byte, text string) []byte {
	dst = appendLines(dst, ": ", []byte(text))
	return append(dst, '\n')
}

// appendField appends "name: value\n" with CR and LF in value made spaces.
func appendField(dst []byte, name, value string) []byte {
	dst = append(dst, name...)
	dst = append(dst, ':', ' ')
	for i := 0; i < len(value); i++ {
		c := value[i]
		if c == '\r' || c == '\n' {
			c = ' '
		}
		dst = append(dst, c)
	}
	return append(dst, '\n')
}

// appendLines appends prefix+line+"\n" for each line of b, split at LF,
// CRLF or CR; an empty b is one empty line.
func appendLines(dst []byte, prefix string, b []byte) []byte {
	for {
		i := lineEnd(b)
		if i < 0 {
			dst = append(dst, prefix...)
			dst = append(dst, b...)
			return append(dst, '\n')
		}
		dst = append(dst, prefix...)
		dst = append(dst, b[:i]...)
		dst = append(dst, '\n')
		if b[i] == '\r' && i+1 < len(b) && b[i+1] == '\n' {
			i++
		}
		b = b[i+1:]
	}
}
