package sse

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
)

// ev is an event as the tests compare it.
type ev struct {
	ID, Type, Data string
}

// readAll reads every event of r and the error that ended it; the event
// returned with ErrIncomplete is the last one, marked with cut.
func readAll(r *Reader) (events []ev, cut bool, err error) {
	for {
		e, err := r.Next()
		if err == nil || errors.Is(err, ErrIncomplete) {
			events = append(events, ev{e.ID, e.Type, string(e.Data)})
		}
		if err != nil {
			return events, errors.Is(err, ErrIncomplete), err
		}
	}
}

func TestReader(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		want    []ev
		cut     bool  // the last event came with ErrIncomplete
		wantErr error // the error at the end (io.EOF unless set)
	}{
		{name: "empty", in: ""},
		{name: "openai stream", in: "data: {\"a\":1}\n\ndata: {\"b\":2}\n\ndata: [DONE]\n\n",
			want: []ev{{Data: `{"a":1}`}, {Data: `{"b":2}`}, {Data: "[DONE]"}}},
		{name: "daemon events", in: ": gpuhost events\n\nid: 3\nevent: switch\ndata: {\"seq\":3}\n\n: keep-alive\n\nid: 4\nevent: step\ndata: {\"seq\":4}\n\n",
			want: []ev{{"3", "switch", `{"seq":3}`}, {"4", "step", `{"seq":4}`}}},
		{name: "data lines joined by LF", in: "data: a\ndata:\ndata: b\n\n", want: []ev{{Data: "a\n\nb"}}},
		{name: "CRLF", in: "event: x\r\ndata: a\r\ndata: b\r\n\r\n", want: []ev{{Type: "x", Data: "a\nb"}}},
		{name: "CR alone", in: "event: x\rdata: a\rdata: b\r\rdata: c\r\r", want: []ev{{Type: "x", Data: "a\nb"}, {Data: "c"}}},
		{name: "mixed line ends", in: "data: a\r\ndata: b\rdata: c\n\r\n", want: []ev{{Data: "a\nb\nc"}}},
		{name: "one space removed, no more", in: "data:a\n\ndata:  b \n\n", want: []ev{{Data: "a"}, {Data: " b "}}},
		{name: "field without colon", in: "data\n\ndata\ndata\n\n", want: []ev{{}, {Data: "\n"}}},
		{name: "colon in value", in: "data: a: b\n\n", want: []ev{{Data: "a: b"}}},
		{name: "empty data is an event", in: "data:\n\n", want: []ev{{}}},
		{name: "no data, no event", in: "event: x\nid: 1\n\nevent: y\n\n", wantErr: io.EOF},
		{name: "event type does not carry over", in: "event: x\n\ndata: a\n\nevent: y\ndata: b\n\ndata: c\n\n",
			want: []ev{{Data: "a"}, {Type: "y", Data: "b"}, {Data: "c"}}},
		{name: "id carries over", in: "id: 1\ndata: a\n\ndata: b\n\nid\ndata: c\n\n",
			want: []ev{{ID: "1", Data: "a"}, {ID: "1", Data: "b"}, {Data: "c"}}},
		{name: "id with NUL ignored", in: "id: 1\ndata: a\n\nid: 2\x003\ndata: b\n\n",
			want: []ev{{ID: "1", Data: "a"}, {ID: "1", Data: "b"}}},
		{name: "comments, retry and unknown fields skipped", in: ":hi\n: there\nretry: 10\nfoo: bar\nDATA: no\ndata : no\ndata: yes\n\n",
			want: []ev{{Data: "yes"}}},
		{name: "blank lines between events", in: "\n\n\ndata: a\n\n\n\ndata: b\n\n", want: []ev{{Data: "a"}, {Data: "b"}}},
		{name: "byte order mark at the start", in: "\xEF\xBB\xBFdata: a\n\n", want: []ev{{Data: "a"}}},
		{name: "byte order mark only at the start", in: "data: a\n\n\xEF\xBB\xBFdata: b\n\n", want: []ev{{Data: "a"}}},
		{name: "cut before the blank line", in: "data: a\n\ndata: b\n", want: []ev{{Data: "a"}, {Data: "b"}}, cut: true},
		{name: "cut inside a line", in: "data: a\n\nevent: x\ndata: {\"ki", want: []ev{{Data: "a"}, {Type: "x", Data: `{"ki`}}, cut: true},
		{name: "cut after CR", in: "data: a\r", want: []ev{{Data: "a"}}, cut: true},
		{name: "cut without data", in: "data: a\n\nevent: x\n", want: []ev{{Data: "a"}}},
		{name: "cut in a comment", in: "data: a\n\n: keep-al", want: []ev{{Data: "a"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantErr := tc.wantErr
			if wantErr == nil {
				wantErr = io.EOF
				if tc.cut {
					wantErr = ErrIncomplete
				}
			}
			// Whole, one byte per read, and cut in two at every offset: the
			// same events.
			readers := map[string]func() io.Reader{
				"whole":    func() io.Reader { return strings.NewReader(tc.in) },
				"one byte": func() io.Reader { return iotest.OneByteReader(strings.NewReader(tc.in)) },
			}
			for name, mk := range readers {
				got, cut, err := readAll(NewReader(mk(), 0))
				if !errors.Is(err, wantErr) || cut != tc.cut || !reflect.DeepEqual(got, tc.want) {
					t.Fatalf("%s: events %q cut %v err %v, want %q cut %v err %v", name, got, cut, err, tc.want, tc.cut, wantErr)
				}
			}
			for i := 0; i <= len(tc.in); i++ {
				r := io.MultiReader(strings.NewReader(tc.in[:i]), strings.NewReader(tc.in[i:]))
				got, cut, err := readAll(NewReader(r, 0))
				if !errors.Is(err, wantErr) || cut != tc.cut || !reflect.DeepEqual(got, tc.want) {
					t.Fatalf("cut at %d: events %q cut %v err %v, want %q", i, got, cut, err, tc.want)
				}
			}
		})
	}
}

