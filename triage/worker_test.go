package triage

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"gpuhost/config"
	"gpuhost/internal/testkit"
	"gpuhost/triage/customer"
	"gpuhost/triage/llm"
	"gpuhost/triage/mail"
	"gpuhost/triage/sink"
)

type unitEnv struct {
	w     *Worker
	src   *memSource
	cls   *fakeClassifier
	a, b  *recSink
	clock *testkit.Clock
	dir   string
}

func newUnit(t *testing.T, mod func(*Options)) *unitEnv {
	t.Helper()
	e := &unitEnv{
		src:   &memSource{uidValidity: 7},
		cls:   &fakeClassifier{},
		a:     &recSink{name: "a"},
		b:     &recSink{name: "b"},
		clock: newFakeClock(),
		dir:   t.TempDir(),
	}
	o := Options{
		Source: e.src, Classifier: e.cls, Transcriber: fakeTranscriber{},
		Sinks:    []sink.Sink{e.a, e.b},
		Rules:    Rules{PriorityMailboxes: []string{"ceo@example.com"}, InternalDomains: []string{"example.com"}, AuthservID: "mx.example.com"},
		StateDir: e.dir, Clock: e.clock, Log: testLogger(t),
		Prices: config.TriageCostsConfig{Currency: "EUR", Models: map[string]config.ModelPrice{
			"fake": {PromptPerMillion: 1, CompletionPerMillion: 10},
		}, TranscriptionPerMinute: 0.006},
	}
	if mod != nil {
		mod(&o)
	}
	w, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	e.w = w
	return e
}

func (e *unitEnv) reopen(t *testing.T, mod func(*Options)) {
	t.Helper()
	o := e.w.o
	if mod != nil {
		mod(&o)
	}
	w, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	e.w = w
}

