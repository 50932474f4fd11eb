package sink

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-telegram/bot"

	"gpuhost/internal/pairing"
	"gpuhost/internal/telegramtest"
	"gpuhost/internal/testkit"
)

// Paired users of the tests (private chats: chat id = user id).
const (
	alice int64 = 1001
	bob   int64 = 1002
)

// pair puts users on the allowlist of stateDir the way an operator does:
// the user messages the bot (Request), the operator approves the code.
func pair(t *testing.T, stateDir string, users ...int64) *pairing.Store {
	t.Helper()
	st := pairing.New(stateDir)
	for _, u := range users {
		out, err := st.Request(pairing.Sender{UserID: u, ChatID: u, Username: "u"})
		if err != nil {
			t.Fatalf("pairing request of %d: %v", u, err)
		}
		if _, err := st.Approve(out.Code); err != nil {
			t.Fatalf("approve %d: %v", u, err)
		}
	}
	return st
}

func newTelegramSink(t *testing.T, f *telegramtest.Fake, stateDir string, edit func(*TelegramOptions)) (*Telegram, *testkit.SyncBuffer) {
	t.Helper()
	var logs testkit.SyncBuffer
	o := TelegramOptions{
		Token:       func() (string, error) { return telegramtest.DefaultToken, nil },
		TokenSource: "environment variable GPUHOST_TELEGRAM_TOKEN",
		APIURL:      f.URL(),
		StateDir:    stateDir,
		Timeout:     30 * time.Second,
		Log:         testLogger(&logs),
	}
	if edit != nil {
		edit(&o)
	}
	tg, err := NewTelegram(o)
	if err != nil {
		t.Fatalf("NewTelegram: %v", err)
	}
	return tg, &logs
}

func TestNewTelegramOptions(t *testing.T) {
	tok := func() (string, error) { return "1:x", nil }
	tests := []struct {
		name    string
		o       TelegramOptions
		wantErr string
		wantURL string
	}{
		{"no token", TelegramOptions{StateDir: "/x"}, "no token source", ""},
		{"no state dir", TelegramOptions{Token: tok}, "no state directory", ""},
		{"bad URL", TelegramOptions{Token: tok, StateDir: "/x", APIURL: "api.telegram.org"}, "not an http(s) URL", ""},
		{"default URL", TelegramOptions{Token: tok, StateDir: "/x"}, "", DefaultTelegramAPIURL},
		{"trailing slash dropped", TelegramOptions{Token: tok, StateDir: "/x", APIURL: "http://127.0.0.1:1/"}, "", "http://127.0.0.1:1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tg, err := NewTelegram(tc.o)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("NewTelegram: %v", err)
			}
			if tg.apiURL != tc.wantURL {
				t.Errorf("apiURL = %q, want %q", tg.apiURL, tc.wantURL)
			}
		})
	}
}

func TestTelegramPost(t *testing.T) {
	tests := []struct {
		name          string
		users         []int64
		revoke        []int64
		importantOnly bool
		important     bool
		wantChats     []int64
	}{
		{"two users, two sends", []int64{alice, bob}, nil, false, false, []int64{alice, bob}},
		{"nobody paired: no send, no error", nil, nil, false, false, nil},
		{"revoked user not sent", []int64{alice, bob}, []int64{alice}, false, false, []int64{bob}},
		{"all revoked", []int64{alice}, []int64{alice}, false, false, nil},
		{"important only, not important: nothing", []int64{alice}, nil, true, false, nil},
		{"important only, important: sent", []int64{alice}, nil, true, true, []int64{alice}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := telegramtest.New(t)
			dir := t.TempDir()
			st := pair(t, dir, tc.users...)
			tg, logs := newTelegramSink(t, f, dir, func(o *TelegramOptions) { o.ImportantOnly = tc.importantOnly })
			for _, u := range tc.revoke {
				if _, err := st.Revoke(u); err != nil {
					t.Fatalf("revoke %d: %v", u, err)
				}
			}
			p := samplePost()
			p.Important = tc.important
			p.Subject = "<b>not bold</b> *x*"
			if err := tg.Post(testCtx(t), p); err != nil {
				t.Fatalf("Post: %v", err)
			}
			sent := f.Sent()
			var chats []int64
			for _, s := range sent {
				chats = append(chats, s.ChatID)
				if s.Text != Text(p) {
					t.Errorf("chat %d got %q, want Text(p)", s.ChatID, s.Text)
				}
				if s.ParseMode != "" {
					t.Errorf("chat %d: parse_mode %q, want plain text", s.ChatID, s.ParseMode)
				}
				if !s.LinkPreviewDisabled {
					t.Errorf("chat %d: link preview on (a preview fetch could unsubscribe)", s.ChatID)
				}
			}
			if !equalIDs(chats, tc.wantChats) {
				t.Errorf("sent to %v, want %v", chats, tc.wantChats)
			}
			if len(tc.users) == len(tc.revoke) && !tc.importantOnly && !strings.Contains(logs.String(), "no Telegram user is paired") {
				t.Errorf("nobody paired, but no log line says so:\n%s", logs)
			}
		})
	}
}

