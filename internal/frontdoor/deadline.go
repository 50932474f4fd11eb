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
