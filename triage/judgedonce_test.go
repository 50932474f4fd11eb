package triage

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"gpuhost/config"
	"gpuhost/triage/sink"
	"gpuhost/triage/sink/slacktest"
	"gpuhost/triage/source/dovecottest"
)

// TestDovecotSlackDownClassifiesOnce: a mail from a real Dovecot whose
// Slack post fails for several polls (and across a restart of the worker)
// is classified once and its cost counted once; the post that finally
// goes out carries that one cost.
func TestDovecotSlackDownClassifiesOnce(t *testing.T) {
	srv := dovecottest.Start(t, dovecottest.Options{})
	fake := slacktest.New(t)
	token := fake.Token()
	slack, err := sink.NewSlack(sink.SlackOptions{
		Token: func() (string, error) { return token, nil }, APIURL: fake.URL(),
		Channel: "C0TRIAGE", ImportantChannel: "C0IMPORTANT", Timeout: 10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	cls := &fakeClassifier{}
	dir := t.TempDir()
	newWorker := func() *Worker {
		w, err := New(Options{Source: imapSource(srv), Classifier: cls, Sinks: []sink.Sink{slack},
			StateDir: dir, Log: testLogger(t), AlertFailures: 100,
			Prices: config.TriageCostsConfig{Currency: "EUR", Models: map[string]config.ModelPrice{
				"fake": {PromptPerMillion: 1, CompletionPerMillion: 10},
			}}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.Close() })
		return w
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w := newWorker()
	srv.Append(t, []byte(eml("ann@customer.test", "sales@example.com", "stuck", "body")))

	fake.SetToken("xoxb-not-the-right-one") // every Slack call fails
	const failedPolls = 5
	for i := range failedPolls {
		if n, err := w.Once(ctx); err == nil || n != 0 {
			t.Fatalf("poll %d with Slack down = %d, %v; want an error", i+1, n, err)
		}
	}
	if got := cls.calls; got != 1 {
		t.Errorf("classified %d times over %d failed polls, want once", got, failedPolls)
	}
	if v := testutil.ToFloat64(w.metrics.cost.WithLabelValues("classification")); !near(v, 0.002) {
		t.Errorf("cost_total{classification} = %v after %d failed polls, want one mail's 0.002", v, failedPolls)
	}
	if v := testutil.ToFloat64(w.metrics.tokens.WithLabelValues("prompt")); v != 1000 {
		t.Errorf("tokens_total{prompt} = %v, want 1000", v)
	}
	c := readCheckpoint(t, w)
	if c.LastUID != 0 || c.Inflight == nil || c.Inflight.Judged == nil || c.Inflight.Judged.Result.Class != "customer" {
		t.Fatalf("checkpoint while Slack is down = %+v, want the judged mail in flight", c)
	}

	// A restart keeps the judged result too.
	w.Close()
	w = newWorker()
	if _, err := w.Once(ctx); err == nil {
		t.Fatal("poll after restart succeeded with Slack down")
	}
	fake.SetToken(token)
	if n, err := w.Once(ctx); n != 1 || err != nil {
		t.Fatalf("poll with Slack back = %d, %v; want 1", n, err)
	}
	if got := cls.calls; got != 1 {
		t.Errorf("classified %d times in all, want once", got)
	}
	if v := testutil.ToFloat64(w.metrics.cost.WithLabelValues("classification")); v != 0 {
		t.Errorf("restarted worker counted cost %v for a mail judged before the restart", v)
	}
	if v := testutil.ToFloat64(w.metrics.mails.WithLabelValues("customer")); v != 1 {
		t.Errorf("mails_total{customer} = %v, want 1", v)
	}
	msgs := fake.All()
	if len(msgs) != 1 {
		t.Fatalf("Slack has %d messages, want 1", len(msgs))
	}
	if !strings.Contains(msgs[0].Text+string(msgs[0].Blocks), "1000+100 tok") {
		t.Errorf("post does not carry the one classification's cost: %s", msgs[0].Text)
	}
	if c := readCheckpoint(t, w); c.LastUID != 1 || c.Inflight != nil {
		t.Errorf("final checkpoint = %+v", c)
	}
}

// TestDovecotSlackRetryAfterAcrossPolls: after Slack answers 429 with
// Retry-After (twice: the sink's own retry is spent), the worker's next
// polls do not call Slack until that time has passed, and a failed poll
// waits at least that long.
func TestDovecotSlackRetryAfterAcrossPolls(t *testing.T) {
	srv := dovecottest.Start(t, dovecottest.Options{})
	fake := slacktest.New(t)
	clock := newFakeClock()
	w, err := New(Options{Source: imapSource(srv), Classifier: &fakeClassifier{}, Sinks: []sink.Sink{newSlack(t, fake)},
		StateDir: t.TempDir(), Log: testLogger(t), Clock: clock, Interval: 100 * time.Millisecond, AlertFailures: 100})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv.Append(t, []byte(eml("ann@customer.test", "sales@example.com", "limited", "body")))

	const retryAfter = 2 * time.Second
	fake.RateLimitNext(2, retryAfter)
	if _, err := w.Once(ctx); err == nil {
		t.Fatal("poll succeeded while Slack rate limits")
	}
	calls := fake.PostCalls() + fake.HistoryCalls()
	if got := w.failedPollWait(); got != retryAfter {
		t.Errorf("wait after the failed poll = %v, want Slack's Retry-After %v (the interval is 100ms)", got, retryAfter)
	}
	for _, step := range []time.Duration{0, 100 * time.Millisecond, 1500 * time.Millisecond} {
		clock.Advance(step)
		if _, err := w.Once(ctx); err == nil || !strings.Contains(err.Error(), "Retry-After") {
			t.Fatalf("poll %v into the back-off = %v, want the Retry-After refusal", step, err)
		}
	}
	if got := fake.PostCalls() + fake.HistoryCalls(); got != calls {
		t.Errorf("Slack got %d calls during its Retry-After", got-calls)
	}
	clock.Advance(retryAfter - 1600*time.Millisecond) // the Retry-After is over
	if n, err := w.Once(ctx); n != 1 || err != nil {
		t.Fatalf("poll after the back-off = %d, %v; want 1", n, err)
	}
	if got := w.failedPollWait(); got != 100*time.Millisecond {
		t.Errorf("wait after the back-off ended = %v, want the interval", got)
	}
	if got := len(fake.All()); got != 1 {
		t.Errorf("Slack has %d messages, want 1", got)
	}
}