func TestReaderLimits(t *testing.T) {
	const max = 16
	for _, tc := range []struct {
		name string
		in   string
		want []ev
		err  error
	}{
		{"line at the limit", "data: " + strings.Repeat("x", max-6) + "\n\n", []ev{{Data: strings.Repeat("x", max-6)}}, io.EOF},
		{"line over the limit", "data: a\n\ndata: " + strings.Repeat("x", max-5) + "\n\n", []ev{{Data: "a"}}, ErrTooLong},
		{"unfinished line over the limit", "data: " + strings.Repeat("x", 2*max), nil, ErrTooLong},
		{"comment over the limit", ": " + strings.Repeat("x", max) + "\ndata: a\n\n", nil, ErrTooLong},
		{"data at the limit", "data: 1234567\ndata: 12345678\n\n", []ev{{Data: "1234567\n12345678"}}, io.EOF},
		{"data over the limit", "data: 1234567\ndata: 123456789\n\n", nil, ErrTooLong},
		{"many short data lines", strings.Repeat("data: x\n", max), nil, ErrTooLong},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, r := range []io.Reader{strings.NewReader(tc.in), iotest.OneByteReader(strings.NewReader(tc.in))} {
				rd := NewReader(r, max)
				got, _, err := readAll(rd)
				if !errors.Is(err, tc.err) || !reflect.DeepEqual(got, tc.want) {
					t.Fatalf("events %q err %v, want %q %v", got, err, tc.want, tc.err)
				}
				if _, again := rd.Next(); again != err {
					t.Fatalf("second Next: %v, want the same %v", again, err)
				}
				if cap(rd.data) > 2*max || cap(rd.p.line) > 2*max {
					t.Fatalf("kept %d bytes of data and %d of a line with a limit of %d", cap(rd.data), cap(rd.p.line), max)
				}
			}
		})
	}
	// The limit is in the error, for the log.
	_, err := NewReader(strings.NewReader(strings.Repeat("x", 100)), 10).Next()
	if err == nil || !strings.Contains(err.Error(), "10 bytes") {
		t.Fatalf("error %v does not name the limit", err)
	}
}

