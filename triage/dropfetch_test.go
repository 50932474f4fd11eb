package triage

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gpuhost/triage/sink"
	"gpuhost/triage/sink/slacktest"
	"gpuhost/triage/source"
	"gpuhost/triage/source/dovecottest"
)

// gateClock is the worker's clock for these tests: every After (Run's wait
// before retrying a failed poll) is handed to the test, which inspects the
// worker's state and then releases it.
type gateClock struct {
	mu     sync.Mutex
	now    time.Time
	afters chan chan time.Time
}

func newGateClock() *gateClock {
	return &gateClock{now: time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC), afters: make(chan chan time.Time, 16)}
}

func (c *gateClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *gateClock) After(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	c.afters <- ch
	return ch
}

// release lets a waiting After fire, d later.
func (c *gateClock) release(ch chan time.Time, d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	now := c.now
	c.mu.Unlock()
	ch <- now
}

// logRecord is one captured log line, attributes flattened to text.
type logRecord struct {
	Level slog.Level
	Msg   string
	Attrs map[string]string
}

// logCapture keeps the log lines of the worker and its source, so a test
// can check what an operator would read.
type logCapture struct {
	mu   sync.Mutex
	recs []logRecord
}

func newLogCapture() *logCapture { return &logCapture{} }

func (c *logCapture) Logger() *slog.Logger { return slog.New(&captureHandler{c: c}) }

// Find returns the lines with message msg.
func (c *logCapture) Find(msg string) []logRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []logRecord
	for _, r := range c.recs {
		if r.Msg == msg {
			out = append(out, r)
		}
	}
	return out
}

func (c *logCapture) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var b strings.Builder
	for _, r := range c.recs {
		fmt.Fprintf(&b, "%s %s %v\n", r.Level, r.Msg, r.Attrs)
	}
	return b.String()
}

type captureHandler struct {
	c     *logCapture
	attrs []slog.Attr
}

func (h *captureHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *captureHandler) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{Level: r.Level, Msg: r.Message, Attrs: map[string]string{}}
	for _, a := range h.attrs {
		rec.Attrs[a.Key] = a.Value.Resolve().String()
	}
	r.Attrs(func(a slog.Attr) bool {
		rec.Attrs[a.Key] = a.Value.Resolve().String()
		return true
	})
	h.c.mu.Lock()
	h.c.recs = append(h.c.recs, rec)
	h.c.mu.Unlock()
	return nil
}

func (h *captureHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &captureHandler{c: h.c, attrs: append(slices.Clone(h.attrs), as...)}
}

func (h *captureHandler) WithGroup(string) slog.Handler { return h }

const (
	msgPollFailed = "triage: poll failed; retrying after the interval"
	msgPosted     = "triage: mail posted"
)

