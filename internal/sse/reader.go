package sse

import (
	"bytes"
	"errors"
	"fmt"
	"io"
)

// readBufferSize is the Reader's read buffer; a longer line is collected
// by its Parser, up to the limit.
const readBufferSize = 64 << 10

// maxEmptyReads is how many reads in a row may return nothing before the
// Reader gives up with io.ErrNoProgress, as bufio does.
const maxEmptyReads = 100

var bom = []byte("\xEF\xBB\xBF")

// Field is one line of a stream that is not a comment: Name is the part
// before the first colon (the whole line without one), Value the rest
// with one leading space removed. A blank line, which ends an event, is a
// Field with an empty Name.
type Field struct {
	Name, Value []byte
}

// Parser splits a stream fed to it piece by piece into fields, the push
// form of what a Reader does: a line that lies whole in a piece is handed
// out in place, without a copy; only a line that spans pieces is kept
// aside, up to the limit. Comments are skipped. A Parser is not safe for
// concurrent use.
type Parser struct {
	max     int
	line    []byte // the start of a line that spans Feed calls
	skip    bool   // the current line is over the limit: dropped to its end
	cr      bool   // the last byte fed ended a line with CR: a LF next is part of it
	started bool   // the first line, which may begin with a BOM, is behind
}

// NewParser returns a Parser whose lines may be max bytes long
// (DefaultMax when max <= 0).
func NewParser(max int) *Parser {
	if max <= 0 {
		max = DefaultMax
	}
	return &Parser{max: max}
}

// Feed consumes b up to the end of its first complete field (comments are
// consumed and skipped) and returns how many bytes it consumed and, with ok
// true, that field. With ok false and no error it consumed all of b
// (n == len(b)) and keeps the start of an unfinished line for the next
// Feed. A non-empty b
// is always consumed in part at least, so a caller loops until b is used
// up. The field's bytes point into b or into the Parser and are valid
// until the next Feed or End.
//
// A line over the limit is dropped to its end and reported once with
// ErrTooLong (ok false, n bytes consumed); the caller may go on feeding.
func (p *Parser) Feed(b []byte) (n int, f Field, ok bool, err error) {
	for n < len(b) {
		rest := b[n:]
		if p.cr {
			p.cr = false
			if rest[0] == '\n' {
				n++
				continue
			}
		}
		i := lineEnd(rest)
		if i < 0 {
			return len(b), Field{}, false, p.keep(rest)
		}
		term := 1
		if rest[i] == '\r' {
			if i+1 == len(rest) {
				p.cr = true
			} else if rest[i+1] == '\n' {
				term = 2
			}
		}
		n += i + term
		first := !p.started
		p.started = true
		line := rest[:i]
		if len(p.line) > 0 || p.skip {
			skipped := p.skip
			err := p.keep(line)
			line = p.line
			p.line, p.skip = p.line[:0], false
			if err != nil {
				return n, Field{}, false, err
			}
			if skipped {
				continue
			}
		} else if len(line) > p.max {
			return n, Field{}, false, ErrTooLong
		}
		if f, ok := field(line, first); ok {
			return n, f, true, nil
		}
	}
	return n, Field{}, false, nil
}

// Pending reports that the Parser holds the start of a line that no line
// end has finished yet: a stream cut now ends in the middle of a line.
func (p *Parser) Pending() bool { return len(p.line) > 0 || p.skip }

// End tells the Parser the stream ended. If its last line had no line
// end, End returns that line's field (ok false when there is none, or it
// was a comment or over the limit). The format says such a line is
// dropped, with the event it belongs to; a Reader uses it only to report
// what an unfinished event held. The Parser is then ready for a new
// stream.
func (p *Parser) End() (f Field, ok bool) {
	line, skipped, first := p.line, p.skip, !p.started
	p.line, p.skip, p.cr, p.started = p.line[:0], false, false, false
	if skipped || len(line) == 0 {
		return Field{}, false
	}
	return field(line, first)
}

// keep adds b to the unfinished line, or starts skipping it when it would
// grow over the limit (reported once, with ErrTooLong).
func (p *Parser) keep(b []byte) error {
	if p.skip {
		return nil
	}
	if len(p.line)+len(b) > p.max {
		p.line, p.skip = p.line[:0], true
		return ErrTooLong
	}
	p.line = append(p.line, b...)
	return nil
}

// field parses one complete line, the stream's first when first is set
// (a byte order mark before it is dropped); ok is false for a comment.
func field(line []byte, first bool) (Field, bool) {
	if first {
		line = bytes.TrimPrefix(line, bom)
	}
	if len(line) == 0 {
		return Field{}, true
	}
	if line[0] == ':' {
		return Field{}, false
	}
	i := bytes.IndexByte(line, ':')
	if i < 0 {
		return Field{Name: line, Value: line[len(line):]}, true
	}
	value := line[i+1:]
	if len(value) > 0 && value[0] == ' ' {
		value = value[1:]
	}
	return Field{Name: line[:i], Value: value}, true
}

