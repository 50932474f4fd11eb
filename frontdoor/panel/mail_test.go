package panel

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/appliance"
	"gpuhost/config"
	"gpuhost/frontdoor/httpapi"
	"gpuhost/internal/testbin"
	"gpuhost/internal/testkit"
	"gpuhost/triage"
	"gpuhost/triage/customer"
	"gpuhost/triage/sink"
	"gpuhost/triage/source"
	"gpuhost/triage/unsubscribe"
)

// fakeMail follows the worker's behaviour for the page: its state and
// results as the worker reports them (through triage's own conversion to
// the page's types), and ProcessUID that judges a known UID (Manual,
// DryRun, Post and Text set; posted to its sinks unless dry), appends the
// result to the recent ones, and wraps source.ErrNotFound for an unknown
// one, as RerunMail then reports it. hold, when set, makes ProcessUID wait
// for it (or ctx).
type fakeMail struct {
	mu      sync.Mutex
	state   triage.Status
	recent  []triage.Result
	mails   map[uint32]triage.Result // what ProcessUID judges, by UID
	sinks   []string
	posted  []sink.Post
	calls   []bool // dryRun of each ProcessUID call
	hold    chan struct{}
	started chan uint32
}

func (f *fakeMail) MailStatus() api.MailStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	return triage.MailStatusOf(f.state)
}

func (f *fakeMail) MailPosts() []api.MailPost {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]api.MailPost, 0, len(f.recent))
	for _, r := range f.recent {
		out = append(out, triage.MailPostOf(r))
	}
	return out
}

// RerunMail is the worker's, over ProcessUID below.
func (f *fakeMail) RerunMail(ctx context.Context, uid uint32, dryRun bool) (api.MailPost, error) {
	return triage.MailRerunOf(f.ProcessUID(ctx, uid, dryRun))
}

func (f *fakeMail) ProcessUID(ctx context.Context, uid uint32, dryRun bool) (triage.Result, error) {
	f.mu.Lock()
	f.calls = append(f.calls, dryRun)
	hold, started := f.hold, f.started
	f.mu.Unlock()
	if started != nil {
		started <- uid
	}
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return triage.Result{}, fmt.Errorf("classify manual/INBOX/%d: %w", uid, ctx.Err())
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.mails[uid]
	if !ok {
		return triage.Result{}, fmt.Errorf("mailbox INBOX has no mail with UID %d: %w", uid, source.ErrNotFound)
	}
	r.Key = fmt.Sprintf("manual/INBOX/%d", uid)
	r.Manual, r.DryRun, r.Posted = true, dryRun, nil // judged afresh
	r.Post.Key = r.Key
	r.Text = sink.Text(r.Post)
	if !dryRun {
		f.posted = append(f.posted, r.Post)
		r.Posted = append([]string(nil), f.sinks...)
	}
	f.recent = append(f.recent, r)
	return r, nil
}

// hostileResult is a judged mail whose sender, subject and links try to
// become markup or script.
func hostileResult(uid uint32) triage.Result {
	r := triage.Result{
		Key: fmt.Sprintf("INBOX/7/%d", uid), UID: uid, At: time.Date(2026, 11, 30, 8, 1, 0, 0, time.UTC),
		From: `"<script>alert(1)</script>" <evil@attacker.test>`, Subject: `Hi <img src=x onerror=alert(2)> <script>alert(3)</script>`,
		Class: "promotional", Importance: 10, ModelImportance: 2, Rule: "priority mailbox urgent@ourcompany.example",
		Important: true, Reasoning: "a <b>newsletter</b>",
		Unsubscribe: unsubscribe.Result{URL: "javascript:alert(4)", Mailto: "mailto:off@attacker.test", Source: "header"},
		Customer:    &customer.Customer{ID: 9, Name: "<i>Evil Corp</i>", Email: "evil@attacker.test", URL: "javascript:alert(5)"},
		Cost:        triage.Cost{Currency: "EUR", Total: 0.0021, PromptTokens: 412, CompletionTokens: 38},
		Posted:      []string{"slack"},
	}
	r.Post = sink.Post{Key: r.Key, From: r.From, Subject: r.Subject, Class: r.Class, Importance: r.Importance, Rule: r.Rule,
		Reasoning: r.Reasoning, Transcript: "SECRET TRANSCRIPT TEXT of the voice memo", Cost: r.Cost.Footer()}
	return r
}