func equalIDs(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestTelegramRevokeTakesEffectAtOnce: the allowlist is read per post.
func TestTelegramRevokeTakesEffectAtOnce(t *testing.T) {
	f := telegramtest.New(t)
	dir := t.TempDir()
	st := pair(t, dir, alice, bob)
	tg, _ := newTelegramSink(t, f, dir, nil)
	ctx := testCtx(t)
	p := samplePost()
	if err := tg.Post(ctx, p); err != nil {
		t.Fatalf("first Post: %v", err)
	}
	if _, err := st.Revoke(bob); err != nil {
		t.Fatalf("revoke: %v", err)
	}
	p.Key = "INBOX/1700000000/43"
	if err := tg.Post(ctx, p); err != nil {
		t.Fatalf("second Post: %v", err)
	}
	if got := len(f.SentTo(alice)); got != 2 {
		t.Errorf("alice got %d posts, want 2", got)
	}
	if got := len(f.SentTo(bob)); got != 1 {
		t.Errorf("bob got %d posts after being revoked before the second, want 1", got)
	}
}

func TestTelegramErrors(t *testing.T) {
	tests := []struct {
		name   string
		setup  func(f *telegramtest.Fake, o *TelegramOptions, dir string)
		want   []string
		sends  int // sendMessage calls expected
		errIs  error
		noSend bool
	}{
		{
			name:  "token refused",
			setup: func(f *telegramtest.Fake, _ *TelegramOptions, _ string) { f.SetToken("9999:AAOtherSecretValue_xyz") },
			want:  []string{"chat 1001", "Unauthorized", "Telegram refuses the bot token (environment variable GPUHOST_TELEGRAM_TOKEN)"},
			sends: 1, // a refused token is refused for every chat: stop
			errIs: bot.ErrorUnauthorized,
		},
		{
			name: "token missing: no call",
			setup: func(_ *telegramtest.Fake, o *TelegramOptions, _ string) {
				o.Token = func() (string, error) {
					return "", errors.New("environment variable GPUHOST_TELEGRAM_TOKEN is not set")
				}
			},
			want: []string{"read the bot token", "GPUHOST_TELEGRAM_TOKEN is not set"},
		},
		{
			name: "token malformed: no call",
			setup: func(_ *telegramtest.Fake, o *TelegramOptions, _ string) {
				o.Token = func() (string, error) { return "4242:AAsecret/../../evil?x=1", nil }
			},
			want: []string{"malformed", "GPUHOST_TELEGRAM_TOKEN"},
		},
		{
			name: "server error names the chat",
			setup: func(f *telegramtest.Fake, _ *TelegramOptions, _ string) {
				f.FailNext("", 1, telegramtest.Failure{Code: 500, Description: "Internal Server Error"})
			},
			want:  []string{"chat 1001", "500 Internal Server Error"},
			sends: 2,
		},
		{
			name:  "rate limited twice",
			setup: func(f *telegramtest.Fake, _ *TelegramOptions, _ string) { f.RateLimitNext("", 2, time.Second) },
			want:  []string{"chat 1001", "Too Many Requests"},
			sends: 3, // alice: 429, 429; bob: ok
		},
		{
			name: "corrupt allowlist: fail closed",
			setup: func(_ *telegramtest.Fake, _ *TelegramOptions, dir string) {
				if err := os.WriteFile(filepath.Join(dir, "telegram", pairing.AllowlistFile), []byte("{not json"), 0o600); err != nil {
					t.Fatal(err)
				}
			},
			want: []string{"not sent", "allowlist.json"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := telegramtest.New(t)
			dir := t.TempDir()
			pair(t, dir, alice, bob)
			tg, logs := newTelegramSink(t, f, dir, func(o *TelegramOptions) { tc.setup(f, o, dir) })
			err := tg.Post(testCtx(t), samplePost())
			if err == nil {
				t.Fatal("Post succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			for _, tok := range []string{telegramtest.DefaultToken, "AAsecret/../../evil", "AAOtherSecretValue_xyz"} {
				noSecret(t, err, tok)
				if _, secret, _ := strings.Cut(tok, ":"); strings.Contains(logs.String(), tok) || (secret != "" && strings.Contains(logs.String(), secret)) {
					t.Errorf("log contains the token:\n%s", logs)
				}
			}
			if got := f.Calls("sendMessage"); got != tc.sends {
				t.Errorf("%d sendMessage calls, want %d", got, tc.sends)
			}
			if tc.errIs != nil && !errors.Is(err, tc.errIs) {
				t.Errorf("errors.Is(err, %v) = false for %v", tc.errIs, err)
			}
		})
	}
}

// TestTelegramRetryDoesNotRepeat: a post that failed for one chat is, on
// retry, sent only to that chat.
func TestTelegramRetryDoesNotRepeat(t *testing.T) {
	f := telegramtest.New(t)
	dir := t.TempDir()
	pair(t, dir, alice, bob)
	tg, _ := newTelegramSink(t, f, dir, nil)
	ctx := testCtx(t)
	p := samplePost()
	f.FailNext("", 1, telegramtest.Failure{Code: 502, Description: "Bad Gateway"}) // alice's send
	err := tg.Post(ctx, p)
	if err == nil || !strings.Contains(err.Error(), "chat 1001") || strings.Contains(err.Error(), "chat 1002") {
		t.Fatalf("err = %v, want a failure naming chat 1001 only", err)
	}
	if err := tg.Post(ctx, p); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if a, b := len(f.SentTo(alice)), len(f.SentTo(bob)); a != 1 || b != 1 {
		t.Errorf("alice got %d, bob %d posts; want 1 each", a, b)
	}
	// Delivered in full: the memory is gone, a new Post of the key sends again.
	if err := tg.Post(ctx, p); err != nil {
		t.Fatalf("third Post: %v", err)
	}
	if a := len(f.SentTo(alice)); a != 2 {
		t.Errorf("alice got %d posts after a fresh Post, want 2", a)
	}
}

// TestTelegramBlockedChatSkipped: a chat that cannot receive (the user
// blocked the bot) is logged with its id and does not fail the post.
func TestTelegramBlockedChatSkipped(t *testing.T) {
	f := telegramtest.New(t)
	dir := t.TempDir()
	pair(t, dir, alice, bob)
	tg, logs := newTelegramSink(t, f, dir, nil)
	f.Block(alice)
	if err := tg.Post(testCtx(t), samplePost()); err != nil {
		t.Fatalf("Post: %v", err)
	}
	if got := len(f.SentTo(bob)); got != 1 {
		t.Errorf("bob got %d posts, want 1", got)
	}
	l := logs.String()
	if !strings.Contains(l, "chat_id=1001") || !strings.Contains(l, "blocked by the user") {
		t.Errorf("log lacks the blocked chat:\n%s", l)
	}
	if _, secret, _ := strings.Cut(telegramtest.DefaultToken, ":"); strings.Contains(l, secret) {
		t.Errorf("log contains the token:\n%s", l)
	}
}

func TestTelegramRateLimitRetried(t *testing.T) {
	f := telegramtest.New(t)
	dir := t.TempDir()
	pair(t, dir, alice)
	tg, _ := newTelegramSink(t, f, dir, nil)
	f.RateLimitNext("", 1, time.Second)
	if err := tg.Post(testCtx(t), samplePost()); err != nil {
		t.Fatalf("Post after one 429: %v", err)
	}
	if got, calls := len(f.SentTo(alice)), f.Calls("sendMessage"); got != 1 || calls != 2 {
		t.Errorf("alice got %d posts in %d calls, want 1 in 2", got, calls)
	}
}

// TestTelegramLongPostFits: a post with huge fields is accepted by the
// fake, which refuses texts over 4096 UTF-16 units as Telegram does.
func TestTelegramLongPostFits(t *testing.T) {
	f := telegramtest.New(t)
	dir := t.TempDir()
	pair(t, dir, alice)
	tg, _ := newTelegramSink(t, f, dir, nil)
	p := samplePost()
	p.Transcript = strings.Repeat("😀 ", 10000)
	p.Reasoning = strings.Repeat("x", 10000)
	if err := tg.Post(testCtx(t), p); err != nil {
		t.Fatalf("Post: %v", err)
	}
	if got := f.SentTo(alice); len(got) != 1 || !strings.HasSuffix(got[0], "key: "+p.Key) {
		t.Errorf("sent %d messages; want 1 ending with the key", len(got))
	}
}