// lineEnd returns the index of the first CR or LF in b, or -1.
func lineEnd(b []byte) int {
	i := bytes.IndexByte(b, '\n')
	s := b
	if i >= 0 {
		s = b[:i]
	}
	if j := bytes.IndexByte(s, '\r'); j >= 0 {
		return j
	}
	return i
}

// Reader reads server-sent events from an io.Reader. It is not safe for
// concurrent use.
type Reader struct {
	r          io.Reader
	p          Parser
	max        int
	buf        []byte
	start, end int   // buf[start:end] is read and not yet parsed
	rerr       error // the last Read's error, acted on once buf is parsed
	err        error // what Next returns from now on

	id   string
	typ  string
	data []byte
	have bool // data holds at least one data line
}

// NewReader returns a Reader of r whose lines, and events' data, may be
// max bytes long (DefaultMax when max <= 0).
func NewReader(r io.Reader, max int) *Reader {
	if max <= 0 {
		max = DefaultMax
	}
	return &Reader{r: r, p: Parser{max: max}, max: max}
}

// Next returns the next event. Its errors:
//
//   - io.EOF: the stream ended where an event may end.
//   - ErrIncomplete: the stream ended inside an event that had data (cut
//     before its blank line). The format says to drop that event; Next
//     returns it with the error, for a caller that wants to know what a
//     cut stream said last.
//   - ErrTooLong (wrapped, with the limit): a line or an event's data is
//     over the limit.
//   - the underlying reader's error, as is.
//
// After an error, Next returns the same error again (without an event).
func (r *Reader) Next() (Event, error) {
	if r.err != nil {
		return Event{}, r.err
	}
	if r.buf == nil {
		r.buf = make([]byte, readBufferSize)
	}
	empty := 0
	for {
		if r.start < r.end {
			n, f, ok, err := r.p.Feed(r.buf[r.start:r.end])
			r.start += n
			if err != nil {
				return r.fail(fmt.Errorf("%w: a line is over %d bytes", err, r.max))
			}
			if !ok {
				continue
			}
			e, done, err := r.field(f)
			if err != nil {
				return r.fail(err)
			}
			if done {
				return e, nil
			}
			continue
		}
		if r.rerr != nil {
			return r.finish()
		}
		n, err := r.r.Read(r.buf)
		if n < 0 || n > len(r.buf) {
			n, err = 0, errors.New("sse: the underlying reader returned an impossible count")
		}
		r.start, r.end, r.rerr = 0, n, err
		if n == 0 && err == nil {
			if empty++; empty >= maxEmptyReads {
				r.rerr = io.ErrNoProgress
			}
		} else {
			empty = 0
		}
	}
}

// field applies one field to the event being read; done reports an event
// complete.
func (r *Reader) field(f Field) (e Event, done bool, err error) {
	switch string(f.Name) {
	case "":
		if !r.have {
			r.typ = ""
			return Event{}, false, nil
		}
		return r.event(), true, nil
	case "event":
		if string(f.Value) != r.typ {
			r.typ = string(f.Value)
		}
	case "data":
		if r.have {
			if len(r.data)+1+len(f.Value) > r.max {
				return Event{}, false, fmt.Errorf("%w: an event's data is over %d bytes", ErrTooLong, r.max)
			}
			r.data = append(r.data, '\n')
		}
		r.data = append(r.data, f.Value...)
		r.have = true
	case "id":
		if bytes.IndexByte(f.Value, 0) < 0 && string(f.Value) != r.id {
			r.id = string(f.Value)
		}
	}
	return Event{}, false, nil
}

// event hands out the event read so far and starts the next one. Its Data
// stays valid until data is appended to again, in a later Next.
func (r *Reader) event() Event {
	e := Event{ID: r.id, Type: r.typ, Data: r.data}
	r.typ, r.data, r.have = "", r.data[:0], false
	return e
}

// finish ends the stream at a Read error, once what came before it is
// parsed.
func (r *Reader) finish() (Event, error) {
	if r.rerr != io.EOF {
		return r.fail(r.rerr)
	}
	if f, ok := r.p.End(); ok {
		if _, _, err := r.field(f); err != nil {
			return r.fail(err)
		}
	}
	if r.have {
		e := r.event()
		r.err = ErrIncomplete
		return e, ErrIncomplete
	}
	return r.fail(io.EOF)
}

func (r *Reader) fail(err error) (Event, error) {
	r.err = err
	return Event{}, err
}