func readCheckpoint(t *testing.T, w *Worker) Checkpoint {
	t.Helper()
	c, err := loadCheckpoint(w.path)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestOnceProcessesInOrderAndCheckpoints(t *testing.T) {
	e := newUnit(t, nil)
	for _, s := range []string{"first", "second", "third"} {
		e.src.add(eml("Ann <ann@customer.test>", "sales@example.com", s, "hello"))
	}
	n, err := e.w.Once(context.Background())
	if err != nil || n != 3 {
		t.Fatalf("Once = %d, %v; want 3, nil", n, err)
	}
	for _, s := range []*recSink{e.a, e.b} {
		ps := s.Posts()
		if len(ps) != 3 {
			t.Fatalf("sink %s got %d posts, want 3", s.name, len(ps))
		}
		for i, want := range []string{"first", "second", "third"} {
			if ps[i].Subject != want || ps[i].Key != Key("mem://test/INBOX", 7, uint32(i+1)) {
				t.Errorf("post %d = %q key %q", i, ps[i].Subject, ps[i].Key)
			}
		}
	}
	c := readCheckpoint(t, e.w)
	if c.LastUID != 3 || c.UIDValidity != 7 || c.Inflight != nil {
		t.Errorf("checkpoint = %+v, want last_uid 3, uidvalidity 7, no inflight", c)
	}
	ents, _ := os.ReadDir(filepath.Dir(e.w.path))
	if len(ents) != 1 {
		t.Errorf("state dir holds %d entries, want the checkpoint only", len(ents))
	}
	// A second poll finds nothing new and posts nothing again.
	if n, err := e.w.Once(context.Background()); n != 0 || err != nil {
		t.Fatalf("second Once = %d, %v", n, err)
	}
	if len(e.a.Posts()) != 3 {
		t.Error("second poll re-posted")
	}
	// A restarted worker starts after the checkpoint.
	e.reopen(t, nil)
	e.src.add(eml("ann@customer.test", "sales@example.com", "fourth", "x"))
	if n, err := e.w.Once(context.Background()); n != 1 || err != nil {
		t.Fatalf("after restart Once = %d, %v; want 1", n, err)
	}
}

func TestTransportErrorsDoNotAdvance(t *testing.T) {
	tests := []struct {
		name   string
		break_ func(e *unitEnv)
		fix    func(e *unitEnv)
	}{
		{"model endpoint down",
			func(e *unitEnv) { e.cls.down = errors.New("dial tcp 127.0.0.1:1: connection refused") },
			func(e *unitEnv) { e.cls.down = nil }},
		{"second sink down",
			func(e *unitEnv) { e.b.failPost = errors.New("slack: 503") },
			func(e *unitEnv) { e.b.failPost = nil }},
		{"fetch fails",
			func(e *unitEnv) { e.src.fetchErr = errors.New("imap: connection reset mid-fetch") },
			func(e *unitEnv) { e.src.fetchErr = nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newUnit(t, nil)
			e.src.add(eml("ann@customer.test", "sales@example.com", "one", "x"))
			e.src.add(eml("ann@customer.test", "sales@example.com", "two", "x"))
			tt.break_(e)
			if _, err := e.w.Once(context.Background()); err == nil {
				t.Fatal("Once succeeded with a broken dependency")
			}
			if c := readCheckpoint(t, e.w); c.LastUID != 0 {
				t.Fatalf("checkpoint moved to %d on a transport error", c.LastUID)
			}
			if got := e.w.State().ConsecutiveFailures; got != 1 {
				t.Errorf("consecutive failures = %d, want 1", got)
			}
			tt.fix(e)
			// The retry happens in a fresh process as well as in the same one.
			e.reopen(t, nil)
			if n, err := e.w.Once(context.Background()); n != 2 || err != nil {
				t.Fatalf("retry Once = %d, %v; want 2, nil", n, err)
			}
			for _, s := range []*recSink{e.a, e.b} {
				if got := len(s.Posts()); got != 2 {
					t.Errorf("sink %s has %d posts, want exactly 2 (no duplicate of the first)", s.name, got)
				}
			}
			if c := readCheckpoint(t, e.w); c.LastUID != 2 || c.Inflight != nil {
				t.Errorf("checkpoint = %+v", c)
			}
		})
	}
}

func TestFailedSecondSinkRecordsFirst(t *testing.T) {
	e := newUnit(t, nil)
	e.src.add(eml("ann@customer.test", "sales@example.com", "one", "x"))
	e.b.failPost = errors.New("telegram: 502")
	if _, err := e.w.Once(context.Background()); err == nil {
		t.Fatal("want an error")
	}
	c := readCheckpoint(t, e.w)
	if c.Inflight == nil || c.Inflight.UID != 1 || strings.Join(c.Inflight.Posted, ",") != "a" {
		t.Fatalf("inflight = %+v, want uid 1 posted to a", c.Inflight)
	}
}

func TestUnclassifiedIsPostedNotDropped(t *testing.T) {
	e := newUnit(t, nil)
	e.src.add(eml("bob@customer.test", "sales@example.com", "[invalid] hello", "x"))
	if n, err := e.w.Once(context.Background()); n != 1 || err != nil {
		t.Fatalf("Once = %d, %v", n, err)
	}
	p := e.a.Posts()[0]
	if p.Class != ClassUnclassified || !strings.Contains(p.Unclassified, "importance 11") {
		t.Errorf("post class %q reason %q", p.Class, p.Unclassified)
	}
	if p.Importance != 7 || !p.Important || p.Rule != RuleUnclassified {
		t.Errorf("unclassified post: importance %d important %v rule %q; want the threshold", p.Importance, p.Important, p.Rule)
	}
	if txt := sink.Text(p); !strings.Contains(txt, "importance 11") {
		t.Errorf("formatted post hides the reason:\n%s", txt)
	}
}

// arPass is the receiving server's verdict for a genuine internal mail.
const arPass = "Authentication-Results: mx.example.com; dkim=pass header.d=example.com header.s=s1; spf=pass smtp.mailfrom=colleague@example.com; dmarc=pass (p=reject) header.from=example.com"

func TestRules(t *testing.T) {
	r := Rules{PriorityMailboxes: []string{"CEO@Example.com", "urgent@example.com"}, InternalDomains: []string{"example.com", "corp.test"}, AuthservID: "MX.example.com"}
	trusting := r
	trusting.TrustFromHeader, trusting.AuthservID = true, ""
	noID := r
	noID.AuthservID = ""
	addr := func(a string) mail.Address { return mail.Address{Addr: a} }
	from := func(a string, ar ...string) mail.Message {
		return mail.Message{From: addr(a), FromCount: 1, AuthResults: ar}
	}
	tests := []struct {
		name     string
		rules    *Rules
		msg      mail.Message
		want     int
		rule     string
		internal bool
	}{
		{"external to nobody special", nil, mail.Message{From: addr("x@other.test"), To: []mail.Address{addr("sales@example.com")}}, 0, "", false},
		{"priority in To", nil, mail.Message{From: addr("x@other.test"), To: []mail.Address{addr("ceo@example.com")}}, 10, "priority mailbox ceo@example.com (To)", false},
		{"priority in Cc", nil, mail.Message{From: addr("x@other.test"), Cc: []mail.Address{addr("urgent@example.com")}}, 10, "priority mailbox urgent@example.com (Cc)", false},
		{"priority in Delivered-To", nil, mail.Message{From: addr("x@other.test"), DeliveredTo: []string{"<ceo@example.com>"}}, 10, "priority mailbox ceo@example.com (Delivered-To)", false},
		{"priority in X-Original-To", nil, mail.Message{From: addr("x@other.test"), XOriginalTo: []string{"urgent@example.com"}}, 10, "priority mailbox urgent@example.com (X-Original-To)", false},
		{"internal sender, dmarc pass", nil, from("colleague@example.com", "mx.example.com; dmarc=pass (p=reject dis=none) header.from=example.com"),
			1, "internal sender (example.com; dmarc=pass header.from=example.com per mx.example.com)", true},
		{"internal sender, dkim pass for the parent domain", nil, from("ci@build.corp.test", "mx.example.com 1; dkim=pass header.d=corp.test header.s=k; spf=fail smtp.mailfrom=x@evil.test"),
			1, "internal sender (corp.test; dkim=pass header.d=corp.test per mx.example.com)", true},
		{"internal sender, spf pass", nil, from("colleague@example.com", "mx.example.com; spf=pass smtp.mailfrom=bounce@mail.example.com"),
			1, "internal sender (example.com; spf=pass smtp.mailfrom=mail.example.com per mx.example.com)", true},
		{"spoofed From without evidence", nil, from("colleague@example.com"), 0, "", false},
		{"evidence for another domain", nil, from("colleague@example.com", "mx.example.com; dkim=pass header.d=evil.test; dmarc=fail header.from=example.com"), 0, "", false},
		{"dkim pass for a lookalike domain", nil, from("colleague@example.com", "mx.example.com; dkim=pass header.d=notexample.com"), 0, "", false},
		{"other authserv-id", nil, from("colleague@example.com", "mx.evil.test; dmarc=pass header.from=example.com"), 0, "", false},
		{"forged header below the server's own", nil, from("colleague@example.com", "mx.example.com; dmarc=fail header.from=example.com", "mx.example.com; dmarc=pass header.from=example.com"), 0, "", false},
		{"pass only in a comment", nil, from("colleague@example.com", "mx.example.com; dmarc=fail (dmarc=pass header.from=example.com) header.from=example.com"), 0, "", false},
		{"multi-address From is never internal", nil, mail.Message{From: addr("colleague@example.com"), FromCount: 2, AuthResults: []string{"mx.example.com; dmarc=pass header.from=example.com"}}, 0, "", false},
		{"no authserv-id configured", &noID, from("colleague@example.com", "mx.example.com; dmarc=pass header.from=example.com"), 0, "", false},
		{"operator opted out", &trusting, from("colleague@example.com"), 1, "internal sender (example.com; From header only, trust_from_header is on)", true},
		{"opt-out still refuses a multi-address From", &trusting, mail.Message{From: addr("colleague@example.com"), FromCount: 2}, 0, "", false},
		{"lookalike domain is external", nil, from("x@notexample.com", "mx.example.com; dmarc=pass header.from=notexample.com"), 0, "", false},
		{"priority wins over internal", nil, mail.Message{From: addr("colleague@example.com"), FromCount: 1, AuthResults: []string{"mx.example.com; dmarc=pass header.from=example.com"}, To: []mail.Address{addr("ceo@example.com")}}, 10, "priority mailbox ceo@example.com (To)", true},
		{"no sender", nil, mail.Message{}, 0, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rr := r
			if tt.rules != nil {
				rr = *tt.rules
			}
			got := rr.apply(&tt.msg)
			if got.Rule != tt.rule || (tt.rule != "" && got.Importance != tt.want) || got.Internal != tt.internal {
				t.Errorf("apply = %+v, want importance %d rule %q internal %v", got, tt.want, tt.rule, tt.internal)
			}
		})
	}
}