// goodResult is a customer mail with an https unsubscribe and CRM link.
func goodResult(uid uint32) triage.Result {
	r := triage.Result{
		Key: fmt.Sprintf("INBOX/7/%d", uid), UID: uid, At: time.Date(2026, 11, 30, 8, 2, 0, 0, time.UTC),
		From: "Ann <ann@customer.test>", Subject: "Order 4711 is late", Class: "customer", Importance: 6, ModelImportance: 6, Real: true,
		Unsubscribe: unsubscribe.Result{URL: "https://news.example/u?a=1&b=2", OneClick: true, Source: "header"},
		Customer:    &customer.Customer{ID: 42, Name: "Ann Example", Email: "ann@customer.test", URL: "https://crm.example/customers/42"},
		Cost:        triage.Cost{Currency: "EUR", Total: 0.5},
		Posted:      []string{"slack", "telegram"},
	}
	r.Post = sink.Post{Key: r.Key, From: r.From, Subject: r.Subject, Class: r.Class, Importance: r.Importance, Real: true, Cost: r.Cost.Footer()}
	return r
}

func newFakeMail() *fakeMail {
	now := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	return &fakeMail{
		state: triage.Status{
			Mailbox:    "imaps://triage@mail.example/INBOX",
			Checkpoint: triage.Checkpoint{UIDValidity: 1700000001, LastUID: 4711, Updated: now, Costs: []triage.DayCost{{Day: "2026-11-29", Currency: "EUR", Mails: 3, Total: 1.25, Calls: 5, Repeats: 1}, {Day: "2026-11-30", Currency: "EUR", Mails: 2, Total: 0.0021}}},
			LastPoll:   now, LastPollOK: now.Add(-time.Hour), LastError: "fetch from INBOX after UID 4711: dial tcp: connection <b>refused</b>",
			ConsecutiveFailures: 4, FailingSince: now.Add(-time.Hour), Alerting: true,
			LastAlert: now.Add(-30 * time.Minute), LastAllClear: now.Add(-48 * time.Hour), Processed: 2,
		},
		recent: []triage.Result{goodResult(4710), hostileResult(4711)},
		mails:  map[uint32]triage.Result{4710: goodResult(4710), 4711: hostileResult(4711)},
		sinks:  []string{"slack", "telegram"},
	}
}

// mailEnv is the panel with a Supervisor that runs nothing (the Mail page
// needs only its state pill) behind the daemon's own echo server.
type mailEnv struct {
	p   *Panel
	srv *httptest.Server
}

func newMailEnv(t *testing.T, m Mail, setup func(p *Panel)) *mailEnv {
	t.Helper()
	state := t.TempDir()
	cfg, err := config.Parse("mail-test", []byte(testbin.ConfigYAML("/nonexistent/gpuhost", state, "process", "", testkit.FreePort(t), testkit.FreePort(t), "10ms")))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	sup := appliance.NewSupervisor(cfg, nil, nil, nil, log)
	t.Cleanup(sup.Close)
	e, err := httpapi.New(sup, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	ev := &mailEnv{}
	if ev.p, err = New(sup, nil, testDaemon(cfg), log); err != nil {
		t.Fatal(err)
	}
	ev.p.Register(e)
	if m != nil {
		ev.p.SetMail(m) // after Register, as serve does
	}
	ev.p.now = func() time.Time { return time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC) }
	if setup != nil {
		setup(ev.p)
	}
	ev.srv = httptest.NewServer(e)
	t.Cleanup(func() { ev.srv.CloseClientConnections(); ev.srv.Close() })
	return ev
}

// page loads /mail with a fresh browser-like client, returning the client
// and the form's CSRF token.
func (ev *mailEnv) page(t *testing.T) (*http.Client, string, string) {
	t.Helper()
	c := (&env{}).client(t)
	resp, body := do(t, c, "GET", ev.srv.URL+"/mail", nil, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /mail: %d\n%s", resp.StatusCode, body)
	}
	return c, body, csrfMeta(t, body)
}

func TestMailPageDisabled(t *testing.T) {
	ev := newMailEnv(t, nil, nil)
	c, body, tok := ev.page(t)
	for _, w := range []string{"Mail triage is off", "triage.enabled: true", "gpuhost.yaml", `href="/mail" aria-current="page"`} {
		if !strings.Contains(body, w) {
			t.Errorf("disabled page lacks %q:\n%s", w, body)
		}
	}
	resp, body := do(t, c, "POST", ev.srv.URL+"/mail/rerun", url.Values{"uid": {"1"}, "csrf": {tok}}, nil)
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(body, "Mail triage is off") {
		t.Errorf("rerun with triage off: %d\n%s", resp.StatusCode, body)
	}
}

