// Package sse writes and reads Server-Sent Events (text/event-stream, the
// format of the WHATWG HTML standard, "Server-sent events"), the one way
// gpuhost does either.
//
// gpuhost writes SSE in several places (the daemon's /api/events, the
// agent's /api/ask, the simulator's OpenAI-style "data: {...}" streams
// ending in "data: [DONE]") and reads it in as many (the API client, the
// ask client, the benchmark, the doctor's tool-call probe, the proxy's usage
// tap). Each used to frame or split lines by hand, each a little
// differently. Here is one of each:
//
//   - Writer, over an http.ResponseWriter: sets the SSE headers once, writes
//     events (id, event, data, a multi-line data as several data lines) and
//     comments (keep-alives), flushes each, and is safe for a heartbeat
//     goroutine beside the writer. AppendEvent and AppendComment are its
//     framing, for a caller that builds a body in memory.
//   - Reader, over an io.Reader: yields events as the format defines them
//     (data lines joined by "\n", the id carried over, comments and unknown
//     fields skipped; LF, CRLF and CR all end a line).
//   - Parser: the Reader's line parsing in push form ("feed bytes, get
//     fields") for a caller that sees a stream only as the bytes it copies
//     through, like the proxy, which must not add a copy or a goroutine.
//
// Limits: what a reader reads comes from outside (a model server, a daemon
// across the network), so every Reader and Parser has a maximum size. A
// line, or one event's data, longer than it is ErrTooLong; a Reader stops
// there, a Parser skips the line and goes on. Memory kept is bounded by
// about twice the maximum plus a read buffer.
//
// The package uses the standard library only and imports nothing of
// gpuhost.
package sse

import "errors"

// DefaultMax is the size limit NewReader and NewParser use when given 0 or
// less: 4 MiB, what the daemon's clients have always allowed one line.
const DefaultMax = 4 << 20

// ErrIncomplete is Reader.Next's error when the stream ended inside an
// event that has data, before the blank line that ends it. It is not
// io.ErrUnexpectedEOF, which an HTTP body returns when its transfer is
// cut and which Next passes on as is.
var ErrIncomplete = errors.New("sse: the stream ended inside an event")

// ErrTooLong reports a line, or the data of one event, over the size limit
// of a Reader or a Parser. The Reader wraps it with the limit.
var ErrTooLong = errors.New("sse: too long")

// Event is one server-sent event.
type Event struct {
	// ID is the event's id field. Reading, it is the stream's last event
	// ID: an event without an id field carries the one before, as the
	// format says (a reconnecting client sends it as Last-Event-ID).
	// Writing, an empty ID writes no id field.
	ID string
	// Type is the event field ("switch", "stop"); empty when the event had
	// none (the format calls that type "message"). Writing, an empty Type
	// writes no event field.
	Type string
	// Data is the event's data: its data lines joined by "\n". From a
	// Reader it is valid until the next call to Next. Writing, each line of
	// it (split at LF, CRLF or CR) goes out as one data line; an empty Data
	// is one empty data line, so the event still arrives.
	Data []byte
}
