package triage

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"gpuhost/triage/customer"
	"gpuhost/triage/llm"
	"gpuhost/triage/sink"
	"gpuhost/triage/sink/slacktest"
	"gpuhost/triage/source/dovecottest"
)

// TestEveryFromAddressShown: a From header with several addresses shows
// all of them in the post, with a problem line that says so; one address
// shows no such line.
func TestEveryFromAddressShown(t *testing.T) {
	for _, tt := range []struct {
		name, from  string
		wantFrom    string
		wantProblem bool
	}{
		{"one address", "boss@example.com", "boss@example.com", false},
		{"two addresses", "boss@example.com, att@evil.test", "boss@example.com, att@evil.test", true},
		{"three with names", `Boss <boss@example.com>, "Eve" <att@evil.test>, x@y.test`, "Boss <boss@example.com>, Eve <att@evil.test>, x@y.test", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newUnit(t, nil)
			e.src.add(eml(tt.from, "sales@example.com", "hello", "body"))
			if n, err := e.w.Once(context.Background()); n != 1 || err != nil {
				t.Fatalf("Once = %d, %v", n, err)
			}
			p := e.a.Posts()[0]
			if p.From != tt.wantFrom {
				t.Errorf("post From = %q, want %q", p.From, tt.wantFrom)
			}
			found := false
			for _, pr := range p.Problems {
				if strings.Contains(pr, "From lists") && strings.Contains(pr, "att@evil.test") {
					found = true
				}
			}
			if found != tt.wantProblem {
				t.Errorf("problems %q: multi-address line present %v, want %v", p.Problems, found, tt.wantProblem)
			}
		})
	}
}

// countingTranscriber counts its calls around fakeTranscriber.
type countingTranscriber struct{ n *atomic.Int64 }

func (c countingTranscriber) Transcribe(ctx context.Context, filename string, data []byte) (llm.Transcript, llm.Usage, error) {
	c.n.Add(1)
	return fakeTranscriber{}.Transcribe(ctx, filename, data)
}

// dyingCRM stands for the process dying during the CRM lookup, after the
// model and transcription calls returned: it ends the worker's context.
type dyingCRM struct{ kill context.CancelFunc }

func (d dyingCRM) Find(ctx context.Context, email string) (*customer.Customer, error) {
	d.kill()
	return nil, ctx.Err()
}

// audioMail is a mail with n small voice memos.
func audioMail(subject string, n int) string {
	var b strings.Builder
	b.WriteString("From: ann@customer.test\r\nTo: sales@example.com\r\nSubject: " + subject + "\r\nMIME-Version: 1.0\r\n" +
		"Content-Type: multipart/mixed; boundary=\"b\"\r\n\r\n--b\r\nContent-Type: text/plain\r\n\r\nSee the memos.\r\n")
	for i := range n {
		fmt.Fprintf(&b, "--b\r\nContent-Type: audio/mpeg\r\nContent-Disposition: attachment; filename=\"memo%03d.mp3\"\r\nContent-Transfer-Encoding: base64\r\n\r\n%s\r\n",
			i, base64.StdEncoding.EncodeToString([]byte(fmt.Sprintf("ID3 memo %d", i))))
	}
	b.WriteString("--b--\r\n")
	return b.String()
}

func tallyOf(c Checkpoint) DayCost {
	var t DayCost
	for _, d := range c.Costs {
		t.Mails += d.Mails
		t.Calls += d.Calls
		t.Repeats += d.Repeats
		t.Total += d.Total
	}
	return t
}

