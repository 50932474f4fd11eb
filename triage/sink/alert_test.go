package sink

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/go-telegram/bot"

	"gpuhost/internal/pairing"
	"gpuhost/internal/telegramtest"
	"gpuhost/triage/sink/slacktest"
)

const sampleAlert = "triage: mail from imap://u@127.0.0.1:143/INBOX is not being processed — 3 polls in a row failed since 2026-11-30T08:00:00Z. Last error: dial tcp: connection refused"

func TestSlackAlert(t *testing.T) {
	long := "triage: " + strings.Repeat("ü<", 5000)
	tests := []struct {
		name          string
		importantChan string
		text          string
		want          string // the text both channels get
		wantImportant bool
	}{
		{"both channels", importantChan, sampleAlert, sampleAlert, true},
		{"no important channel", "", sampleAlert, sampleAlert, false},
		{"important channel equals main: once", mainChan, sampleAlert, sampleAlert, false},
		{"escaped, one line, cleaned", importantChan,
			"triage: <!channel> & co\r\nkey: INBOX/1/4\x1b[31m\u202eevil\tend",
			"triage: &lt;!channel&gt; &amp; co key: INBOX/1/4 [31mevil end", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := slacktest.New(t)
			s, _ := newSlackSink(t, f, func(o *SlackOptions) { o.ImportantChannel = tc.importantChan })
			if err := s.Alert(testCtx(t), tc.text); err != nil {
				t.Fatalf("Alert: %v", err)
			}
			main := f.Messages(mainChan)
			if len(main) != 1 || main[0].Text != tc.want {
				t.Fatalf("main channel = %+v, want one message %q", main, tc.want)
			}
			if main[0].Metadata != nil || main[0].Blocks != nil {
				t.Errorf("alert carries metadata %+v or blocks %s; it must never look like a post", main[0].Metadata, main[0].Blocks)
			}
			imp := f.Messages(importantChan)
			switch {
			case tc.wantImportant && (len(imp) != 1 || imp[0].Text != tc.want):
				t.Errorf("important channel = %+v, want the alert", imp)
			case !tc.wantImportant && tc.importantChan != mainChan && len(imp) != 0:
				t.Errorf("important channel got %d messages, want none", len(imp))
			}
		})
	}

	t.Run("long text is clipped", func(t *testing.T) {
		f := slacktest.New(t)
		s, _ := newSlackSink(t, f, nil)
		if err := s.Alert(testCtx(t), long); err != nil {
			t.Fatalf("Alert: %v", err)
		}
		m := f.Messages(mainChan)[0]
		if n := utf16Len(m.Text); n > SlackTextLimit || !strings.HasSuffix(m.Text, "…") || !strings.HasPrefix(m.Text, "triage: ü&lt;") {
			t.Errorf("clipped alert has %d units (limit %d): %.80q…", n, SlackTextLimit, m.Text)
		}
		if strings.Contains(m.Text, "<") || strings.HasSuffix(strings.TrimSuffix(m.Text, "…"), "&l") {
			t.Errorf("clip left an unescaped or half entity: …%q", m.Text[len(m.Text)-20:])
		}
	})

	t.Run("an alert is never taken for a post", func(t *testing.T) {
		f := slacktest.New(t)
		s, _ := newSlackSink(t, f, nil)
		if err := s.Alert(testCtx(t), "triage: failed\nkey: INBOX/1/4"); err != nil {
			t.Fatalf("Alert: %v", err)
		}
		if ok, err := s.Posted(testCtx(t), "INBOX/1/4"); err != nil || ok {
			t.Errorf("Posted after an alert naming the key = %v, %v; want false", ok, err)
		}
	})
}

