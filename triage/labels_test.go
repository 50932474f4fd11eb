package triage

import (
	"context"
	"strings"
	"testing"
	"time"

	"gpuhost/triage/sink"
	"gpuhost/triage/sink/slacktest"
	"gpuhost/triage/source/dovecottest"
)

// postThroughDovecot delivers each raw mail to a real Dovecot, runs one
// poll of the worker and returns what the Slack fake got for each, in
// order (text fallback plus the blocks JSON).
func postThroughDovecot(t *testing.T, raws ...string) []string {
	t.Helper()
	srv := dovecottest.Start(t, dovecottest.Options{})
	fake := slacktest.New(t)
	w, err := New(Options{Source: imapSource(srv), Classifier: &fakeClassifier{}, Sinks: []sink.Sink{newSlack(t, fake)},
		StateDir: t.TempDir(), Log: testLogger(t),
		Rules: Rules{InternalDomains: []string{"example.com"}, AuthservID: "mx.example.com"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	for _, raw := range raws {
		srv.Append(t, []byte(raw))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if n, err := w.Once(ctx); n != len(raws) || err != nil {
		t.Fatalf("Once = %d, %v; want %d", n, err, len(raws))
	}
	var out []string
	for _, m := range fake.Messages("C0TRIAGE") {
		out = append(out, m.Text+"\n"+string(m.Blocks))
	}
	if len(out) != len(raws) {
		t.Fatalf("Slack got %d posts, want %d", len(out), len(raws))
	}
	return out
}

// TestDovecotOneClickOnlyForHTTPS: RFC 8058 one-click needs an https URI;
// an http List-Unsubscribe with List-Unsubscribe-Post is a plain link.
func TestDovecotOneClickOnlyForHTTPS(t *testing.T) {
	tests := []struct {
		name, header string
		oneClick     bool
	}{
		{"https with Post", "List-Unsubscribe: <https://news.example.org/u/1>", true},
		{"http with Post", "List-Unsubscribe: <http://news.example.org/u/2>", false},
		{"http and mailto with Post", "List-Unsubscribe: <mailto:u@news.example.org>, <http://news.example.org/u/3>", false},
	}
	var raws []string
	for _, tt := range tests {
		raws = append(raws, eml("News <news@news.example.org>", "sales@example.com", "[promo] "+tt.name, "deals",
			tt.header, "List-Unsubscribe-Post: List-Unsubscribe=One-Click"))
	}
	posts := postThroughDovecot(t, raws...)
	for i, tt := range tests {
		if !strings.Contains(posts[i], "news.example.org/u/") {
			t.Errorf("%s: no unsubscribe link in the post:\n%s", tt.name, posts[i])
		}
		if got := strings.Contains(posts[i], "one-click"); got != tt.oneClick {
			t.Errorf("%s: labelled one-click = %v, want %v:\n%s", tt.name, got, tt.oneClick, posts[i])
		}
	}
}

// TestDovecotFromAsReceived: the post's From line shows the sender's
// address as the mail wrote it (escaped for Slack), never a normalised one.
func TestDovecotFromAsReceived(t *testing.T) {
	tests := []struct {
		name, from string
		want       string // in the text fallback
		not        string
	}{
		{"quoted local part", `"x' OR 1=1 --"@evil.com`, `From: "x' OR 1=1 --"@evil.com`, "x'or1=1--@evil.com"},
		{"case kept", `Ann Lee <Ann.Lee@Customer.TEST>`, "From: Ann Lee &lt;Ann.Lee@Customer.TEST&gt;", "ann.lee@customer.test"},
		{"mention in the name is escaped", `"<!channel> boss" <boss@evil.test>`, "From: &lt;!channel&gt; boss &lt;boss@evil.test&gt;", "<!channel>"},
	}
	var raws []string
	for _, tt := range tests {
		raws = append(raws, eml(tt.from, "sales@example.com", tt.name, "hello"))
	}
	posts := postThroughDovecot(t, raws...)
	for i, tt := range tests {
		text, _, _ := strings.Cut(posts[i], "\n[") // the text fallback, without the blocks JSON
		if !strings.Contains(text, tt.want) || strings.Contains(text, tt.not) {
			t.Errorf("%s: post text\n%s\nwant %q and not %q", tt.name, text, tt.want, tt.not)
		}
	}
}

// TestDovecotInternalRuleNeedsEvidence: the internal-sender rule fires only
// on the receiving server's Authentication-Results, and the post says on
// what evidence; a forged From (alone, first of several, or with a
// verdict from another server) is judged like any external mail.
func TestDovecotInternalRuleNeedsEvidence(t *testing.T) {
	tests := []struct {
		name, from string
		headers    []string
		want       string // "" = no internal rule in the post
	}{
		{"dmarc pass from our server", "colleague@example.com", []string{arPass},
			"internal sender (example.com; dkim=pass header.d=example.com per mx.example.com)"},
		{"From header alone", "colleague@example.com", nil, ""},
		{"internal address first of several", "colleague@example.com, eve@evil.test",
			[]string{"Authentication-Results: mx.example.com; dmarc=pass header.from=example.com"}, ""},
		{"verdict from another server", "colleague@example.com",
			[]string{"Authentication-Results: mx.evil.test; dmarc=pass header.from=example.com"}, ""},
		{"dkim of the sender's own domain", "colleague@example.com",
			[]string{"Authentication-Results: mx.example.com; dkim=pass header.d=evil.test; dmarc=fail header.from=example.com"}, ""},
	}
	var raws []string
	for _, tt := range tests {
		raws = append(raws, eml(tt.from, "sales@example.com", tt.name, "hello", tt.headers...))
	}
	posts := postThroughDovecot(t, raws...)
	for i, tt := range tests {
		text, _, _ := strings.Cut(posts[i], "\n[")
		if tt.want == "" {
			if strings.Contains(text, "internal sender") || strings.Contains(text, "Importance: 1") {
				t.Errorf("%s: the internal rule fired on a forgeable From:\n%s", tt.name, text)
			}
			continue
		}
		if !strings.Contains(text, tt.want) {
			t.Errorf("%s: post text\n%s\nwant the rule with its evidence %q", tt.name, text, tt.want)
		}
	}
}