// TestWorkerDropMidFetch: the IMAP connection drops in the middle of a
// FETCH response (a relay cuts it inside a mail's body literal) while the
// worker (Run, against a real Dovecot, the simulator as the model and the
// fake Slack) polls a batch of 5 new mails. The poll must fail with a log
// line naming the fetch error, the checkpoint must not pass any mail that
// was not posted, and the retry must post every mail exactly once, in UID
// order.
func TestWorkerDropMidFetch(t *testing.T) {
	srv := dovecottest.Start(t, dovecottest.Options{})
	relay := dovecottest.NewRelay(t, srv.Addr)
	cls, _ := realPieces(t, startSim(t, "", ""))
	const mails = 5

	tests := []struct {
		name string
		// batch is the worker's BatchSize: the source fetches the bodies
		// of one batch in one FETCH.
		batch int
		cut   dovecottest.Cut
		// cutMail is the mail (0-based) in whose body the cut lands;
		// postedBefore how many mails the failing poll finished first.
		cutMail, postedBefore int
	}{
		{"first body of the batch", 50, dovecottest.Cut{Literal: 1, After: 40}, 0, 0},
		{"third body of the batch", 50, dovecottest.Cut{Literal: 3, After: 40}, 2, 0},
		{"third body, in the poll's second batch", 2, dovecottest.Cut{Literal: 3, After: 40}, 2, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			logs := newLogCapture()
			fake := slacktest.New(t)
			clock := newGateClock()
			pw := srv.Password
			src := source.NewIMAP(source.IMAPOptions{
				Addr: relay.Addr(), Security: "plain", Username: srv.User,
				Password: func() (string, error) { return pw, nil },
				Mailbox:  srv.Mailbox, Timeout: 10 * time.Second, Log: logs.Logger(),
			})
			waiting := &waitSignal{Source: src, ch: make(chan struct{}, 1)}
			dir := t.TempDir()
			w, err := New(Options{
				Source: waiting, Classifier: cls, Sinks: []sink.Sink{newSlack(t, fake)},
				StateDir: dir, Log: logs.Logger(), Clock: clock, BatchSize: tc.batch,
				Interval: time.Hour, StartAtEnd: true,
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { w.Close() })
			defer func() {
				if t.Failed() {
					t.Logf("log:\n%s", logs.String())
				}
			}()

			// A first poll connects and puts the checkpoint after the mail
			// of earlier subtests (first_run: new).
			if n, err := w.Once(ctx); err != nil || n != 0 {
				t.Fatalf("first poll: %d, %v", n, err)
			}
			base := w.State().Checkpoint
			var uids []uint32
			for i := range mails {
				uids = append(uids, srv.Append(t, []byte(eml("ann@customer.test", "sales@example.com",
					fmt.Sprintf("order %d (%s)", i+1, tc.name), "Please confirm the order."))))
			}
			keys := make([]string, len(uids))
			for i, uid := range uids {
				keys[i] = Key(w.Name(), base.UIDValidity, uid)
			}

			relay.Arm(tc.cut)
			runCtx, stop := context.WithCancel(ctx)
			defer stop()
			ran := make(chan error, 1)
			go func() { ran <- w.Run(runCtx) }()

			// The first poll of Run fails: it logs the error and asks the
			// clock for the retry interval (a poll that succeeded would
			// wait for new mail instead).
			var retry chan time.Time
			select {
			case retry = <-clock.afters:
			case <-waiting.ch:
				t.Fatalf("the poll succeeded although the connection was cut (%d mails posted)", len(logs.Find(msgPosted)))
			case err := <-ran:
				t.Fatalf("Run returned after the cut: %v", err)
			case <-ctx.Done():
				t.Fatal("Run neither retried nor waited for new mail")
			}
			failed := logs.Find(msgPollFailed)
			if len(failed) != 1 {
				t.Fatalf("Run retries without having logged the failure (%d lines %q)", len(failed), msgPollFailed)
			}

			cuts := relay.Cuts()
			if len(cuts) == 0 || !strings.Contains(cuts[len(cuts)-1].Line, fmt.Sprintf("UID %d BODY[] {", uids[tc.cutMail])) {
				t.Fatalf("the relay cut %+v, want one in the body of UID %d", cuts, uids[tc.cutMail])
			}
			after := base.LastUID
			if tc.postedBefore > 0 {
				after = uids[tc.postedBefore-1]
			}
			f := failed[0]
			for _, want := range []string{
				fmt.Sprintf("fetch from %s after UID %d", w.Name(), after),
				relay.Addr(), "UID FETCH",
				fmt.Sprintf("(UID %d): the connection ended after 40 of the", uids[tc.cutMail]),
			} {
				if !strings.Contains(f.Attrs["err"], want) {
					t.Errorf("poll failure logged as %q (level %s); it does not say %q", f.Attrs["err"], f.Level, want)
				}
			}
			if f.Level != slog.LevelError || f.Attrs["processed"] != strconv.Itoa(tc.postedBefore) {
				t.Errorf("poll failure logged at %s with processed=%s, want ERROR and %d", f.Level, f.Attrs["processed"], tc.postedBefore)
			}

			// Nothing past the last posted mail is checkpointed, in memory
			// or on disk.
			posted := slackKeys(fake)
			if !slices.Equal(posted, keys[:tc.postedBefore]) {
				t.Fatalf("posted before the retry %v, want %v", posted, keys[:tc.postedBefore])
			}
			onDisk, err := loadCheckpoint(w.path)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range []Checkpoint{w.State().Checkpoint, onDisk} {
				if c.LastUID != after || c.Inflight != nil || c.UIDValidity != base.UIDValidity {
					t.Fatalf("checkpoint after the failed poll %+v, want last_uid %d, nothing in flight", c, after)
				}
			}

			// The retry reconnects and posts the rest; then Run waits for
			// new mail.
			clock.release(retry, time.Hour)
			select {
			case <-waiting.ch:
			case <-clock.afters:
				t.Fatalf("the retry failed too: %v", logs.Find(msgPollFailed))
			case err := <-ran:
				t.Fatalf("Run returned during the retry: %v", err)
			case <-ctx.Done():
				t.Fatal("the retry poll did not finish")
			}
			stop()
			if err := <-ran; err != nil {
				t.Fatalf("Run: %v", err)
			}
			if got := slackKeys(fake); !slices.Equal(got, keys) {
				t.Fatalf("Slack has\n  %v\nwant each mail once, in order:\n  %v", got, keys)
			}
			if c := readCheckpoint(t, w); c.LastUID != uids[mails-1] || c.Inflight != nil {
				t.Errorf("final checkpoint %+v, want last_uid %d", c, uids[mails-1])
			}
			if n := len(logs.Find(msgPollFailed)); n != 1 {
				t.Errorf("%d failed polls, want 1", n)
			}
			if n := len(logs.Find("IMAP connected")); n != 2 {
				t.Errorf("connected %d times, want 2 (the first connection and one after the cut)", n)
			}
		})
	}
}

// waitSignal is the real source with a signal on Wait: Run calls it only
// after a poll that succeeded, so the test knows the poll is over.
type waitSignal struct {
	source.Source
	ch chan struct{}
}

func (s *waitSignal) Wait(ctx context.Context, d time.Duration) error {
	select {
	case s.ch <- struct{}{}:
	default:
	}
	return s.Source.Wait(ctx, d)
}

// slackKeys are the post keys in the main channel, in posting order.
func slackKeys(f *slacktest.Fake) []string {
	var keys []string
	for _, m := range f.Messages("C0TRIAGE") {
		keys = append(keys, m.Key())
	}
	return keys
}
