package proxy

import (
	"context"
	"errors"
	"mime"
	"testing"
	"time"
)

// mediaType's shortcut for the usual Content-Type values must read them
// as mime.ParseMediaType does, and leave every other value to it.
func TestMediaTypeAgreesWithMime(t *testing.T) {
	for _, ct := range []string{
		"application/json", "application/json; charset=utf-8", "text/event-stream", "text/event-stream; charset=utf-8",
		"Application/JSON", "text/event-stream;charset=UTF-8", "application/vnd.api+json", "text/plain",
		"", "application/json; charset", "multipart/form-data; boundary=x", "application/json;", " text/event-stream",
	} {
		want, _, err := mime.ParseMediaType(ct)
		got, ok := mediaType(ct)
		if ok != (err == nil) || (ok && got != want) {
			t.Errorf("mediaType(%q) = %q, %v; mime.ParseMediaType says %q, %v", ct, got, ok, want, err)
		}
	}
}

// A request that never waits never makes the hold's context (and timer);
// one that does gets the deadline start set, moved back by extend.
func TestHoldContextOnlyWhenWaiting(t *testing.T) {
	var h hold
	h.start(context.Background(), time.Hour)
	if h.ctx != nil {
		t.Fatal("start made the hold's context; it should wait for a request that waits")
	}
	h.stop() // a hold never used stops cleanly
	first := h.context()
	d1, ok := first.Deadline()
	if !ok || time.Until(d1) < 59*time.Minute {
		t.Fatalf("hold context deadline %v (set %v), want about an hour from now", d1, ok)
	}
	if h.context() != first {
		t.Fatal("a second call made another context")
	}
	h.extend(time.Minute)
	if !errors.Is(first.Err(), context.Canceled) {
		t.Fatalf("the context handed out before extend: err %v, want canceled", first.Err())
	}
	d2, _ := h.context().Deadline()
	if got := d2.Sub(d1); got != time.Minute {
		t.Fatalf("extend moved the deadline by %v, want 1m", got)
	}
	h.stop()
	if h.context().Err() == nil {
		t.Fatal("stop left the hold's context running")
	}
}