// TestSlackAlertParams: mrkdwn and unfurling off, plain text only.
func TestSlackAlertParams(t *testing.T) {
	f := slacktest.New(t)
	var seen []string
	var mu sync.Mutex
	s, _ := newSlackSink(t, f, func(o *SlackOptions) {
		o.HTTPClient = recordingClient(func(form string) { mu.Lock(); seen = append(seen, form); mu.Unlock() })
	})
	if err := s.Alert(testCtx(t), sampleAlert); err != nil {
		t.Fatalf("Alert: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 {
		t.Fatalf("%d requests, want 2 (main and important channel)", len(seen))
	}
	for i, ch := range []string{mainChan, importantChan} {
		for _, want := range []string{"unfurl_links=false", "unfurl_media=false", "mrkdwn=false", "channel=" + ch} {
			if !strings.Contains(seen[i], want) {
				t.Errorf("request %d lacks %s: %s", i, want, seen[i])
			}
		}
		for _, unwanted := range []string{"blocks=", "metadata="} {
			if strings.Contains(seen[i], unwanted) {
				t.Errorf("request %d has %s: %s", i, unwanted, seen[i])
			}
		}
	}
}

func TestSlackAlertErrors(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(f *slacktest.Fake, o *SlackOptions)
		text    string
		wantErr []string // empty: Alert succeeds
		posts   int      // chat.postMessage calls
		stored  []string // channels that hold the alert afterwards
		log     string   // in the log
	}{
		{
			name:    "token refused: both channels tried, error without the token",
			setup:   func(f *slacktest.Fake, _ *SlackOptions) { f.SetToken("xoxb-the-right-one") },
			wantErr: []string{"post an alert to channel " + mainChan, "channel " + importantChan, "invalid_auth", "Slack refuses the bot token (environment variable SLACK_BOT_TOKEN)"},
			posts:   2,
		},
		{
			name: "token missing: no call",
			setup: func(_ *slacktest.Fake, o *SlackOptions) {
				o.Token = func() (string, error) { return "", errors.New("environment variable SLACK_BOT_TOKEN is not set") }
			},
			wantErr: []string{"read the bot token", "SLACK_BOT_TOKEN is not set"},
		},
		{
			name:    "empty text: no call",
			text:    " \r\n\x00\t",
			wantErr: []string{"alert text is empty"},
		},
		{
			name:   "main channel gone: the important channel still gets it",
			setup:  func(f *slacktest.Fake, _ *SlackOptions) { f.SetChannels(importantChan) },
			posts:  2,
			stored: []string{importantChan},
			log:    "the alert reached only some channels",
		},
		{
			name:   "rate limited once: retried",
			setup:  func(f *slacktest.Fake, _ *SlackOptions) { f.RateLimitNext(1, time.Second) },
			posts:  3,
			stored: []string{mainChan, importantChan},
			log:    "slack rate limit; retrying once",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := slacktest.New(t)
			s, logs := newSlackSink(t, f, func(o *SlackOptions) {
				if tc.setup != nil {
					tc.setup(f, o)
				}
			})
			text := tc.text
			if text == "" {
				text = sampleAlert
			}
			err := s.Alert(testCtx(t), text)
			if len(tc.wantErr) == 0 && err != nil {
				t.Fatalf("Alert: %v", err)
			}
			if len(tc.wantErr) > 0 && err == nil {
				t.Fatal("Alert succeeded")
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			noSecret(t, err, slacktest.DefaultToken)
			noSecret(t, err, "xoxb-the-right-one")
			if strings.Contains(logs.String(), slacktest.DefaultToken) {
				t.Errorf("log contains the token:\n%s", logs)
			}
			if got := f.PostCalls(); got != tc.posts {
				t.Errorf("%d chat.postMessage calls, want %d", got, tc.posts)
			}
			var stored []string
			for _, ch := range []string{mainChan, importantChan} {
				for range f.Messages(ch) {
					stored = append(stored, ch)
				}
			}
			if strings.Join(stored, ",") != strings.Join(tc.stored, ",") {
				t.Errorf("alert stored in %v, want %v", stored, tc.stored)
			}
			if tc.log != "" && !strings.Contains(logs.String(), tc.log) {
				t.Errorf("log lacks %q:\n%s", tc.log, logs)
			}
		})
	}
}