func TestMailPageShowsState(t *testing.T) {
	ev := newMailEnv(t, newFakeMail(), nil)
	_, body, _ := ev.page(t)
	for _, w := range []string{
		"imaps://triage@mail.example/INBOX", `<dd id="cp-uidvalidity">1700000001</dd>`, `<dd id="cp-last-uid">4711</dd>`, // checkpoint
		"4 in a row", "alerting", "dial tcp: connection &lt;b&gt;refused&lt;/b&gt;", // alert state, the error escaped
		"2026-11-29", "1.25 EUR", "0.0021 EUR", `<tr class="today">`, "5 calls, 1 repeated after a crash", // per-day cost
		"Order 4711 is late", "customer", // a post
		`href="https://news.example/u?a=1&amp;b=2"`, "one-click", `href="https://crm.example/customers/42"`, "Ann Example",
		"priority mailbox urgent@ourcompany.example", "(model 2)", // the rule that overrode the model
		`href="/mail?uid=4711#rerun"`,
		`name="dry_run" value="1" checked`, // dry run by default
	} {
		if !strings.Contains(body, w) {
			t.Errorf("page lacks %q", w)
		}
	}
	if strings.Index(body, "evil@attacker.test") > strings.Index(body, "4711 is late") {
		t.Error("recent posts are not newest first")
	}
}

func TestMailPageEscapes(t *testing.T) {
	ev := newMailEnv(t, newFakeMail(), nil)
	resp, body := do(t, (&env{}).client(t), "GET", ev.srv.URL+"/mail", nil, nil)
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
		t.Errorf("CSP = %q", csp)
	}
	for _, bad := range []string{"<script>alert", "<img src=x", "<i>Evil", "javascript:", "SECRET TRANSCRIPT", "<b>refused"} {
		if strings.Contains(body, bad) {
			t.Errorf("page contains %q", bad)
		}
	}
	for _, w := range []string{"&lt;script&gt;alert(1)&lt;/script&gt;", "&lt;img src=x onerror=alert(2)&gt;", "&lt;i&gt;Evil Corp&lt;/i&gt;",
		"unsubscribe: mailto:off@attacker.test"} {
		if !strings.Contains(body, w) {
			t.Errorf("page lacks the escaped %q", w)
		}
	}
}

func TestMailRerunRefusesForgedPosts(t *testing.T) {
	f := newFakeMail()
	ev := newMailEnv(t, f, nil)
	c, _, tok := ev.page(t)
	form := url.Values{"uid": {"4710"}, "dry_run": {"0"}}
	withTok := url.Values{"uid": {"4710"}, "dry_run": {"0"}, "csrf": {tok}}
	tests := []struct {
		name   string
		client *http.Client
		form   url.Values
		header map[string]string
	}{
		{"no CSRF token", c, form, nil},
		{"wrong token", c, url.Values{"uid": {"4710"}, "csrf": {"AAAA" + tok[4:]}}, nil},
		{"another browser's token", (&env{}).client(t), withTok, nil},
		{"cross-origin", c, withTok, map[string]string{"Origin": "http://evil.example"}},
		{"cross-site fetch metadata", c, withTok, map[string]string{"Sec-Fetch-Site": "cross-site"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := do(t, tt.client, "POST", ev.srv.URL+"/mail/rerun", tt.form, tt.header)
			if resp.StatusCode != http.StatusForbidden {
				t.Fatalf("status %d, want 403:\n%s", resp.StatusCode, body)
			}
		})
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.calls) != 0 || len(f.posted) != 0 {
		t.Errorf("a refused POST ran the pipeline: %d calls, %d posts", len(f.calls), len(f.posted))
	}
}

func TestMailRerunBadUID(t *testing.T) {
	f := newFakeMail()
	ev := newMailEnv(t, f, nil)
	c, _, tok := ev.page(t)
	for _, uid := range []string{"", "0", "-1", "abc", "4294967296", "1.5", "<b>7</b>"} {
		t.Run(uid, func(t *testing.T) {
			resp, body := do(t, c, "POST", ev.srv.URL+"/mail/rerun", url.Values{"uid": {uid}, "csrf": {tok}}, nil)
			want := "uid must be a positive integer"
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, want) || !strings.Contains(body, "&#34;"+htmlText(uid)+"&#34;") {
				t.Errorf("uid %q: %d, want 400 naming the field and the value:\n%s", uid, resp.StatusCode, body)
			}
			if strings.Contains(body, "<b>7") {
				t.Error("the value became markup")
			}
		})
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.calls) != 0 {
		t.Errorf("a bad UID ran the pipeline %d times", len(f.calls))
	}
}

