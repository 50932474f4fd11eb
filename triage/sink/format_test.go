package sink

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/slack-go/slack"

	"gpuhost/triage/sink/slacktest"
)

// samplePost is a complete post; cases change what they test.
func samplePost() Post {
	return Post{
		Key:          "INBOX/1700000000/42",
		From:         "Alice Example <alice@example.com>",
		Subject:      "Invoice question",
		Class:        "customer",
		Real:         true,
		Importance:   6,
		Reasoning:    "Asks about an open invoice.",
		Transcript:   "Hello, this is Alice.",
		Unsubscribe:  "https://lists.example.com/unsub?u=1&l=2",
		OneClick:     true,
		CustomerName: "ACME GmbH",
		CustomerURL:  "https://crm.example.com/users/7",
		Cost:         "0.0021 USD · 412+38 tok · 1.9 Wh",
	}
}

// textObj is one text object of rendered blocks.
type textObj struct {
	Block string // block type
	Type  string // plain_text | mrkdwn
	Text  string
}

// blockTexts renders blocks to the JSON Slack gets and lists their text
// objects, so tests see exactly what is posted.
func blockTexts(t testing.TB, blocks []slack.Block) []textObj {
	t.Helper()
	raw, err := json.Marshal(blocks)
	if err != nil {
		t.Fatalf("marshal blocks: %v", err)
	}
	var bs []struct {
		Type     string          `json:"type"`
		Text     *textObj        `json:"text"`
		Fields   []textObj       `json:"fields"`
		Elements []textObj       `json:"elements"`
		Extra    json.RawMessage `json:"accessory"`
	}
	if err := json.Unmarshal(raw, &bs); err != nil {
		t.Fatalf("unmarshal blocks: %v", err)
	}
	var out []textObj
	for _, b := range bs {
		objs := append([]textObj(nil), b.Fields...)
		objs = append(objs, b.Elements...)
		if b.Text != nil {
			objs = append([]textObj{*b.Text}, objs...)
		}
		for _, o := range objs {
			o.Block = b.Type
			out = append(out, o)
		}
	}
	return out
}

