package triage

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"gpuhost/internal/pairing"
	"gpuhost/internal/telegramtest"
	"gpuhost/internal/testkit"
	"gpuhost/triage/sink"
	"gpuhost/triage/sink/slacktest"
)

const (
	alertMain      = "C0TRIAGE"
	alertImportant = "C0URGENT"
	alertChat      = int64(4711)
)

func newTestSlack(t *testing.T, f *slacktest.Fake) *sink.Slack {
	t.Helper()
	s, err := sink.NewSlack(sink.SlackOptions{
		Token:   func() (string, error) { return slacktest.DefaultToken, nil },
		APIURL:  f.URL(),
		Channel: alertMain, ImportantChannel: alertImportant,
		Timeout: 30 * time.Second, Log: testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// slackAlerts are the texts of a channel's messages without post metadata.
func slackAlerts(f *slacktest.Fake, channel string) []string {
	var out []string
	for _, m := range f.Messages(channel) {
		if m.Metadata == nil {
			out = append(out, m.Text)
		}
	}
	return out
}

// TestAlertsReachRealSinks drives the worker's alerting on the fake clock
// (three failed polls, a reminder six hours on, the all-clear, then a
// UIDVALIDITY re-baseline) into the real Slack, Telegram and console sinks
// and checks that each carries exactly the worker's texts, in order.
func TestAlertsReachRealSinks(t *testing.T) {
	sf := slacktest.New(t)
	tf := telegramtest.New(t)
	tgDir := t.TempDir()
	st := pairing.New(tgDir)
	req, err := st.Request(pairing.Sender{UserID: alertChat, ChatID: alertChat, Username: "ops"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Approve(req.Code); err != nil {
		t.Fatal(err)
	}
	tg, err := sink.NewTelegram(sink.TelegramOptions{
		Token:  func() (string, error) { return telegramtest.DefaultToken, nil },
		APIURL: tf.URL(), StateDir: tgDir, ImportantOnly: true,
		Timeout: 30 * time.Second, Log: testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	var console testkit.SyncBuffer
	rec := &recSink{name: "rec"}
	e := newUnit(t, func(o *Options) {
		o.Sinks = []sink.Sink{newTestSlack(t, sf), tg, sink.NewConsole(&console), rec}
		o.AlertFailures = 3
		o.RemindEvery = 6 * time.Hour
		o.Rebaseline = true
	})
	ctx := context.Background()

	e.src.add(eml("Ann <ann@customer.test>", "sales@example.com", "before the outage", "hello"))
	if _, err := e.w.Once(ctx); err != nil {
		t.Fatal(err)
	}
	// '<' and '&' in the cause: escaped for Slack, as they are for Telegram.
	down := errors.New("dial tcp 127.0.0.1:993: connect: connection refused <nil> & more")
	steps := []struct {
		advance time.Duration
		fail    bool
		want    string // substring of a new alert, "" = none
	}{
		{time.Minute, true, ""},
		{time.Minute, true, ""},
		{time.Minute, true, "3 polls in a row failed"},
		{time.Hour, true, ""},
		{5 * time.Hour, true, "reminder"},
		{time.Minute, false, "all clear"},
	}
	var wantSub []string
	for i, s := range steps {
		e.clock.Advance(s.advance)
		e.src.mu.Lock()
		e.src.fetchErr = nil
		if s.fail {
			e.src.fetchErr = down
		}
		e.src.mu.Unlock()
		_, _ = e.w.Once(ctx)
		if s.want != "" {
			wantSub = append(wantSub, s.want)
		}
		if got := len(rec.Alerts()); got != len(wantSub) {
			t.Fatalf("step %d: %d alerts, want %d: %q", i, got, len(wantSub), rec.Alerts())
		}
	}
	// The mailbox is recreated: a re-baseline notice.
	e.src.mu.Lock()
	e.src.uidValidity++
	e.src.mu.Unlock()
	if _, err := e.w.Once(ctx); err != nil {
		t.Fatal(err)
	}
	wantSub = append(wantSub, "re-baselined at UID 1")

	texts := rec.Alerts()
	if len(texts) != len(wantSub) {
		t.Fatalf("alerts = %q, want %d", texts, len(wantSub))
	}
	for i, w := range wantSub {
		if !strings.Contains(texts[i], w) {
			t.Errorf("alert %d = %q, want %q in it", i, texts[i], w)
		}
	}
	if !strings.Contains(texts[0], "connection refused <nil> & more") {
		t.Errorf("first alert lacks the cause: %q", texts[0])
	}

	wantSlack := make([]string, len(texts))
	for i, x := range texts {
		wantSlack[i] = sink.EscapeMrkdwn(x)
	}
	for _, ch := range []string{alertMain, alertImportant} {
		if got := slackAlerts(sf, ch); strings.Join(got, "\n") != strings.Join(wantSlack, "\n") {
			t.Errorf("Slack channel %s alerts =\n%q\nwant\n%q", ch, got, wantSlack)
		}
	}
	if n := sf.CountKeyIn(alertMain, Key(e.w.Name(), 7, 1)); n != 1 {
		t.Errorf("the mail before the outage is in Slack %d times, want 1", n)
	}
	if got := tf.SentTo(alertChat); strings.Join(got, "\n") != strings.Join(texts, "\n") {
		t.Errorf("Telegram (important only, so alerts only) got\n%q\nwant\n%q", got, texts)
	}
	var consoleAlerts []string
	for _, l := range strings.Split(console.String(), "\n") {
		if a, ok := strings.CutPrefix(l, "ALERT: "); ok {
			consoleAlerts = append(consoleAlerts, a)
		}
	}
	if strings.Join(consoleAlerts, "\n") != strings.Join(texts, "\n") {
		t.Errorf("console alerts =\n%q\nwant\n%q", consoleAlerts, texts)
	}
	if !strings.Contains(console.String(), "before the outage") {
		t.Errorf("console lacks the post:\n%s", console.String())
	}
}

// TestSlackAlertRetriedOnNextFailure: when Slack, the only alerting sink,
// refuses the alert, it is not counted as raised and goes out on the next
// failed poll, once.
func TestSlackAlertRetriedOnNextFailure(t *testing.T) {
	sf := slacktest.New(t)
	e := newUnit(t, func(o *Options) {
		o.Sinks = []sink.Sink{newTestSlack(t, sf)}
		o.AlertFailures = 2
	})
	ctx := context.Background()
	e.src.fetchErr = errors.New("connection reset by peer")
	_, _ = e.w.Once(ctx)
	sf.FailNext(2, "internal_error") // both channels refuse the alert
	e.clock.Advance(time.Minute)
	_, _ = e.w.Once(ctx)
	if e.w.State().Alerting || len(slackAlerts(sf, alertMain)) != 0 {
		t.Fatalf("alert counted as raised though Slack refused it; main channel %q", slackAlerts(sf, alertMain))
	}
	for range 2 {
		e.clock.Advance(time.Minute)
		_, _ = e.w.Once(ctx)
	}
	for _, ch := range []string{alertMain, alertImportant} {
		got := slackAlerts(sf, ch)
		if len(got) != 1 || !strings.Contains(got[0], "3 polls in a row failed") {
			t.Errorf("channel %s alerts = %q, want the alert once", ch, got)
		}
	}
	if !e.w.State().Alerting {
		t.Error("worker does not report alerting after Slack took the alert")
	}
}

// TestAllClearOnlyToChannelsThatGotTheAlert: the alert reaches Slack's
// main channel while the important one refuses it; the all-clear then goes
// to the main channel only, even though both take messages again by then.
func TestAllClearOnlyToChannelsThatGotTheAlert(t *testing.T) {
	sf := slacktest.New(t)
	e := newUnit(t, func(o *Options) {
		o.Sinks = []sink.Sink{newTestSlack(t, sf)}
		o.AlertFailures = 2
	})
	ctx := context.Background()
	sf.SetChannels(alertMain) // the important channel is gone for now
	e.src.fetchErr = errors.New("connection reset by peer")
	for range 2 {
		e.clock.Advance(time.Minute)
		_, _ = e.w.Once(ctx)
	}
	if !e.w.State().Alerting {
		t.Fatal("the alert that reached the main channel is not counted as raised")
	}
	sf.SetChannels(alertMain, alertImportant)
	e.src.fetchErr = nil
	e.clock.Advance(time.Minute)
	if _, err := e.w.Once(ctx); err != nil {
		t.Fatal(err)
	}
	main, important := slackAlerts(sf, alertMain), slackAlerts(sf, alertImportant)
	if len(main) != 2 || !strings.Contains(main[0], "polls in a row failed") || !strings.Contains(main[1], "all clear") {
		t.Errorf("main channel got %q, want the alert then the all-clear", main)
	}
	if len(important) != 0 {
		t.Errorf("the important channel, which never got the alert, got %q", important)
	}
}