func TestReaderErrors(t *testing.T) {
	boom := errors.New("boom")
	r := NewReader(io.MultiReader(strings.NewReader("data: a\n\ndata: b\n"), iotest.ErrReader(boom)), 0)
	got, cut, err := readAll(r)
	if err != boom || cut || !reflect.DeepEqual(got, []ev{{Data: "a"}}) {
		t.Fatalf("events %q cut %v err %v: want the event before the error, then the error as is", got, cut, err)
	}
	if _, err := r.Next(); err != boom {
		t.Fatalf("after the error: %v", err)
	}
	// Data and the error in one Read: the data first.
	r = NewReader(iotest.DataErrReader(strings.NewReader("data: a\n\n")), 0)
	if got, _, err := readAll(r); err != io.EOF || len(got) != 1 {
		t.Fatalf("data with EOF: %q %v", got, err)
	}
	// A cut transfer (an HTTP body's io.ErrUnexpectedEOF) is passed on, not
	// taken for the stream's end.
	r = NewReader(io.MultiReader(strings.NewReader("data: a\n"), iotest.ErrReader(io.ErrUnexpectedEOF)), 0)
	if _, err := r.Next(); err != io.ErrUnexpectedEOF {
		t.Fatalf("cut transfer: %v", err)
	}
	// A reader that returns nothing forever.
	if _, err := NewReader(emptyReader{}, 0).Next(); err != io.ErrNoProgress {
		t.Fatalf("empty reads: %v", err)
	}
}

type emptyReader struct{}

func (emptyReader) Read([]byte) (int, error) { return 0, nil }

// TestReaderDataValidUntilNext: Data is the Reader's buffer, reused.
func TestReaderDataValidUntilNext(t *testing.T) {
	r := NewReader(strings.NewReader("data: first\n\ndata: second\n\n"), 0)
	a, _ := r.Next()
	saved := string(a.Data)
	b, _ := r.Next()
	if saved != "first" || string(b.Data) != "second" {
		t.Fatalf("%q %q", saved, b.Data)
	}
}