func TestFormat(t *testing.T) {
	long := strings.Repeat("word ", 20000)
	tests := []struct {
		name string
		edit func(*Post)
		// text: substrings of Text; notText: must not appear.
		text, notText []string
		// slackText: substrings of the Slack fallback text.
		slackText, notSlackText []string
		// plainSlack: substrings of some plain_text object; mrkdwn: of some
		// mrkdwn object; notMrkdwn: of none.
		plainSlack, mrkdwn, notMrkdwn []string
		check                         func(t *testing.T, text, fallback string, objs []textObj)
	}{
		{
			name:       "complete post",
			text:       []string{"📧 Invoice question\n", "From: Alice Example <alice@example.com>\n", "Class: customer\n", "Real conversation: yes\n", "Importance: 6 (model)\n", "Customer: ACME GmbH — https://crm.example.com/users/7\n", "Unsubscribe: https://lists.example.com/unsub?u=1&l=2 (one-click)\n", "Reasoning:\nAsks about an open invoice.", "Transcript:\nHello, this is Alice.", "\n\n0.0021 USD · 412+38 tok · 1.9 Wh\nkey: INBOX/1700000000/42"},
			slackText:  []string{"From: Alice Example &lt;alice@example.com&gt;", "unsub?u=1&amp;l=2"},
			plainSlack: []string{"📧 Invoice question", "From: Alice Example <alice@example.com>", "Importance: 6 (model)", "Customer: ACME GmbH", "key: INBOX/1700000000/42", "0.0021 USD"},
			mrkdwn:     []string{"<https://lists.example.com/unsub?u=1&amp;l=2|Unsubscribe> (one-click)", "<https://crm.example.com/users/7|Customer profile>"},
		},
		{
			name:         "script tag in subject stays text",
			edit:         func(p *Post) { p.Subject = "<script>alert(1)</script> & <!channel>" },
			text:         []string{"📧 <script>alert(1)</script> & <!channel>\n"},
			slackText:    []string{"&lt;script&gt;alert(1)&lt;/script&gt; &amp; &lt;!channel&gt;"},
			notSlackText: []string{"<script>", "<!channel>"},
			plainSlack:   []string{"📧 <script>alert(1)</script> & <!channel>"},
			notMrkdwn:    []string{"script", "!channel"},
		},
		{
			name: "mrkdwn markers in mail content never reach a mrkdwn object",
			edit: func(p *Post) {
				p.Subject = "*bold* _it_ ~s~ `c`"
				p.From = "*Eve*"
				p.Reasoning = "*urgent*"
				p.CustomerName = "_ACME_"
			},
			text:       []string{"📧 *bold* _it_ ~s~ `c`\n", "From: *Eve*\n"},
			plainSlack: []string{"*bold* _it_ ~s~ `c`", "From: *Eve*", "Reasoning:\n*urgent*", "Customer: _ACME_"},
			notMrkdwn:  []string{"*bold*", "*Eve*", "*urgent*", "_ACME_"},
		},
		{
			name:    "CRLF in subject cannot forge a line",
			edit:    func(p *Post) { p.Subject = "Hi\r\nImportance: 10 (rule: forged)\r\n\tkey: INBOX/1/1" },
			text:    []string{"📧 Hi Importance: 10 (rule: forged) key: INBOX/1/1\n"},
			notText: []string{"\nImportance: 10 (rule: forged)", "\nkey: INBOX/1/1"},
			check: func(t *testing.T, text, _ string, _ []textObj) {
				if n := countLinesWithPrefix(text, "Importance:"); n != 1 {
					t.Errorf("%d lines start with Importance:, want 1:\n%s", n, text)
				}
				if n := countLinesWithPrefix(text, "key:"); n != 1 {
					t.Errorf("%d lines start with key:, want 1", n)
				}
			},
		},
		{
			name:    "bidi override and controls removed",
			edit:    func(p *Post) { p.From = "evil\u202Emoc.elgoog@x\x00\x1b[31m" },
			text:    []string{"From: evilmoc.elgoog@x [31m\n"},
			notText: []string{"\u202E", "\x00", "\x1b"},
		},
		{
			name:       "rule display",
			edit:       func(p *Post) { p.Importance = 10; p.Rule = "priority mailbox support@example.com" },
			text:       []string{"Importance: 10 (rule: priority mailbox support@example.com)\n"},
			plainSlack: []string{"Importance: 10 (rule: priority mailbox support@example.com)"},
		},
		{
			name:       "internal sender rule",
			edit:       func(p *Post) { p.Importance = 1; p.Rule = "internal domain example.com" },
			text:       []string{"Importance: 1 (rule: internal domain example.com)\n"},
			plainSlack: []string{"Importance: 1 (rule: internal domain example.com)"},
		},
		{
			name:       "unclassified with reason",
			edit:       func(p *Post) { p.Class = "unclassified"; p.Unclassified = "model timed out after 120s"; p.Real = false },
			text:       []string{"Class: unclassified: model timed out after 120s\n", "Real conversation: no\n"},
			plainSlack: []string{"Class: unclassified: model timed out after 120s"},
		},
		{
			name: "unclassified without reason",
			edit: func(p *Post) { p.Class = ""; p.Unclassified = "" },
			text: []string{"Class: unclassified\n"},
		},
		{
			name:       "missing transcript shows the note",
			edit:       func(p *Post) { p.Transcript = ""; p.TranscriptNote = "transcription failed: 413 file too large" },
			text:       []string{"\nTranscript: transcription failed: 413 file too large\n"},
			plainSlack: []string{"Transcript: transcription failed: 413 file too large"},
		},
		{
			name:    "no transcript and no note: no transcript line",
			edit:    func(p *Post) { p.Transcript = ""; p.TranscriptNote = "" },
			notText: []string{"Transcript"},
		},
		{
			name:      "unsubscribe without one-click, no customer",
			edit:      func(p *Post) { p.OneClick = false; p.CustomerName = ""; p.CustomerURL = "" },
			text:      []string{"Unsubscribe: https://lists.example.com/unsub?u=1&l=2\n"},
			notText:   []string{"one-click", "Customer"},
			mrkdwn:    []string{"|Unsubscribe>"},
			notMrkdwn: []string{"one-click", "Customer profile"},
		},
		{
			name:   "mailto unsubscribe is linked",
			edit:   func(p *Post) { p.Unsubscribe = "mailto:unsub@lists.example.com?subject=unsubscribe" },
			mrkdwn: []string{"<mailto:unsub@lists.example.com?subject=unsubscribe|Unsubscribe>"},
		},
		{
			name:       "javascript URL is not linked",
			edit:       func(p *Post) { p.Unsubscribe = "javascript:alert(1)"; p.CustomerURL = "" },
			notMrkdwn:  []string{"javascript"},
			plainSlack: []string{"Unsubscribe: javascript:alert(1) (one-click)"},
		},
		{
			name:      "pipe and brackets in a URL cannot break the link",
			edit:      func(p *Post) { p.Unsubscribe = "https://x.example/u?a=|b>c<d"; p.CustomerURL = "" },
			mrkdwn:    []string{"<https://x.example/u?a=%7Cb&gt;c&lt;d|Unsubscribe>"},
			notMrkdwn: []string{"a=|b"},
		},
		{
			name: "problems listed, bounded",
			edit: func(p *Post) {
				p.Problems = []string{"CRM lookup failed: timeout", "", "attachment too large\r\nline2"}
				for range 12 {
					p.Problems = append(p.Problems, "more")
				}
			},
			text:       []string{"\nProblems:\n- CRM lookup failed: timeout\n- attachment too large line2\n- more\n", "- … and 4 more\n"},
			plainSlack: []string{"Problems:\n• CRM lookup failed: timeout\n• attachment too large line2"},
		},
		{
			name: "empty post still formats",
			edit: func(p *Post) { *p = Post{} },
			text: []string{"📧 (no subject)\n", "From: (unknown sender)\n", "Importance: 0 (model)\n", "\n\nkey: -"},
		},
		{
			name: "important mark",
			edit: func(p *Post) { p.Important = true },
			text: []string{"❗ Invoice question\n"},
		},
		{
			name: "huge fields are clipped, key survives",
			edit: func(p *Post) {
				p.Subject, p.From, p.Reasoning, p.Transcript, p.TranscriptNote, p.Cost = long, long, long, long, long, long
				p.Problems = []string{long, long, long, long}
			},
			text: []string{"\nkey: INBOX/1700000000/42"},
			check: func(t *testing.T, text, _ string, objs []textObj) {
				if !strings.HasSuffix(text, "\nkey: INBOX/1700000000/42") {
					t.Errorf("text does not end with the key line:\n…%s", text[max(0, len(text)-200):])
				}
				for _, o := range objs {
					if o.Block == "header" && utf8.RuneCountInString(o.Text) > slackHeaderLimit {
						t.Errorf("header has %d characters", utf8.RuneCountInString(o.Text))
					}
				}
			},
		},
		{
			name: "astral characters count as two units",
			edit: func(p *Post) { p.Transcript = strings.Repeat("😀", 5000); p.Reasoning = strings.Repeat("😀", 5000) },
			check: func(t *testing.T, text, _ string, _ []textObj) {
				if n := utf8.RuneCountInString(text); n > TelegramMaxUnits/2+600 {
					t.Errorf("text has %d runes; astral characters were not counted as 2 units", n)
				}
			},
		},
		{
			name:      "entity is not cut in half by the fallback clip",
			edit:      func(p *Post) { p.Transcript = strings.Repeat("<&>", 3000); p.Reasoning = strings.Repeat("&", 3000) },
			slackText: []string{"\nkey: INBOX/1700000000/42"},
			check: func(t *testing.T, _, st string, _ []textObj) {
				body, _, _ := strings.Cut(st, "\n\n0.0021")
				if i := strings.LastIndexByte(body, '&'); i >= 0 && !strings.Contains(body[i:], ";") {
					t.Errorf("fallback text ends in a partial entity: …%q", body[max(0, len(body)-20):])
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := samplePost()
			if tc.edit != nil {
				tc.edit(&p)
			}
			text := Text(p)
			st := slackText(p)
			blocks := SlackBlocks(p)
			objs := blockTexts(t, blocks)
			checkLimits(t, p, text, st, blocks)
			for _, s := range tc.text {
				if !strings.Contains(text, s) {
					t.Errorf("text lacks %q:\n%s", s, text)
				}
			}
			for _, s := range tc.notText {
				if strings.Contains(text, s) {
					t.Errorf("text contains %q:\n%s", s, text)
				}
			}
			for _, s := range tc.slackText {
				if !strings.Contains(st, s) {
					t.Errorf("slack fallback lacks %q:\n%s", s, st)
				}
			}
			for _, s := range tc.notSlackText {
				if strings.Contains(st, s) {
					t.Errorf("slack fallback contains %q:\n%s", s, st)
				}
			}
			for _, s := range tc.plainSlack {
				if !hasObj(objs, "plain_text", s) {
					t.Errorf("no plain_text object contains %q: %+v", s, objs)
				}
			}
			for _, s := range tc.mrkdwn {
				if !hasObj(objs, "mrkdwn", s) {
					t.Errorf("no mrkdwn object contains %q: %+v", s, objs)
				}
			}
			for _, s := range tc.notMrkdwn {
				if hasObj(objs, "mrkdwn", s) {
					t.Errorf("a mrkdwn object contains %q: %+v", s, objs)
				}
			}
			if tc.check != nil {
				tc.check(t, text, st, objs)
			}
		})
	}
}

func hasObj(objs []textObj, typ, sub string) bool {
	for _, o := range objs {
		if o.Type == typ && strings.Contains(o.Text, sub) {
			return true
		}
	}
	return false
}

func countLinesWithPrefix(text, prefix string) int {
	n := 0
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

// checkLimits holds for every post: Telegram's and Slack's limits, valid
// UTF-8, blocks Slack accepts, and a post that Posted can find again.
func checkLimits(t *testing.T, p Post, text, st string, blocks []slack.Block) {
	t.Helper()
	if !utf8.ValidString(text) || !utf8.ValidString(st) {
		t.Fatalf("invalid UTF-8 in text or fallback")
	}
	if n := utf16Len(text); n > TelegramMaxUnits || n == 0 {
		t.Errorf("text has %d UTF-16 units (limit %d)", n, TelegramMaxUnits)
	}
	if n := utf16Len(st); n > SlackTextLimit {
		t.Errorf("slack fallback has %d units (limit %d)", n, SlackTextLimit)
	}
	if want := "\n" + keyPrefix + keyText(p.Key); !strings.HasSuffix(text, want) {
		t.Errorf("text does not end with %q", want)
	}
	raw, err := json.Marshal(blocks)
	if err != nil {
		t.Fatalf("marshal blocks: %v", err)
	}
	if err := slacktest.ValidateBlocks(string(raw)); err != nil {
		t.Errorf("Slack would refuse the blocks: %v", err)
	}
	// What conversations.history returns must be found by its key: by
	// metadata, and by the blocks alone.
	var m slack.Message
	if err := json.Unmarshal([]byte(`{"type":"message","blocks":`+string(raw)+`}`), &m); err != nil {
		t.Fatalf("decode blocks as a history message: %v", err)
	}
	if !hasKey(m, p.Key) {
		t.Errorf("hasKey does not find key %q in the blocks", p.Key)
	}
	m.Blocks = slack.Blocks{}
	m.Metadata = slackMetadata(p)
	if !hasKey(m, p.Key) {
		t.Errorf("hasKey does not find key %q in the metadata", p.Key)
	}
}

func TestHasKeyExact(t *testing.T) {
	tests := []struct {
		name string
		msg  slack.Message
		key  string
		want bool
	}{
		{"metadata", msgWith("", slackMetadata(Post{Key: "INBOX/1/45"})), "INBOX/1/45", true},
		{"metadata other key", msgWith("", slackMetadata(Post{Key: "INBOX/1/45"})), "INBOX/1/4", false},
		{"metadata other event type", msgWith("", slack.SlackMetadata{EventType: "other", EventPayload: map[string]any{"key": "INBOX/1/4"}}), "INBOX/1/4", false},
		{"text line", msgWith("hello\nkey: INBOX/1/4", slack.SlackMetadata{}), "INBOX/1/4", true},
		{"text line is a prefix of another key", msgWith("hello\nkey: INBOX/1/45", slack.SlackMetadata{}), "INBOX/1/4", false},
		{"escaped text line", msgWith("key: Entw&amp;APw-rfe/1/2", slack.SlackMetadata{}), "Entw&APw-rfe/1/2", true},
		{"key mentioned mid-line", msgWith("see key: INBOX/1/4", slack.SlackMetadata{}), "INBOX/1/4", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := hasKey(tc.msg, tc.key); got != tc.want {
				t.Errorf("hasKey = %v, want %v", got, tc.want)
			}
		})
	}
}

func msgWith(text string, md slack.SlackMetadata) slack.Message {
	var m slack.Message
	m.Text = text
	m.Metadata = md
	return m
}

func TestClipUnits(t *testing.T) {
	tests := []struct {
		in   string
		n    int
		want string
	}{
		{"hello", 5, "hello"},
		{"hello", 4, "hel…"},
		{"hello", 1, "…"},
		{"hello", 0, ""},
		{"😀😀😀", 6, "😀😀😀"},
		{"😀😀😀", 5, "😀😀…"},
		{"😀😀😀", 4, "😀…"},
		{"a😀", 2, "a…"},
	}
	for _, tc := range tests {
		if got := clipUnits(tc.in, tc.n); got != tc.want {
			t.Errorf("clipUnits(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

func TestClipEscaped(t *testing.T) {
	tests := []struct {
		in   string
		n    int
		want string
	}{
		{"a &amp; b", 20, "a &amp; b"},
		{"ab&amp;cd", 6, "ab…"},
		{"ab&amp;cd", 8, "ab&amp;…"},
		{"ab&lt;", 4, "ab…"},
	}
	for _, tc := range tests {
		if got := clipEscaped(tc.in, tc.n); got != tc.want {
			t.Errorf("clipEscaped(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

func FuzzFormat(f *testing.F) {
	f.Add("INBOX/1/2", "Alice <a@x>", "Hi", "customer", "", "reason", "transcript", "", "https://u.example/?a=1&b=2", "https://crm/1", "0.01 USD", "problem", "priority mailbox s@x", 7, true, true)
	f.Add("", "", "", "", "", "", "", "", "", "", "", "", "", 0, false, false)
	f.Add("Entw&APw-rfe/9/9", "*x*", "<script>\r\n", "unclassified", "timeout", "<!channel>", "😀\r\n\r\n\r\nx", "transcription failed: 413", "javascript:alert(1)", "mailto:u@x", "&&&", "\x00\u202e", "", -5, false, true)
	f.Add("k\nkey: other", strings.Repeat("&", 5000), strings.Repeat("😀", 3000), "c", "", strings.Repeat("<", 4000), strings.Repeat("x\n", 4000), "", "https://a.example/"+strings.Repeat("|&", 1000), "", strings.Repeat("&", 400), strings.Repeat("p", 400), strings.Repeat("r", 400), 10, true, false)
	f.Fuzz(func(t *testing.T, key, from, subject, class, unclassified, reasoning, transcript, note, unsub, custURL, cost, problem, rule string, importance int, important, oneClick bool) {
		p := Post{
			Key: key, Important: important, From: from, Subject: subject, Class: class, Unclassified: unclassified,
			Real: important, Importance: importance, Rule: rule, Reasoning: reasoning, Transcript: transcript,
			TranscriptNote: note, Unsubscribe: unsub, OneClick: oneClick, CustomerName: from, CustomerURL: custURL,
			Cost: cost, Problems: []string{problem, problem, reasoning},
		}
		text := Text(p)
		st := slackText(p)
		blocks := SlackBlocks(p)
		checkLimits(t, p, text, st, blocks)
		for _, o := range blockTexts(t, blocks) {
			if o.Type != "mrkdwn" {
				continue
			}
			// The only mrkdwn is the links line: nothing from the mail may
			// open a control sequence other than our <url|label>.
			rest := o.Text
			for rest != "" {
				i := strings.IndexByte(rest, '<')
				if i < 0 {
					break
				}
				end := strings.IndexByte(rest[i:], '>')
				if end < 0 {
					t.Fatalf("unclosed < in mrkdwn %q", o.Text)
				}
				link := rest[i+1 : i+end]
				target, label, ok := strings.Cut(link, "|")
				if !ok || (label != "Unsubscribe" && label != "Customer profile") || strings.ContainsAny(target, "<|") {
					t.Fatalf("unexpected control sequence <%s> in mrkdwn %q", link, o.Text)
				}
				rest = rest[i+end+1:]
			}
		}
	})
}
