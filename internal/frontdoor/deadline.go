package frontdoor

import (
	"errors"
	"io"
	"net/http"
	"time"
)

// withReadDeadline bounds the time to receive a request body: the
// connection's read deadline is set now and cleared once the body is read
// to its end or closed. A server-wide http.Server.ReadTimeout would do the
// first half, but it stays armed while the handler streams its answer, and
// net/http's background read then cancels the request of a long stream.
func withReadDeadline(w http.ResponseWriter, body io.ReadCloser, d time.Duration) io.ReadCloser {
	rc := http.NewResponseController(w)
	if err := rc.SetReadDeadline(time.Now().Add(d)); err != nil {
		return body // a writer without deadlines (tests' recorders): nothing to bound
	}
	return &deadlineBody{ReadCloser: body, rc: rc}
}

type deadlineBody struct {
	io.ReadCloser
	rc      *http.ResponseController
	cleared bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) {
		b.clear()
	}
	return n, err
}

func (b *deadlineBody) Close() error {
	b.clear()
	return b.ReadCloser.Close()
}

func (b *deadlineBody) clear() {
	if !b.cleared {
		b.cleared = true
		_ = b.rc.SetReadDeadline(time.Time{})
	}
}

// withWriteDeadline arms the connection's write deadline before each write
// and flush of the answer, d from then: a client that stops reading is cut
// once one write has waited d, while a stream that a client reads may run
// for as long as it likes (a server-wide http.Server.WriteTimeout would cut
// every answer d after its request). The returned function re-arms it when
// the handler returns, for what net/http still writes then. w is returned
// unchanged when it has no deadlines (tests' recorders).
func withWriteDeadline(w http.ResponseWriter, d time.Duration) (http.ResponseWriter, func()) {
	rc := http.NewResponseController(w)
	if err := rc.SetWriteDeadline(time.Now().Add(d)); err != nil {
		return w, func() {}
	}
	dw := &deadlineWriter{ResponseWriter: w, rc: rc, d: d}
	return dw, dw.arm
}

type deadlineWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
	d  time.Duration
}

func (w *deadlineWriter) arm() { _ = w.rc.SetWriteDeadline(time.Now().Add(w.d)) }

func (w *deadlineWriter) Write(p []byte) (int, error) {
	w.arm()
	return w.ResponseWriter.Write(p)
}

func (w *deadlineWriter) WriteHeader(code int) {
	w.arm()
	w.ResponseWriter.WriteHeader(code)
}

// FlushError is what http.ResponseController.Flush calls.
func (w *deadlineWriter) FlushError() error {
	w.arm()
	return w.rc.Flush()
}

// Flush serves handlers that assert http.Flusher.
func (w *deadlineWriter) Flush() { _ = w.FlushError() }

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
