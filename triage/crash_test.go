package triage

import (
	"context"
	"errors"
	"testing"

	"gpuhost/triage/sink"
	"gpuhost/triage/sink/slacktest"
)

var errSimulatedCrash = errors.New("simulated crash")

// dyingSink stands for a process that dies around the Slack post: with
// afterAccept the post reaches Slack and the worker never learns it (the
// window the history check closes); without, it dies before sending.
type dyingSink struct {
	inner       sink.Sink
	afterAccept bool
}

func (d dyingSink) Name() string { return d.inner.Name() }

func (d dyingSink) Post(ctx context.Context, p sink.Post) error {
	if d.afterAccept {
		if err := d.inner.Post(ctx, p); err != nil {
			return err
		}
	}
	return errSimulatedCrash
}

func TestCrashResumeChecksSlack(t *testing.T) {
	for _, tt := range []struct {
		name        string
		afterAccept bool
		wantSkipped bool
	}{
		{"died after Slack accepted the post", true, true},
		{"died before the post left", false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fake := slacktest.New(t)
			slack := newSlack(t, fake)
			e := newUnit(t, func(o *Options) { o.Sinks = []sink.Sink{dyingSink{slack, tt.afterAccept}} })
			for _, s := range []string{"one", "two", "three"} {
				e.src.add(eml("ann@customer.test", "sales@example.com", s, "x"))
			}
			if _, err := e.w.Once(context.Background()); !errors.Is(err, errSimulatedCrash) {
				t.Fatalf("first run: %v, want the simulated crash", err)
			}
			c := readCheckpoint(t, e.w)
			key := Key(e.src.Name(), 7, 1)
			if c.LastUID != 0 || c.Inflight == nil || c.Inflight.Key != key || len(c.Inflight.Posted) != 0 {
				t.Fatalf("checkpoint after the crash = %+v, want UID 1 in flight, nothing recorded", c)
			}
			// The restarted worker (a new Worker reading the file, as after
			// a process restart) with the real Slack sink.
			e.reopen(t, func(o *Options) { o.Sinks = []sink.Sink{slack} })
			if n, err := e.w.Once(context.Background()); n != 3 || err != nil {
				t.Fatalf("after restart: %d, %v", n, err)
			}
			for uid := uint32(1); uid <= 3; uid++ {
				if got := fake.CountKey(Key(e.src.Name(), 7, uid)); got != 1 {
					t.Errorf("UID %d reached Slack %d times, want exactly once", uid, got)
				}
			}
			if fake.HistoryCalls() == 0 {
				t.Error("the in-flight mail was not checked against the Slack history")
			}
			r := e.w.Recent()[0]
			if skipped := len(r.AlreadyPosted) == 1; skipped != tt.wantSkipped {
				t.Errorf("already posted = %v, want skipped %v", r.AlreadyPosted, tt.wantSkipped)
			}
			if c := readCheckpoint(t, e.w); c.LastUID != 3 || c.Inflight != nil {
				t.Errorf("final checkpoint = %+v", c)
			}
		})
	}
}

// TestCrashResumeSlackUnreachable: the check itself fails → retry, never a
// blind re-post.
func TestCrashResumeSlackUnreachable(t *testing.T) {
	fake := slacktest.New(t)
	slack := newSlack(t, fake)
	e := newUnit(t, func(o *Options) { o.Sinks = []sink.Sink{dyingSink{slack, true}} })
	e.src.add(eml("ann@customer.test", "sales@example.com", "one", "x"))
	_, _ = e.w.Once(context.Background())
	e.reopen(t, func(o *Options) { o.Sinks = []sink.Sink{slack} })
	fake.FailNext(1, "internal_error") // the history call
	if _, err := e.w.Once(context.Background()); err == nil {
		t.Fatal("want an error while Slack cannot be asked")
	}
	if got := fake.CountKey(Key(e.src.Name(), 7, 1)); got != 1 {
		t.Fatalf("posted %d times while the check failed", got)
	}
	if n, err := e.w.Once(context.Background()); n != 1 || err != nil {
		t.Fatalf("after Slack is back: %d, %v", n, err)
	}
	if got := fake.CountKey(Key(e.src.Name(), 7, 1)); got != 1 {
		t.Errorf("posted %d times, want once", got)
	}
}
