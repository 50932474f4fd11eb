package sse

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

func TestAppendEvent(t *testing.T) {
	for _, tc := range []struct {
		name string
		e    Event
		want string
	}{
		{"openai chunk", Event{Data: []byte(`{"a":1}`)}, "data: {\"a\":1}\n\n"},
		{"openai end", Event{Data: []byte("[DONE]")}, "data: [DONE]\n\n"},
		{"daemon event", Event{ID: "12", Type: "switch", Data: []byte(`{"seq":12}`)}, "id: 12\nevent: switch\ndata: {\"seq\":12}\n\n"},
		{"multi-line data", Event{Data: []byte("a\nb\r\nc\rd")}, "data: a\ndata: b\ndata: c\ndata: d\n\n"},
		{"trailing newline kept", Event{Data: []byte("a\n")}, "data: a\ndata: \n\n"},
		{"empty data", Event{Type: "ping"}, "event: ping\ndata: \n\n"},
		{"line ends in id and type", Event{ID: "1\r\n2", Type: "stop\nevent: answer", Data: []byte("x")}, "id: 1  2\nevent: stop event: answer\ndata: x\n\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := string(AppendEvent([]byte("before|"), tc.e))
			if got != "before|"+tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
			// What goes out reads back as one event with the same data.
			e, err := NewReader(strings.NewReader(tc.want), 0).Next()
			wantData := strings.NewReplacer("\r\n", "\n", "\r", "\n").Replace(string(tc.e.Data))
			if err != nil || string(e.Data) != wantData {
				t.Fatalf("read back %q (%v), want %q", e.Data, err, wantData)
			}
		})
	}
	if got := string(AppendComment(nil, "keep-alive")); got != ": keep-alive\n\n" {
		t.Fatalf("comment %q", got)
	}
	if got := string(AppendComment(nil, "two\nlines")); got != ": two\n: lines\n\n" {
		t.Fatalf("comment %q", got)
	}
}

func TestWriter(t *testing.T) {
	rec := httptest.NewRecorder()
	w := NewWriter(rec)
	if err := w.Comment("gpuhost events"); err != nil {
		t.Fatal(err)
	}
	if !rec.Flushed {
		t.Fatal("the comment was not flushed")
	}
	if err := w.Send(Event{ID: "1", Type: "switch", Data: []byte(`{"x":1}`)}); err != nil {
		t.Fatal(err)
	}
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d", rec.Code)
	}
	for k, v := range map[string]string{"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"} {
		if got := rec.Header().Get(k); got != v {
			t.Errorf("%s: %q, want %q", k, got, v)
		}
	}
	if got, want := rec.Body.String(), ": gpuhost events\n\nid: 1\nevent: switch\ndata: {\"x\":1}\n\n"; got != want {
		t.Fatalf("body %q, want %q", got, want)
	}

	// Headers the caller set stay.
	rec = httptest.NewRecorder()
	rec.Header().Set("Content-Type", "text/event-stream")
	rec.Header().Set("Cache-Control", "no-store")
	w = NewWriter(rec)
	w.Start()
	w.Start()
	if rec.Header().Get("Content-Type") != "text/event-stream" || rec.Header().Get("Cache-Control") != "no-store" || rec.Header().Get("X-Accel-Buffering") != "no" {
		t.Fatalf("headers %v", rec.Header())
	}
}

// failWriter fails every write after the first n.
type failWriter struct {
	http.ResponseWriter
	n      int
	writes int
}

func (f *failWriter) Write(p []byte) (int, error) {
	f.writes++
	if f.writes > f.n {
		return 0, errors.New("broken pipe")
	}
	return f.ResponseWriter.Write(p)
}

func TestWriterStopsAtTheFirstError(t *testing.T) {
	fw := &failWriter{ResponseWriter: httptest.NewRecorder(), n: 1}
	w := NewWriter(fw)
	if err := w.Send(Event{Data: []byte("a")}); err != nil {
		t.Fatal(err)
	}
	err := w.Send(Event{Data: []byte("b")})
	if err == nil || w.Err() != err {
		t.Fatalf("send: %v, Err %v", err, w.Err())
	}
	if w.Comment("keep-alive") != err || w.Send(Event{Data: []byte("c")}) != err || fw.writes != 2 {
		t.Fatalf("wrote after the error: %d writes", fw.writes)
	}
}

// noFlush is a ResponseWriter that cannot flush.
type noFlush struct{ h http.Header }

func (n *noFlush) Header() http.Header       { return n.h }
func (*noFlush) Write(p []byte) (int, error) { return len(p), nil }
func (*noFlush) WriteHeader(int)             {}

func TestWriterWithoutFlusher(t *testing.T) {
	w := NewWriter(&noFlush{h: http.Header{}})
	if err := w.Send(Event{Data: []byte("a")}); err != nil || w.Err() != nil {
		t.Fatalf("a writer that cannot flush: %v", err)
	}
}

// TestWriterConcurrent: a heartbeat beside the writer never splits an
// event (run with -race).
func TestWriterConcurrent(t *testing.T) {
	rec := httptest.NewRecorder()
	w := NewWriter(rec)
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				if g == 0 {
					_ = w.Comment("keep-alive")
					continue
				}
				_ = w.Send(Event{ID: fmt.Sprint(i), Type: "t", Data: []byte(fmt.Sprintf("%d-%d\nsecond line", g, i))})
			}
		}()
	}
	wg.Wait()
	r := NewReader(strings.NewReader(rec.Body.String()), 0)
	n := 0
	for {
		e, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil || e.Type != "t" || !strings.HasSuffix(string(e.Data), "\nsecond line") {
			t.Fatalf("event %d: %q %v", n, e.Data, err)
		}
		n++
	}
	if n != 3*200 {
		t.Fatalf("%d events, want %d", n, 3*200)
	}
}

// TestWriterLetsGoOfBigBuffers: one big event does not stay in memory.
func TestWriterLetsGoOfBigBuffers(t *testing.T) {
	w := NewWriter(httptest.NewRecorder())
	_ = w.Send(Event{Data: make([]byte, 2*maxKeptBuffer)})
	if cap(w.buf) > maxKeptBuffer {
		t.Fatalf("kept %d bytes", cap(w.buf))
	}
	_ = w.Send(Event{Data: []byte("small")})
	if cap(w.buf) == 0 {
		t.Fatal("a small buffer is not kept")
	}
}