func TestTelegramAlert(t *testing.T) {
	f := telegramtest.New(t)
	dir := t.TempDir()
	pair(t, dir, alice, bob)
	// ImportantOnly limits posts, never alerts.
	tg, _ := newTelegramSink(t, f, dir, func(o *TelegramOptions) { o.ImportantOnly = true })
	ctx := testCtx(t)
	if err := tg.Post(ctx, samplePost()); err != nil || len(f.Sent()) != 0 {
		t.Fatalf("unimportant post with ImportantOnly: err %v, %d sent", err, len(f.Sent()))
	}
	in := "triage: <b>down</b>\r\nsince\x1b[2J now\u202e"
	if err := tg.Alert(ctx, in); err != nil {
		t.Fatalf("Alert: %v", err)
	}
	const want = "triage: <b>down</b> since [2J now"
	for _, chat := range []int64{alice, bob} {
		if got := f.SentTo(chat); len(got) != 1 || got[0] != want {
			t.Errorf("chat %d got %q, want [%q]", chat, got, want)
		}
	}
	for _, s := range f.Sent() {
		if s.ParseMode != "" || !s.LinkPreviewDisabled {
			t.Errorf("alert sent with parse mode %q, link preview disabled %v", s.ParseMode, s.LinkPreviewDisabled)
		}
	}

	// The fake refuses texts over 4096 UTF-16 units, as Telegram does.
	long := strings.Repeat("😀", 3000) // 6000 units
	if err := tg.Alert(ctx, long); err != nil {
		t.Fatalf("long alert: %v", err)
	}
	got := f.SentTo(alice)
	if n := utf16Len(got[len(got)-1]); n > TelegramMaxUnits || !strings.HasSuffix(got[len(got)-1], "…") {
		t.Errorf("long alert is %d units, want at most %d ending in …", n, TelegramMaxUnits)
	}
}

func TestTelegramAlertNobodyPaired(t *testing.T) {
	f := telegramtest.New(t)
	tg, logs := newTelegramSink(t, f, t.TempDir(), nil)
	if err := tg.Alert(testCtx(t), sampleAlert); err != nil {
		t.Fatalf("Alert with nobody paired: %v", err)
	}
	if n := f.Calls("sendMessage"); n != 0 {
		t.Errorf("%d sendMessage calls with nobody paired", n)
	}
	if !strings.Contains(logs.String(), "no Telegram user is paired; alert not sent") {
		t.Errorf("log lacks the reason:\n%s", logs)
	}
}