func TestRuleOverridesModelInPost(t *testing.T) {
	e := newUnit(t, nil)
	e.src.add(eml("ann@customer.test", "ceo@example.com", "to the boss", "x"))
	e.src.add(eml("colleague@example.com", "sales@example.com", "lunch?", "x", arPass))
	if _, err := e.w.Once(context.Background()); err != nil {
		t.Fatal(err)
	}
	ps := e.a.Posts()
	if ps[0].Importance != 10 || !ps[0].Important || !strings.Contains(ps[0].Rule, "priority mailbox") {
		t.Errorf("priority post = %+v", ps[0])
	}
	if ps[1].Importance != 1 || ps[1].Important || !strings.Contains(ps[1].Rule, "internal") {
		t.Errorf("internal post = %+v", ps[1])
	}
	rs := e.w.Recent()
	if rs[0].ModelImportance != 5 {
		t.Errorf("the model's own importance is lost: %d", rs[0].ModelImportance)
	}
}

func TestUIDValidityChange(t *testing.T) {
	for _, rebase := range []bool{true, false} {
		t.Run(map[bool]string{true: "rebaseline", false: "reprocess"}[rebase], func(t *testing.T) {
			e := newUnit(t, func(o *Options) { o.Rebaseline = rebase })
			e.src.add(eml("a@customer.test", "x@example.com", "one", "x"))
			e.src.add(eml("a@customer.test", "x@example.com", "two", "x"))
			if _, err := e.w.Once(context.Background()); err != nil {
				t.Fatal(err)
			}
			// The mailbox is recreated: new UIDVALIDITY, three mails.
			e.src.uidValidity = 8
			e.src.add(eml("a@customer.test", "x@example.com", "three", "x"))
			n, err := e.w.Once(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			c := readCheckpoint(t, e.w)
			if c.UIDValidity != 8 || c.LastUID != 3 {
				t.Errorf("checkpoint = %+v, want uidvalidity 8, last_uid 3", c)
			}
			wantN := map[bool]int{true: 0, false: 3}[rebase]
			if n != wantN {
				t.Errorf("processed %d after the change, want %d", n, wantN)
			}
			if rebase && (len(e.a.Alerts()) != 1 || !strings.Contains(e.a.Alerts()[0], "re-baselined at UID 3")) {
				t.Errorf("alerts = %q", e.a.Alerts())
			}
		})
	}
}

// TestFirstRunNew: connecting a mailbox that already holds mail does not
// post its history (first_run: new); mail that arrives afterwards is
// triaged, and a restart continues from the checkpoint, not from the top.
func TestFirstRunNew(t *testing.T) {
	e := newUnit(t, func(o *Options) { o.StartAtEnd = true })
	e.src.add(eml("a@customer.test", "x@example.com", "old one", "x"))
	e.src.add(eml("a@customer.test", "x@example.com", "old two", "x"))
	n, err := e.w.Once(context.Background())
	if err != nil || n != 0 {
		t.Fatalf("first poll: processed %d, err %v; want 0 (history is not news)", n, err)
	}
	if c := readCheckpoint(t, e.w); c.UIDValidity != 7 || c.LastUID != 2 {
		t.Errorf("checkpoint after the first poll = %+v, want uidvalidity 7, last_uid 2", c)
	}
	e.src.add(eml("a@customer.test", "x@example.com", "new one", "x"))
	if n, err := e.w.Once(context.Background()); err != nil || n != 1 {
		t.Fatalf("second poll: processed %d, err %v; want 1", n, err)
	}
	// A restarted worker reads the checkpoint: nothing is skipped.
	e.src.add(eml("a@customer.test", "x@example.com", "new two", "x"))
	w2, err := New(e.w.o)
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	if n, err := w2.Once(context.Background()); err != nil || n != 1 {
		t.Fatalf("after a restart: processed %d, err %v; want 1", n, err)
	}
	var subjects []string
	for _, p := range e.a.Posts() {
		subjects = append(subjects, p.Subject)
	}
	if strings.Join(subjects, ",") != "new one,new two" {
		t.Errorf("posted %q, want only the mails that arrived after the first poll", subjects)
	}
}

func TestCorruptCheckpointRefusesToStart(t *testing.T) {
	e := newUnit(t, nil)
	if err := os.MkdirAll(filepath.Dir(e.w.path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.w.path, []byte(`{"last_uid": 4`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := New(e.w.o)
	if err == nil || !strings.Contains(err.Error(), e.w.path) {
		t.Fatalf("New = %v, want an error naming %s", err, e.w.path)
	}
}

func TestCheckpointPath(t *testing.T) {
	tests := []struct{ mailbox, wantBase string }{
		{"imap://triage@127.0.0.1:1143/INBOX", "imap___triage@127.0.0.1_1143_INBOX-"},
		{"maildir:/var/mail/demo", "maildir__var_mail_demo-"},
		{"../../etc/passwd", "etc_passwd-"},
		{"", "-"},
	}
	seen := map[string]bool{}
	for _, tt := range tests {
		p := checkpointPath("/state", tt.mailbox)
		if filepath.Dir(p) != "/state/triage" {
			t.Errorf("%q → %s escapes the state dir", tt.mailbox, p)
		}
		base := filepath.Base(p)
		if !strings.HasPrefix(base, tt.wantBase) || !strings.HasSuffix(base, ".json") || len(base) != len(tt.wantBase)+8+5 {
			t.Errorf("%q → %s, want %s<8 hex>.json", tt.mailbox, base, tt.wantBase)
		}
		if seen[p] {
			t.Errorf("%q collides", tt.mailbox)
		}
		seen[p] = true
	}
	if checkpointPath("/s", "a/b") == checkpointPath("/s", "a_b") {
		t.Error("names that sanitize alike share a checkpoint")
	}
}

func TestAlerting(t *testing.T) {
	e := newUnit(t, func(o *Options) { o.AlertFailures = 3; o.RemindEvery = 6 * time.Hour })
	down := errors.New("dial tcp: connection refused")
	type step struct {
		advance time.Duration
		fail    bool
		alerts  int    // total alerts after the step
		last    string // substring of the newest alert
	}
	steps := []step{
		{0, true, 0, ""},
		{time.Minute, true, 0, ""},
		{time.Minute, true, 1, "3 polls in a row failed"},
		{time.Minute, true, 1, ""},
		{3 * time.Hour, true, 1, ""},
		{3 * time.Hour, true, 2, "reminder"},
		{time.Hour, true, 2, ""},
		{6 * time.Hour, true, 3, "reminder"},
		{time.Minute, false, 4, "all clear"},
		{time.Minute, false, 4, ""},
		{time.Minute, true, 4, ""}, // a fresh failure streak starts quiet again
		{time.Minute, false, 4, ""},
	}
	for i, s := range steps {
		e.clock.Advance(s.advance)
		if s.fail {
			e.src.fetchErr = down
		} else {
			e.src.fetchErr = nil
		}
		_, _ = e.w.Once(context.Background())
		got := e.a.Alerts()
		if len(got) != s.alerts {
			t.Fatalf("step %d: %d alerts, want %d: %q", i, len(got), s.alerts, got)
		}
		if s.last != "" && !strings.Contains(got[len(got)-1], s.last) {
			t.Errorf("step %d: newest alert %q lacks %q", i, got[len(got)-1], s.last)
		}
		if len(e.b.Alerts()) != len(got) {
			t.Errorf("step %d: sinks disagree on alerts", i)
		}
	}
	if !strings.Contains(e.a.Alerts()[0], "connection refused") {
		t.Errorf("alert lacks the cause: %q", e.a.Alerts()[0])
	}
}

func TestAlertRetriedWhenNoSinkTookIt(t *testing.T) {
	e := newUnit(t, func(o *Options) { o.AlertFailures = 1 })
	e.src.fetchErr = errors.New("down")
	e.a.failAlert = errors.New("slack down too")
	e.b.failAlert = errors.New("telegram down too")
	_, _ = e.w.Once(context.Background())
	if e.w.State().Alerting {
		t.Fatal("alert counted as raised though no sink took it")
	}
	e.b.failAlert = nil
	e.clock.Advance(time.Minute)
	_, _ = e.w.Once(context.Background())
	if len(e.b.Alerts()) != 1 || !e.w.State().Alerting {
		t.Fatalf("alert not retried: %q", e.b.Alerts())
	}
}

func TestManualModeLeavesCheckpoint(t *testing.T) {
	e := newUnit(t, nil)
	uid := e.src.add(eml("ann@customer.test", "sales@example.com", "by hand", "x"))
	res, err := e.w.ProcessUID(context.Background(), uid, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(e.a.Posts()) != 0 || !res.DryRun || !strings.Contains(res.Text, "by hand") {
		t.Fatalf("dry run posted or lost the text: posts %d, text %q", len(e.a.Posts()), res.Text)
	}
	if _, err := e.w.ProcessUID(context.Background(), uid, false); err != nil {
		t.Fatal(err)
	}
	if got := e.a.Posts(); len(got) != 1 || !strings.HasPrefix(got[0].Key, "manual/") {
		t.Fatalf("manual post = %+v", got)
	}
	if c := readCheckpoint(t, e.w); c.LastUID != 0 {
		t.Errorf("manual mode moved the checkpoint to %d", c.LastUID)
	}
	if _, err := e.w.ProcessUID(context.Background(), 99, true); err == nil || !strings.Contains(err.Error(), "UID 99") {
		t.Errorf("missing UID: %v", err)
	}
	res, err = e.w.ProcessRaw(context.Background(), []byte(eml("x@customer.test", "y@example.com", "from a file", "z")), true)
	if err != nil || !strings.Contains(res.Text, "from a file") {
		t.Fatalf("ProcessRaw = %q, %v", res.Text, err)
	}
}

func TestCostAndMetrics(t *testing.T) {
	e := newUnit(t, func(o *Options) {
		o.ClassifierLocal = true
		o.Prices.EnergyPerKWh = 0.30
		o.Power = func(context.Context) (float64, bool) { return 360, true }
	})
	e.src.add(eml("ann@customer.test", "sales@example.com", "priced", "x"))
	if _, err := e.w.Once(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := e.w.Recent()[0].Cost
	// 1000 prompt × 1/M + 100 completion × 10/M = 0.002; 360 W × 2 s = 0.2 Wh → 0.00006.
	if !near(c.Classification, 0.002) || !near(c.EnergyWh, 0.2) || !near(c.Energy, 0.00006) || !near(c.Total, 0.00206) {
		t.Errorf("cost = %+v", c)
	}
	if f := c.Footer(); !strings.Contains(f, "0.0021 EUR") || !strings.Contains(f, "1000+100 tok") || !strings.Contains(f, "0.20 Wh") {
		t.Errorf("footer = %q", f)
	}
	if p := e.a.Posts()[0]; p.Cost != c.Footer() {
		t.Errorf("post footer %q != %q", p.Cost, c.Footer())
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(e.w.Collectors()...)
	if v := testutil.ToFloat64(e.w.metrics.mails.WithLabelValues("customer")); v != 1 {
		t.Errorf("mails_total{customer} = %v", v)
	}
	if v := testutil.ToFloat64(e.w.metrics.cost.WithLabelValues("classification")); !near(v, 0.002) {
		t.Errorf("cost_total{classification} = %v", v)
	}
	if v := testutil.ToFloat64(e.w.metrics.energyWh); !near(v, 0.2) {
		t.Errorf("energy_wh_total = %v", v)
	}
	if _, err := reg.Gather(); err != nil {
		t.Errorf("gather: %v", err)
	}
}

func TestPrice(t *testing.T) {
	e := newUnit(t, nil)
	tests := []struct {
		name  string
		calls []localUsage
		want  Cost
	}{
		{"nothing", nil, Cost{Currency: "EUR"}},
		{"remote model without a price is named", []localUsage{{Usage: usage("classification", "gpt-x", 10, 1, 0)}},
			Cost{Currency: "EUR", PromptTokens: 10, CompletionTokens: 1, Unpriced: []string{"gpt-x"}}},
		{"local model without a price is energy only", []localUsage{{Usage: usage("classification", "qwen", 10, 1, 0), Local: true}},
			Cost{Currency: "EUR", PromptTokens: 10, CompletionTokens: 1, NoPower: true}},
		{"transcription per minute", []localUsage{{Usage: usage("transcription", "whisper-1", 0, 0, 90)}},
			Cost{Currency: "EUR", Transcription: 0.009, Total: 0.009, AudioSeconds: 90}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := e.w.price(tt.calls)
			if got.Currency != tt.want.Currency || !near(got.Total, tt.want.Total) || !near(got.Transcription, tt.want.Transcription) ||
				got.PromptTokens != tt.want.PromptTokens || strings.Join(got.Unpriced, ",") != strings.Join(tt.want.Unpriced, ",") ||
				got.NoPower != tt.want.NoPower || got.AudioSeconds != tt.want.AudioSeconds {
				t.Errorf("price = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestAPI(t *testing.T) {
	e := newUnit(t, nil)
	e.src.add(eml("ann@customer.test", "sales@example.com", "api subject", "SECRET-BODY-TEXT"))
	if _, err := e.w.Once(context.Background()); err != nil {
		t.Fatal(err)
	}
	ec := echo.New()
	e.w.Register(ec)
	for _, tt := range []struct {
		query string
		code  int
		n     int
	}{{"", 200, 1}, {"?limit=0", 200, 0}, {"?limit=x", 400, 0}} {
		rec := httptest.NewRecorder()
		ec.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/triage"+tt.query, nil))
		if rec.Code != tt.code {
			t.Fatalf("GET %s = %d %s", tt.query, rec.Code, rec.Body)
		}
		if tt.code != 200 {
			continue
		}
		if strings.Contains(rec.Body.String(), "SECRET-BODY-TEXT") {
			t.Error("the API leaks the mail body")
		}
		var resp APIResponse
		if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil {
			t.Fatal(err)
		}
		if len(resp.Results) != tt.n || resp.State.Checkpoint.LastUID != 1 || resp.State.Mailbox != "mem://test/INBOX" {
			t.Errorf("GET %s = %+v", tt.query, resp)
		}
		if tt.n > 0 && resp.Results[0].Subject != "api subject" {
			t.Errorf("result = %+v", resp.Results[0])
		}
	}
}

func TestClean(t *testing.T) {
	tests := []struct {
		in   string
		max  int
		want string
	}{
		{"plain", 100, "plain"},
		{"evil\r\nBcc: victim@x", 100, "evil Bcc: victim@x"},
		{"tabs\tand\x00nul", 100, "tabs and nul"},
		{"bad \xff utf8", 100, "bad ÿ utf8"}, // invalid UTF-8 read as windows-1252, as mail.CleanLine does for headers
		{strings.Repeat("a", 20), 10, strings.Repeat("a", 10) + "…"},
		{"  spaces   collapse  ", 100, "spaces collapse"},
		{"exact", 5, "exact"},
	}
	for _, tt := range tests {
		if got := clean(tt.in, tt.max); got != tt.want {
			t.Errorf("clean(%q, %d) = %q, want %q", tt.in, tt.max, got, tt.want)
		}
	}
}

func usage(kind, model string, prompt, completion int, audio float64) llm.Usage {
	return llm.Usage{Kind: kind, Model: model, PromptTokens: prompt, CompletionTokens: completion, AudioSeconds: audio, Duration: time.Second}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

func TestOversizedAudioIsNoted(t *testing.T) {
	e := newUnit(t, func(o *Options) { o.MaxAudioBytes = 1024 })
	e.src.add(string(badInputMails(false)["fifty-mb-memo"]))
	e.src.add(strings.Replace(string(badInputMails(false)["fifty-mb-memo"]), "big.mp3", "broken.mp3", 1))
	if n, err := e.w.Once(context.Background()); n != 2 || err != nil {
		t.Fatalf("Once = %d, %v", n, err)
	}
	r := e.w.Recent()[0]
	if !strings.Contains(r.TranscriptNote, "big.mp3") || !strings.Contains(r.TranscriptNote, "over the 1024-byte transcription limit") || len(r.Transcribed) != 0 {
		t.Errorf("note %q, transcribed %v", r.TranscriptNote, r.Transcribed)
	}
	if p := e.a.Posts()[0]; p.TranscriptNote != r.TranscriptNote {
		t.Errorf("the post lacks the note: %+v", p)
	}
}

func TestTranscriptionFailureIsNoted(t *testing.T) {
	e := newUnit(t, nil)
	mails := badInputMails(false)
	e.src.add(string(mails["fifty-mb-memo"]))
	e.src.add(strings.Replace(string(mails["fifty-mb-memo"]), "big.mp3", "broken.mp3", 1))
	if n, err := e.w.Once(context.Background()); n != 2 || err != nil {
		t.Fatalf("Once = %d, %v", n, err)
	}
	rs := e.w.Recent()
	if rs[0].TranscriptNote != "" || len(rs[0].Transcribed) != 1 || !strings.Contains(rs[0].Post.Transcript, "call me back") {
		t.Errorf("good memo: %+v", rs[0])
	}
	if !strings.Contains(rs[1].TranscriptNote, "broken.mp3: transcription failed") || rs[1].Class != "customer" {
		t.Errorf("failed memo: note %q class %q", rs[1].TranscriptNote, rs[1].Class)
	}
	if c := rs[0].Cost; c.AudioSeconds != 30 || !near(c.Transcription, 0.003) {
		t.Errorf("transcription cost = %+v", c)
	}
}

// fakeCustomers stands in for the CRM (triage/customer's own tests run the
// real crm connector against PostgreSQL).
type fakeCustomers struct{ asked []string }

func (f *fakeCustomers) Find(ctx context.Context, email string) (*customer.Customer, error) {
	f.asked = append(f.asked, email)
	switch email {
	case "ann@customer.test":
		return &customer.Customer{ID: 17, Name: "Ann Example", Email: email, URL: "https://crm.test/users/17"}, nil
	case "down@customer.test":
		return nil, errors.New("customer lookup via crm_search_users: database unreachable")
	}
	return nil, nil
}

func TestCustomerLookup(t *testing.T) {
	crm := &fakeCustomers{}
	e := newUnit(t, func(o *Options) { o.Customers = crm })
	e.src.add(eml("Ann <ann@customer.test>", "sales@example.com", "known", "x"))
	e.src.add(eml("new@prospect.test", "sales@example.com", "unknown", "x"))
	e.src.add(eml("colleague@example.com", "sales@example.com", "internal", "x", arPass))
	e.src.add(eml("down@customer.test", "sales@example.com", "crm down", "x"))
	if n, err := e.w.Once(context.Background()); n != 4 || err != nil {
		t.Fatalf("Once = %d, %v (a CRM failure must not hold mail back)", n, err)
	}
	ps := e.a.Posts()
	if ps[0].CustomerName != "Ann Example" || ps[0].CustomerURL != "https://crm.test/users/17" {
		t.Errorf("customer post = %+v", ps[0])
	}
	if ps[1].CustomerURL != "" {
		t.Errorf("unknown sender got a customer link: %+v", ps[1])
	}
	if len(ps[3].Problems) != 1 || !strings.Contains(ps[3].Problems[0], "database unreachable") {
		t.Errorf("CRM failure not noted: %q", ps[3].Problems)
	}
	if strings.Join(crm.asked, ",") != "ann@customer.test,new@prospect.test,down@customer.test" {
		t.Errorf("looked up %v; internal senders must not be looked up", crm.asked)
	}
}