// TestCallsReusedAfterCrashInTheWindow: a crash after the model and
// transcription calls returned and before the judged result was written
// (here: in the CRM lookup) does not pay for the calls again — the
// restarted worker reuses their recorded results and the tally counts
// each call once.
func TestCallsReusedAfterCrashInTheWindow(t *testing.T) {
	var transcriptions atomic.Int64
	ctx, kill := context.WithCancel(context.Background())
	e := newUnit(t, func(o *Options) {
		o.Transcriber = countingTranscriber{&transcriptions}
		o.Customers = dyingCRM{kill}
	})
	e.src.add(audioMail("two memos", 2))
	if _, err := e.w.Once(ctx); err == nil {
		t.Fatal("Once survived the simulated crash")
	}
	c := readCheckpoint(t, e.w)
	if c.Inflight == nil || c.Inflight.Judged != nil || len(c.Inflight.Calls) != 3 {
		t.Fatalf("after the crash the marker is %+v, want 3 recorded calls and no judged result", c.Inflight)
	}
	for _, rec := range c.Inflight.Calls {
		if !rec.Done || len(rec.Usages) != 1 || rec.Cost <= 0 {
			t.Errorf("call record %+v: want done, with its usage and cost", rec)
		}
	}
	e.reopen(t, func(o *Options) { o.Customers = nil })
	if n, err := e.w.Once(context.Background()); n != 1 || err != nil {
		t.Fatalf("after the restart: %d, %v", n, err)
	}
	if got := e.cls.calls; got != 1 {
		t.Errorf("the model was asked %d times for one mail, want 1", got)
	}
	if got := transcriptions.Load(); got != 2 {
		t.Errorf("%d transcriptions for two memos, want 2", got)
	}
	tally := tallyOf(readCheckpoint(t, e.w))
	if tally.Mails != 1 || tally.Calls != 3 || tally.Repeats != 0 {
		t.Errorf("tally %+v, want 1 mail, 3 calls, no repeat", tally)
	}
	r := e.w.Recent()[0]
	if r.Cost.Calls != 3 || r.Cost.Total != tally.Total || len(r.Transcribed) != 2 {
		t.Errorf("result cost %+v transcribed %v; tally total %v", r.Cost, r.Transcribed, tally.Total)
	}
}

// TestInterruptedCallCountedAsRepeat: a checkpoint left by a kill while
// the classification call ran (its record started, not done) makes the
// restarted worker ask again and count the lost call as a repeat.
func TestInterruptedCallCountedAsRepeat(t *testing.T) {
	e := newUnit(t, nil)
	e.src.add(eml("ann@customer.test", "sales@example.com", "hello", "body"))
	key := Key(e.src.Name(), 7, 1)
	// What the worker writes before the request leaves (callLog.start).
	if err := saveCheckpoint(e.w.path, Checkpoint{Mailbox: e.src.Name(), UIDValidity: 7,
		Inflight: &Inflight{UID: 1, Key: key, Calls: []CallRecord{{Kind: callClassification}}}}); err != nil {
		t.Fatal(err)
	}
	e.reopen(t, nil)
	if n, err := e.w.Once(context.Background()); n != 1 || err != nil {
		t.Fatalf("Once = %d, %v", n, err)
	}
	tally := tallyOf(readCheckpoint(t, e.w))
	if e.cls.calls != 1 || tally.Mails != 1 || tally.Calls != 1 || tally.Repeats != 1 {
		t.Errorf("model asked %d times; tally %+v; want 1 call and 1 repeat for 1 mail", e.cls.calls, tally)
	}
	if r := e.w.Recent()[0]; r.Cost.Repeats != 1 {
		t.Errorf("result cost %+v, want the repeat named", r.Cost)
	}
}

// TestTranscriptionBoundedPerMail: a mail with many voice memos makes at
// most MaxTranscriptions calls and stops at MaxAudioSeconds; the post
// names what was left out.
func TestTranscriptionBoundedPerMail(t *testing.T) {
	for _, tt := range []struct {
		name      string
		memos     int
		maxCalls  int
		maxSecs   float64
		wantCalls int64
		wantNote  string
	}{
		{"under both caps", 3, 0, 0, 3, ""},
		{"count cap (default 10)", 400, 0, 0, 10, "390 audio attachment(s) not transcribed, over the per-mail limit of 10 transcriptions or 900 s of audio (10 made, 300 s): memo010.mp3, memo011.mp3"},
		{"seconds cap", 5, 10, 60, 2, "3 audio attachment(s) not transcribed, over the per-mail limit of 10 transcriptions or 60 s of audio (2 made, 60 s): memo002.mp3, memo003.mp3, memo004.mp3"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var n atomic.Int64
			e := newUnit(t, func(o *Options) {
				o.Transcriber = countingTranscriber{&n}
				o.MaxTranscriptions, o.MaxAudioSeconds = tt.maxCalls, tt.maxSecs
			})
			e.src.add(audioMail("memos", tt.memos))
			if got, err := e.w.Once(context.Background()); got != 1 || err != nil {
				t.Fatalf("Once = %d, %v", got, err)
			}
			if got := n.Load(); got != tt.wantCalls {
				t.Errorf("%d transcription calls, want %d", got, tt.wantCalls)
			}
			p := e.a.Posts()[0]
			if tt.wantNote == "" && p.TranscriptNote != "" || !strings.Contains(p.TranscriptNote, tt.wantNote) {
				t.Errorf("transcript note %q, want it to contain %q", p.TranscriptNote, tt.wantNote)
			}
			if tt.memos == 400 && !strings.Contains(p.TranscriptNote, "and 380 more") {
				t.Errorf("note %q does not say how many more were left out", p.TranscriptNote)
			}
			// What people read: the rendered post, in both sinks' forms,
			// shows the transcript and what was left out.
			slackText, _ := json.Marshal(sink.SlackBlocks(p))
			for form, text := range map[string]string{"text": sink.Text(p), "slack": string(slackText)} {
				if !strings.Contains(text, "call me back") {
					t.Errorf("%s post shows no transcript:\n%s", form, text)
				}
				if head, _, _ := strings.Cut(tt.wantNote, ","); tt.wantNote != "" && !strings.Contains(text, head) {
					t.Errorf("%s post hides what was not transcribed (%q):\n%s", form, head, text)
				}
			}
		})
	}
}