func TestTelegramAlertErrors(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(f *telegramtest.Fake, o *TelegramOptions, dir string)
		text    string
		wantErr []string // empty: Alert succeeds
		errIs   error
		sends   int     // sendMessage calls
		got     []int64 // chats that got the alert
		log     string
	}{
		{
			name:    "token refused: stop at the first chat",
			setup:   func(f *telegramtest.Fake, _ *TelegramOptions, _ string) { f.SetToken("9999:AAOtherSecretValue_xyz") },
			wantErr: []string{"send the alert to chat 1001", "Unauthorized", "Telegram refuses the bot token (environment variable GPUHOST_TELEGRAM_TOKEN)"},
			errIs:   bot.ErrorUnauthorized,
			sends:   1,
		},
		{
			name: "token malformed: no call",
			setup: func(_ *telegramtest.Fake, o *TelegramOptions, _ string) {
				o.Token = func() (string, error) { return "4242:AAsecret/../../evil?x=1", nil }
			},
			wantErr: []string{"malformed", "GPUHOST_TELEGRAM_TOKEN"},
		},
		{
			name: "corrupt allowlist: fail closed",
			setup: func(_ *telegramtest.Fake, _ *TelegramOptions, dir string) {
				if err := os.WriteFile(filepath.Join(dir, "telegram", pairing.AllowlistFile), []byte("{not json"), 0o600); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: []string{"alert not sent", "allowlist.json"},
		},
		{
			name:    "empty text: no call",
			text:    "\x00 \n",
			wantErr: []string{"alert text is empty"},
		},
		{
			name: "every chat blocked: error",
			setup: func(f *telegramtest.Fake, _ *TelegramOptions, _ string) {
				f.Block(alice)
				f.Block(bob)
			},
			wantErr: []string{"chat 1001", "chat 1002", "Forbidden"},
			errIs:   bot.ErrorForbidden,
			sends:   2,
		},
		{
			name: "one chat fails: the other got it, success",
			setup: func(f *telegramtest.Fake, _ *TelegramOptions, _ string) {
				f.FailNext("", 1, telegramtest.Failure{Code: 500, Description: "Internal Server Error"})
			},
			sends: 2,
			got:   []int64{bob},
			log:   "the alert reached only some chats",
		},
		{
			name:  "rate limited once: retried",
			setup: func(f *telegramtest.Fake, _ *TelegramOptions, _ string) { f.RateLimitNext("", 1, time.Second) },
			sends: 3,
			got:   []int64{alice, bob},
			log:   "telegram rate limit; retrying once",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := telegramtest.New(t)
			dir := t.TempDir()
			pair(t, dir, alice, bob)
			tg, logs := newTelegramSink(t, f, dir, func(o *TelegramOptions) {
				if tc.setup != nil {
					tc.setup(f, o, dir)
				}
			})
			text := tc.text
			if text == "" {
				text = sampleAlert
			}
			err := tg.Alert(testCtx(t), text)
			if len(tc.wantErr) == 0 && err != nil {
				t.Fatalf("Alert: %v", err)
			}
			if len(tc.wantErr) > 0 && err == nil {
				t.Fatal("Alert succeeded")
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if tc.errIs != nil && !errors.Is(err, tc.errIs) {
				t.Errorf("errors.Is(err, %v) = false for %v", tc.errIs, err)
			}
			for _, tok := range []string{telegramtest.DefaultToken, "AAsecret/../../evil", "AAOtherSecretValue_xyz"} {
				noSecret(t, err, tok)
				if _, secret, _ := strings.Cut(tok, ":"); strings.Contains(logs.String(), tok) || (secret != "" && strings.Contains(logs.String(), secret)) {
					t.Errorf("log contains the token:\n%s", logs)
				}
			}
			if n := f.Calls("sendMessage"); n != tc.sends {
				t.Errorf("%d sendMessage calls, want %d", n, tc.sends)
			}
			var got []int64
			for _, s := range f.Sent() {
				got = append(got, s.ChatID)
			}
			if !equalIDs(got, tc.got) {
				t.Errorf("alert reached %v, want %v", got, tc.got)
			}
			if tc.log != "" && !strings.Contains(logs.String(), tc.log) {
				t.Errorf("log lacks %q:\n%s", tc.log, logs)
			}
		})
	}
}

// FuzzAlertLine: whatever an error text holds, the alert is valid UTF-8,
// one line without control or bidi characters, within the limit, and for
// Slack without a raw '<' or '>'.
func FuzzAlertLine(f *testing.F) {
	for _, s := range []string{sampleAlert, "", "a\r\nb", "<!channel>&", "\x1b[2J\u202e", strings.Repeat("&", 5000), "\xff\xfe", strings.Repeat("😀", 2100)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		for _, c := range []struct {
			limit int
			esc   func(string) string
		}{{TelegramMaxUnits, func(s string) string { return s }}, {SlackTextLimit, EscapeMrkdwn}, {10, EscapeMrkdwn}} {
			out := alertLine(in, c.limit, c.esc)
			if !utf8.ValidString(out) || utf16Len(out) > c.limit {
				t.Fatalf("alertLine(%q, %d) = %q: invalid or too long", in, c.limit, out)
			}
			for _, r := range out {
				if unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) {
					t.Fatalf("alertLine(%q) kept %U", in, r)
				}
			}
			if c.limit != TelegramMaxUnits && strings.ContainsAny(out, "<>") {
				t.Fatalf("Slack alert %q has a raw < or >", out)
			}
		}
	})
}