// htmlText is html/template's escaping of a form value in text.
func htmlText(s string) string {
	return strings.NewReplacer("<", "&lt;", ">", "&gt;").Replace(s)
}

// TestMailRerunDryRunDefault: the form as rendered, a POST without the
// field and a checked box are dry runs; only the unchecked box posts.
func TestMailRerunDryRunDefault(t *testing.T) {
	tests := []struct {
		name   string
		dryRun []string // the dry_run values sent; nil: the field left out
		want   bool
	}{
		{"field left out", nil, true},
		{"box checked (hidden 0 then 1)", []string{"0", "1"}, true},
		{"box checked alone", []string{"1"}, true},
		{"box unchecked", []string{"0"}, false},
		{"anything else", []string{"no"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeMail()
			ev := newMailEnv(t, f, nil)
			c, _, tok := ev.page(t)
			form := url.Values{"uid": {"4710"}, "csrf": {tok}}
			if tt.dryRun != nil {
				form["dry_run"] = tt.dryRun
			}
			resp, body := do(t, c, "POST", ev.srv.URL+"/mail/rerun", form, nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d:\n%s", resp.StatusCode, body)
			}
			f.mu.Lock()
			calls, posted := append([]bool(nil), f.calls...), len(f.posted)
			f.mu.Unlock()
			if len(calls) != 1 || calls[0] != tt.want {
				t.Fatalf("ProcessUID calls (dryRun) = %v, want [%v]", calls, tt.want)
			}
			if tt.want {
				if posted != 0 || !strings.Contains(body, "Nothing posted (dry run)") {
					t.Errorf("dry run posted %d or the page does not say so", posted)
				}
			} else if posted != 1 || !strings.Contains(body, "Posted to slack, telegram") {
				t.Errorf("real run posted %d or the page does not say where", posted)
			}
			for _, w := range []string{`id="rerun-result"`, "Order 4711 is late", "importance <strong>6</strong>", "From: Ann"} {
				if !strings.Contains(body, w) {
					t.Errorf("result lacks %q:\n%s", w, body)
				}
			}
			// The form keeps the operator's choice.
			if checked := strings.Contains(body, `value="1" checked`); checked != tt.want {
				t.Errorf("after the run the box is checked=%v, want %v", checked, tt.want)
			}
		})
	}
}

// TestMailRerunResultEscapedWithoutTranscript reruns the hostile mail: the
// post text is escaped and its transcript excerpt left out.
func TestMailRerunResultEscapedWithoutTranscript(t *testing.T) {
	ev := newMailEnv(t, newFakeMail(), nil)
	c, _, tok := ev.page(t)
	resp, body := do(t, c, "POST", ev.srv.URL+"/mail/rerun", url.Values{"uid": {"4711"}, "csrf": {tok}}, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d:\n%s", resp.StatusCode, body)
	}
	if strings.Contains(body, "SECRET TRANSCRIPT") || strings.Contains(body, "<script>alert") || strings.Contains(body, "<b>newsletter") {
		t.Errorf("the result shows the transcript or unescaped markup:\n%s", body)
	}
	for _, w := range []string{"transcript excerpt of the post is not shown", "a &lt;b&gt;newsletter&lt;/b&gt;", "by rule: priority mailbox"} {
		if !strings.Contains(body, w) {
			t.Errorf("result lacks %q", w)
		}
	}
}

func TestMailRerunNotFound(t *testing.T) {
	ev := newMailEnv(t, newFakeMail(), nil)
	c, _, tok := ev.page(t)
	resp, body := do(t, c, "POST", ev.srv.URL+"/mail/rerun", url.Values{"uid": {"99"}, "csrf": {tok}}, nil)
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(body, "no mail with UID 99") {
		t.Errorf("unknown UID: %d\n%s", resp.StatusCode, body)
	}
}