// TestAllClearAfterRestartDuringOutage: real Dovecot goes down, the alert
// reaches Slack (through its real sink) and a second channel, the worker
// is restarted (a new Worker from the checkpoint, as after a process
// restart) while Dovecot is still down, then Dovecot comes back: every
// channel that got the alert gets one all-clear, none gets the alert
// twice, and a channel that refused the alert gets no all-clear. A
// channel that refuses the all-clear gets it on a later poll.
func TestAllClearAfterRestartDuringOutage(t *testing.T) {
	srv := dovecottest.Start(t, dovecottest.Options{})
	sf := slacktest.New(t)
	slack := newTestSlack(t, sf)
	rec := &recSink{name: "rec"}
	refused := &recSink{name: "refused", failAlert: errors.New("channel archived")}
	dir := t.TempDir()
	newWorker := func() *Worker {
		w, err := New(Options{Source: imapSource(srv), Classifier: &fakeClassifier{}, Sinks: []sink.Sink{slack, rec, refused},
			StateDir: dir, Log: testLogger(t), AlertFailures: 2, RemindEvery: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.Close() })
		return w
	}
	ctx := context.Background()
	w := newWorker()
	srv.Append(t, []byte(eml("ann@customer.test", "sales@example.com", "before", "x")))
	if n, err := w.Once(ctx); n != 1 || err != nil {
		t.Fatalf("first poll: %d, %v", n, err)
	}
	srv.Kill()
	for range 2 {
		if _, err := w.Once(ctx); err == nil {
			t.Fatal("a poll succeeded with Dovecot down")
		}
	}
	if a := rec.Alerts(); len(a) != 1 || !strings.Contains(a[0], "not being processed") {
		t.Fatalf("alerts before the restart: %q", a)
	}
	w.Close()
	w = newWorker() // restarted during the outage
	if st := w.State(); !st.Alerting || st.ConsecutiveFailures != 2 {
		t.Errorf("after the restart: alerting %v, %d failures; want the streak remembered", st.Alerting, st.ConsecutiveFailures)
	}
	if _, err := w.Once(ctx); err == nil {
		t.Fatal("a poll succeeded with Dovecot down")
	}
	srv.Restart(t)
	rec.mu.Lock()
	rec.failAlert = errors.New("rate limited") // the all-clear is refused once
	rec.mu.Unlock()
	if _, err := w.Once(ctx); err != nil {
		t.Fatalf("poll after Dovecot came back: %v", err)
	}
	if c := readCheckpoint(t, w); c.Alert == nil || !slices.Equal(c.Alert.ClearPending, []string{"rec"}) {
		t.Fatalf("checkpoint alert %+v, want the all-clear owed to rec", c.Alert)
	}
	rec.mu.Lock()
	rec.failAlert = nil
	rec.mu.Unlock()
	if _, err := w.Once(ctx); err != nil {
		t.Fatal(err)
	}
	slackText := slackAlerts(sf, alertMain)
	for name, got := range map[string][]string{"slack": slackText, "rec": rec.Alerts()} {
		if len(got) != 2 || !strings.Contains(got[0], "not being processed") || !strings.Contains(got[1], "all clear") {
			t.Errorf("%s got %q, want the alert then the all-clear", name, got)
		}
	}
	if c := readCheckpoint(t, w); c.Alert != nil {
		t.Errorf("checkpoint alert %+v after the all-clear was delivered, want none", c.Alert)
	}
}