func TestParser(t *testing.T) {
	in := "data: a\r\n: c\nevent:x\r\rdata"
	type fld struct{ Name, Value string }
	want := []fld{{"data", "a"}, {"event", "x"}, {"", ""}}
	for _, chunk := range []int{1, 2, 3, len(in)} {
		p := NewParser(0)
		var got []fld
		for b := []byte(in); len(b) > 0; {
			piece := b[:min(chunk, len(b))]
			b = b[len(piece):]
			for len(piece) > 0 {
				n, f, ok, err := p.Feed(piece)
				if n == 0 || err != nil {
					t.Fatalf("chunk %d: n %d err %v", chunk, n, err)
				}
				piece = piece[n:]
				if ok {
					got = append(got, fld{string(f.Name), string(f.Value)})
				}
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("chunk %d: %q, want %q", chunk, got, want)
		}
		if f, ok := p.End(); !ok || string(f.Name) != "data" || len(f.Value) != 0 {
			t.Fatalf("chunk %d: End %q %v", chunk, f.Name, ok)
		}
		if _, ok := p.End(); ok {
			t.Fatal("End twice")
		}
	}
}

// TestParserSkipsLongLines: an over-long line is reported once and
// skipped; the next line is read; the line kept aside never grows past
// the limit.
func TestParserSkipsLongLines(t *testing.T) {
	const max = 1 << 10
	in := []byte("data: " + strings.Repeat("x", 10*max) + "\ndata: next\n")
	for _, chunk := range []int{7, 100, max, len(in)} {
		p := NewParser(max)
		var got []string
		tooLong := 0
		for b := in; len(b) > 0; {
			piece := b[:min(chunk, len(b))]
			b = b[len(piece):]
			for len(piece) > 0 {
				n, f, ok, err := p.Feed(piece)
				piece = piece[n:]
				if errors.Is(err, ErrTooLong) {
					tooLong++
				}
				if ok {
					got = append(got, string(f.Value))
				}
			}
			if cap(p.line) > 2*max {
				t.Fatalf("chunk %d: a line of %d bytes kept aside", chunk, cap(p.line))
			}
		}
		if tooLong != 1 || !reflect.DeepEqual(got, []string{"next"}) {
			t.Fatalf("chunk %d: %d ErrTooLong, fields %q", chunk, tooLong, got)
		}
	}
}

// TestParserInPlace: a line whole in the piece fed is handed out without a
// copy.
func TestParserInPlace(t *testing.T) {
	b := []byte("data: x\n")
	p := NewParser(0)
	_, f, ok, _ := p.Feed(b)
	if !ok || &f.Value[0] != &b[6] {
		t.Fatal("the field is not in place")
	}
	if n := testing.AllocsPerRun(100, func() { p.Feed(b) }); n != 0 {
		t.Fatalf("%v allocations per line", n)
	}
}

// FuzzReader: any bytes, any limit, any way of cutting them into reads:
// no panic, the same events and the same end, every event within the
// limit; and an event read, written again with AppendEvent, reads back
// equal.
func FuzzReader(f *testing.F) {
	for _, s := range []string{
		"data: {\"a\":1}\n\ndata: [DONE]\n\n",
		"id: 3\nevent: switch\ndata: {\"seq\":3}\n\n: keep-alive\n\n",
		"data: a\r\ndata: b\r\rdata:c\n\n",
		"\xEF\xBB\xBFdata\n\nid: 1\x00\ndata: x",
		"event: x\n\n\n: c\ndata:  y\n",
		"data: " + strings.Repeat("x", 40) + "\n\n",
	} {
		f.Add([]byte(s), uint16(7), uint8(0))
		f.Add([]byte(s), uint16(1), uint8(16))
	}
	f.Fuzz(func(t *testing.T, in []byte, cut uint16, max uint8) {
		limit := int(max)
		whole, wcut, werr := readAll(NewReader(bytes.NewReader(in), limit))
		c := int(cut) % (len(in) + 1)
		split, scut, serr := readAll(NewReader(io.MultiReader(bytes.NewReader(in[:c]), iotest.OneByteReader(bytes.NewReader(in[c:]))), limit))
		if !reflect.DeepEqual(whole, split) || wcut != scut || !sameEnd(werr, serr) {
			t.Fatalf("cut at %d changed the result: %q %v %v vs %q %v %v", c, whole, wcut, werr, split, scut, serr)
		}
		if !errors.Is(werr, io.EOF) && !errors.Is(werr, ErrIncomplete) && !errors.Is(werr, ErrTooLong) {
			t.Fatalf("unexpected error %v", werr)
		}
		if limit == 0 {
			limit = DefaultMax
		}
		for _, e := range whole {
			if len(e.Data) > limit || len(e.Type) > limit || len(e.ID) > limit {
				t.Fatalf("event over the limit %d: %q", limit, e)
			}
			again, _, err := readAll(NewReader(bytes.NewReader(AppendEvent(nil, Event{e.ID, e.Type, []byte(e.Data)})), 0))
			if err != io.EOF || len(again) != 1 || again[0] != e {
				t.Fatalf("%q written and read back is %q (%v)", e, again, err)
			}
		}
	})
}

func sameEnd(a, b error) bool {
	for _, target := range []error{io.EOF, ErrIncomplete, ErrTooLong} {
		if errors.Is(a, target) != errors.Is(b, target) {
			return false
		}
	}
	return true
}

// TestParserPending: the Parser says when it holds a line no line end has
// finished, the point where a cut stream would end mid-line.
func TestParserPending(t *testing.T) {
	p := NewParser(0)
	steps := []struct {
		feed string
		want bool
	}{{"data: {\"a\"", true}, {":1}", true}, {"\r", false}, {"\n", false}, {"\n", false}, {"data: x\n", false}}
	for _, s := range steps {
		b := []byte(s.feed)
		for len(b) > 0 {
			n, _, _, _ := p.Feed(b)
			b = b[n:]
		}
		if got := p.Pending(); got != s.want {
			t.Fatalf("after %q: Pending %v, want %v", s.feed, got, s.want)
		}
	}
}