// TestMailRerunBusy holds the first rerun in the worker: a second one is
// refused as busy at once, and the first still finishes.
func TestMailRerunBusy(t *testing.T) {
	f := newFakeMail()
	f.hold, f.started = make(chan struct{}), make(chan uint32, 2)
	ev := newMailEnv(t, f, nil)
	c, _, tok := ev.page(t)
	type answer struct {
		code int
		body string
	}
	first := make(chan answer, 1)
	go func() {
		resp, body := do(t, c, "POST", ev.srv.URL+"/mail/rerun", url.Values{"uid": {"4710"}, "csrf": {tok}}, nil)
		first <- answer{resp.StatusCode, body}
	}()
	select {
	case <-f.started:
	case <-time.After(10 * time.Second):
		t.Fatal("the first rerun did not reach the worker")
	}
	resp, body := do(t, c, "POST", ev.srv.URL+"/mail/rerun", url.Values{"uid": {"4711"}, "csrf": {tok}}, nil)
	if resp.StatusCode != http.StatusConflict || !strings.Contains(body, "busy: the rerun of UID 4710") {
		t.Errorf("second rerun: %d, want 409 busy:\n%s", resp.StatusCode, body)
	}
	close(f.hold)
	a := <-first
	if a.code != http.StatusOK || !strings.Contains(a.body, "Order 4711 is late") {
		t.Errorf("first rerun: %d\n%s", a.code, a.body[strings.Index(a.body, "<main>"):])
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.calls) != 1 {
		t.Errorf("the worker ran %d reruns, want 1", len(f.calls))
	}
}

// TestMailRerunTimeout: a worker that does not answer in time gets a 504
// with the reason, and the slot is free again once it has returned.
func TestMailRerunTimeout(t *testing.T) {
	f := newFakeMail()
	f.hold = make(chan struct{}) // never closed: ProcessUID returns at ctx's end
	ev := newMailEnv(t, f, func(p *Panel) { p.mailState().timeout = 50 * time.Millisecond })
	c, _, tok := ev.page(t)
	resp, body := do(t, c, "POST", ev.srv.URL+"/mail/rerun", url.Values{"uid": {"4710"}, "csrf": {tok}}, nil)
	if resp.StatusCode != http.StatusGatewayTimeout || !strings.Contains(body, "did not finish within 50ms") {
		t.Fatalf("timeout: %d\n%s", resp.StatusCode, body)
	}
	f.mu.Lock()
	f.hold = nil
	f.mu.Unlock()
	if !testkit.Poll(10*time.Second, func() bool {
		resp, _ := do(t, c, "POST", ev.srv.URL+"/mail/rerun", url.Values{"uid": {"4710"}, "csrf": {tok}}, nil)
		return resp.StatusCode == http.StatusOK
	}) {
		t.Fatal("the rerun slot stayed taken after the worker returned")
	}
}

func TestParseUIDAndDryRun(t *testing.T) {
	for in, want := range map[string]uint32{"1": 1, " 42 ": 42, "4294967295": 4294967295} {
		if got, err := parseUID(in); err != nil || got != want {
			t.Errorf("parseUID(%q) = %d, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "0", "+1", "0x10", "4294967296"} {
		if _, err := parseUID(in); err == nil {
			t.Errorf("parseUID(%q) accepted", in)
		}
	}
	for _, l := range []string{"https://a.example/x", "http://a.example"} {
		if httpLink(l) != l {
			t.Errorf("httpLink(%q) dropped a web link", l)
		}
	}
	for _, l := range []string{"javascript:alert(1)", "data:text/html,x", "mailto:a@b", "//evil.example/x", "https:///nohost", " https://a.example"} {
		if httpLink(l) != "" {
			t.Errorf("httpLink(%q) kept it", l)
		}
	}
}

// FuzzParseUID: the rerun form's UID is outside input. It never panics;
// what it accepts is a positive 32-bit number that prints back as the
// input's digits (leading zeros aside).
func FuzzParseUID(f *testing.F) {
	for _, s := range []string{"1", "4711", " 7 ", "0", "-1", "4294967295", "4294967296", "1e3", "0x10", "007", "", "١٢"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseUID(s)
		if err != nil {
			if n != 0 || !strings.Contains(err.Error(), "uid must be a positive integer") {
				t.Fatalf("parseUID(%q) = %d, %v", s, n, err)
			}
			return
		}
		digits := strings.TrimLeft(strings.TrimSpace(s), "0")
		if n == 0 || strconv.FormatUint(uint64(n), 10) != strings.TrimPrefix(digits, "+") {
			t.Fatalf("parseUID(%q) = %d", s, n)
		}
	})
}
