package sink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slack-go/slack"

	"gpuhost/internal/testkit"
	"gpuhost/triage/sink/slacktest"
)

const (
	mainChan      = "C0MAIN"
	importantChan = "C0IMPORTANT"
)

func testLogger(buf *testkit.SyncBuffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// newSlackSink returns a sink posting to the fake with the fake's token.
func newSlackSink(t *testing.T, f *slacktest.Fake, edit func(*SlackOptions)) (*Slack, *testkit.SyncBuffer) {
	t.Helper()
	var logs testkit.SyncBuffer
	o := SlackOptions{
		Token:            func() (string, error) { return slacktest.DefaultToken, nil },
		TokenSource:      "environment variable SLACK_BOT_TOKEN",
		APIURL:           f.URL(),
		Channel:          mainChan,
		ImportantChannel: importantChan,
		Timeout:          30 * time.Second,
		Log:              testLogger(&logs),
	}
	if edit != nil {
		edit(&o)
	}
	s, err := NewSlack(o)
	if err != nil {
		t.Fatalf("NewSlack: %v", err)
	}
	return s, &logs
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// noSecret fails when err's text holds the token or its secret half.
func noSecret(t *testing.T, err error, token string) {
	t.Helper()
	if err == nil {
		return
	}
	secrets := []string{token}
	if _, sec, ok := strings.Cut(token, ":"); ok {
		secrets = append(secrets, sec)
	}
	for _, s := range secrets {
		if strings.Contains(err.Error(), s) {
			t.Errorf("error contains the token: %v", err)
		}
	}
}

func TestNewSlackOptions(t *testing.T) {
	tok := func() (string, error) { return "x", nil }
	tests := []struct {
		name    string
		o       SlackOptions
		wantErr string
		wantURL string
	}{
		{"no token", SlackOptions{Channel: "C1"}, "no token source", ""},
		{"no channel", SlackOptions{Token: tok, Channel: "  "}, "no channel", ""},
		{"bad URL", SlackOptions{Token: tok, Channel: "C1", APIURL: "ftp://x/"}, `API URL "ftp://x/"`, ""},
		{"relative URL", SlackOptions{Token: tok, Channel: "C1", APIURL: "/api/"}, "not an http(s) URL", ""},
		{"default URL", SlackOptions{Token: tok, Channel: "C1"}, "", DefaultSlackAPIURL},
		{"slash added", SlackOptions{Token: tok, Channel: "C1", APIURL: "http://127.0.0.1:1/api"}, "", "http://127.0.0.1:1/api/"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := NewSlack(tc.o)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("NewSlack: %v", err)
			}
			if s.apiURL != tc.wantURL {
				t.Errorf("apiURL = %q, want %q", s.apiURL, tc.wantURL)
			}
		})
	}
}

func TestSlackPost(t *testing.T) {
	tests := []struct {
		name          string
		important     bool
		importantChan string
		wantMain      int
		wantImportant int
	}{
		{"not important: main only", false, importantChan, 1, 0},
		{"important: both channels", true, importantChan, 1, 1},
		{"important without important channel: main only", true, "", 1, 0},
		{"important channel equals main: once", true, mainChan, 1, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := slacktest.New(t)
			s, _ := newSlackSink(t, f, func(o *SlackOptions) { o.ImportantChannel = tc.importantChan })
			p := samplePost()
			p.Important = tc.important
			p.Subject = "<!channel> *bold*"
			if err := s.Post(testCtx(t), p); err != nil {
				t.Fatalf("Post: %v", err)
			}
			if got := f.CountKeyIn(mainChan, p.Key); got != tc.wantMain {
				t.Errorf("main channel has %d posts of the key, want %d", got, tc.wantMain)
			}
			if tc.importantChan != mainChan {
				if got := f.CountKeyIn(importantChan, p.Key); got != tc.wantImportant {
					t.Errorf("important channel has %d posts of the key, want %d", got, tc.wantImportant)
				}
			}
			msgs := f.Messages(mainChan)
			if len(msgs) != 1 {
				t.Fatalf("main channel has %d messages, want 1", len(msgs))
			}
			m := msgs[0]
			if m.Metadata == nil || m.Metadata.EventType != MetadataEventType || m.Key() != p.Key {
				t.Errorf("metadata = %+v, want event %s with key %s", m.Metadata, MetadataEventType, p.Key)
			}
			if imp, _ := m.Metadata.EventPayload["important"].(bool); imp != tc.important {
				t.Errorf("metadata important = %v, want %v", imp, tc.important)
			}
			if !strings.Contains(m.Text, "&lt;!channel&gt; *bold*") || strings.Contains(m.Text, "<!channel>") {
				t.Errorf("fallback text not escaped: %q", m.Text)
			}
			if !bytes.Contains(m.Blocks, []byte(`"key: `+p.Key+`"`)) {
				t.Errorf("blocks lack the key line: %s", m.Blocks)
			}
		})
	}
}

// TestSlackPostParams checks what goes over the wire besides the content:
// unfurling off (a preview fetch could unsubscribe), mrkdwn off for the
// fallback text.
func TestSlackPostParams(t *testing.T) {
	f := slacktest.New(t)
	var seen []string
	var mu sync.Mutex
	s, _ := newSlackSink(t, f, func(o *SlackOptions) {
		o.HTTPClient = recordingClient(func(form string) { mu.Lock(); seen = append(seen, form); mu.Unlock() })
	})
	if err := s.Post(testCtx(t), samplePost()); err != nil {
		t.Fatalf("Post: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 {
		t.Fatalf("%d requests, want 1", len(seen))
	}
	for _, want := range []string{"unfurl_links=false", "unfurl_media=false", "mrkdwn=false", "channel=" + mainChan} {
		if !strings.Contains(seen[0], want) {
			t.Errorf("request lacks %s: %s", want, seen[0])
		}
	}
}

func TestSlackPosted(t *testing.T) {
	f := slacktest.New(t)
	s, _ := newSlackSink(t, f, nil)
	ctx := testCtx(t)
	p := samplePost()
	p.Key = "INBOX/1/4"
	if ok, err := s.Posted(ctx, p.Key); err != nil || ok {
		t.Fatalf("Posted before Post = %v, %v; want false", ok, err)
	}
	if err := s.Post(ctx, p); err != nil {
		t.Fatalf("Post: %v", err)
	}
	tests := []struct {
		key  string
		want bool
	}{
		{"INBOX/1/4", true},
		{"INBOX/1/45", false}, // a longer key is not a match of a prefix
		{"INBOX/1/", false},
		{"Other/1/4", false},
	}
	for _, tc := range tests {
		if ok, err := s.Posted(ctx, tc.key); err != nil || ok != tc.want {
			t.Errorf("Posted(%q) = %v, %v; want %v", tc.key, ok, err, tc.want)
		}
	}
}

func TestSlackPostedPagination(t *testing.T) {
	f := slacktest.New(t)
	ctx := testCtx(t)
	s, _ := newSlackSink(t, f, nil)
	p := samplePost()
	if err := s.Post(ctx, p); err != nil {
		t.Fatalf("Post: %v", err)
	}
	// 150 newer messages push the post to the second page.
	for i := range 150 {
		f.Seed(mainChan, fmt.Sprintf("chatter %d", i), nil)
	}
	before := f.HistoryCalls()
	if ok, err := s.Posted(ctx, p.Key); err != nil || !ok {
		t.Fatalf("Posted = %v, %v; want true", ok, err)
	}
	if calls := f.HistoryCalls() - before; calls != 2 {
		t.Errorf("Posted made %d history calls, want 2 (pages of %d)", calls, historyPage)
	}

	// A key not there: Posted reads HistoryMessages (200) and stops.
	before = f.HistoryCalls()
	if ok, err := s.Posted(ctx, "INBOX/9/9"); err != nil || ok {
		t.Fatalf("Posted(missing) = %v, %v; want false", ok, err)
	}
	if calls := f.HistoryCalls() - before; calls != 2 {
		t.Errorf("Posted(missing) made %d history calls, want 2 (151 messages)", calls)
	}

	// Beyond the window: the limit is documented, not a surprise.
	short, _ := newSlackSink(t, f, func(o *SlackOptions) { o.HistoryMessages = 120 })
	if ok, err := short.Posted(ctx, p.Key); err != nil || ok {
		t.Errorf("Posted with a 120-message window = %v, %v; want false (the post is 151st)", ok, err)
	}
}

func TestSlackPostedByTextWithoutMetadata(t *testing.T) {
	f := slacktest.New(t)
	s, _ := newSlackSink(t, f, nil)
	f.Seed(mainChan, "📧 Hi\n\nkey: INBOX/7/9", nil)
	f.Seed(mainChan, "📧 Hi\n\nkey: Entw&amp;APw-rfe/7/9", nil)
	for _, key := range []string{"INBOX/7/9", "Entw&APw-rfe/7/9"} {
		if ok, err := s.Posted(testCtx(t), key); err != nil || !ok {
			t.Errorf("Posted(%q) = %v, %v; want true from the text line", key, ok, err)
		}
	}
}

// TestSlackCrashBetweenChannels: the main post went out, the important one
// did not (here the important channel is missing at first; a crash between
// the two posts leaves the same state). Posted sees the post as incomplete,
// and the following Post completes it without a second main post: in the
// same process, and in a fresh sink after a restart.
func TestSlackCrashBetweenChannels(t *testing.T) {
	f := slacktest.New(t)
	ctx := testCtx(t)
	first, _ := newSlackSink(t, f, nil)
	halfPost := func(key string) Post {
		t.Helper()
		p := samplePost()
		p.Key, p.Important = key, true
		f.SetChannels(mainChan)
		err := first.Post(ctx, p)
		f.SetChannels()
		if err == nil || !strings.Contains(err.Error(), "channel "+importantChan) || !strings.Contains(err.Error(), "channel_not_found") {
			t.Fatalf("Post with a missing important channel: err = %v, want channel_not_found naming %s", err, importantChan)
		}
		return p
	}
	complete := func(t *testing.T, s *Slack, p Post) {
		ok, err := s.Posted(ctx, p.Key)
		if err != nil || ok {
			t.Fatalf("Posted = %v, %v; want false (important copy missing)", ok, err)
		}
		if err := s.Post(ctx, p); err != nil {
			t.Fatalf("Post: %v", err)
		}
		if n := f.CountKeyIn(mainChan, p.Key); n != 1 {
			t.Errorf("main channel has %d posts of the key, want 1", n)
		}
		if n := f.CountKeyIn(importantChan, p.Key); n != 1 {
			t.Errorf("important channel has %d posts of the key, want 1", n)
		}
		if ok, err := s.Posted(ctx, p.Key); err != nil || !ok {
			t.Errorf("Posted after completion = %v, %v; want true", ok, err)
		}
	}
	t.Run("same process", func(t *testing.T) {
		complete(t, first, halfPost("INBOX/1/1"))
	})
	t.Run("after a restart", func(t *testing.T) {
		p := halfPost("INBOX/1/2")
		restarted, _ := newSlackSink(t, f, nil)
		complete(t, restarted, p)
	})
}

func TestSlackErrors(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(f *slacktest.Fake, o *SlackOptions)
		want    []string
		posts   int // chat.postMessage calls expected
		errorIs func(error) bool
	}{
		{
			name:  "invalid token",
			setup: func(f *slacktest.Fake, _ *SlackOptions) { f.SetToken("xoxb-the-right-one") },
			want:  []string{"invalid_auth", "Slack refuses the bot token (environment variable SLACK_BOT_TOKEN)", "channel " + mainChan},
			posts: 1,
			errorIs: func(err error) bool {
				var se slack.SlackErrorResponse
				return errors.As(err, &se) && se.Err == "invalid_auth"
			},
		},
		{
			name: "missing token: no call",
			setup: func(_ *slacktest.Fake, o *SlackOptions) {
				o.Token = func() (string, error) { return "", errors.New("environment variable SLACK_BOT_TOKEN is not set") }
			},
			want: []string{"read the bot token", "SLACK_BOT_TOKEN is not set"},
		},
		{
			name:  "empty token: no call",
			setup: func(_ *slacktest.Fake, o *SlackOptions) { o.Token = func() (string, error) { return " \n", nil } },
			want:  []string{"bot token is empty (environment variable SLACK_BOT_TOKEN)"},
		},
		{
			name:  "channel not found",
			setup: func(f *slacktest.Fake, _ *SlackOptions) { f.SetChannels("C0SOMETHINGELSE") },
			want:  []string{"channel " + mainChan, "channel_not_found", "invite the bot"},
			posts: 1,
		},
		{
			name:  "not in channel",
			setup: func(f *slacktest.Fake, _ *SlackOptions) { f.FailNext(1, "not_in_channel") },
			want:  []string{"not_in_channel", "invite the bot to the channel"},
			posts: 1,
		},
		{
			name:  "rate limited twice",
			setup: func(f *slacktest.Fake, _ *SlackOptions) { f.RateLimitNext(2, time.Second) },
			want:  []string{"rate limit"},
			posts: 2,
			errorIs: func(err error) bool {
				var rl *slack.RateLimitedError
				return errors.As(err, &rl)
			},
		},
		{
			name:  "Retry-After beyond the deadline: no wait, no retry",
			setup: func(f *slacktest.Fake, o *SlackOptions) { f.RateLimitNext(1, time.Hour) },
			want:  []string{"past the deadline"},
			posts: 1,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := slacktest.New(t)
			s, _ := newSlackSink(t, f, func(o *SlackOptions) { tc.setup(f, o) })
			err := s.Post(testCtx(t), samplePost())
			if err == nil {
				t.Fatal("Post succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			noSecret(t, err, slacktest.DefaultToken)
			noSecret(t, err, "xoxb-the-right-one")
			if got := f.PostCalls(); got != tc.posts {
				t.Errorf("%d chat.postMessage calls, want %d", got, tc.posts)
			}
			if tc.errorIs != nil && !tc.errorIs(err) {
				t.Errorf("errors.As does not see the typed error in %v", err)
			}
			if n := len(f.All()); n != 0 {
				t.Errorf("%d messages stored after a failed post", n)
			}
		})
	}
}

func TestSlackRateLimitRetried(t *testing.T) {
	f := slacktest.New(t)
	s, logs := newSlackSink(t, f, nil)
	ctx := testCtx(t)
	p := samplePost()
	f.RateLimitNext(1, time.Second)
	if err := s.Post(ctx, p); err != nil {
		t.Fatalf("Post after one 429: %v", err)
	}
	if got := f.PostCalls(); got != 2 {
		t.Errorf("%d chat.postMessage calls, want 2 (429, retry)", got)
	}
	if got := f.CountKey(p.Key); got != 1 {
		t.Errorf("%d posts of the key, want 1", got)
	}
	f.RateLimitNext(1, time.Second)
	if ok, err := s.Posted(ctx, p.Key); err != nil || !ok {
		t.Errorf("Posted after one 429 = %v, %v; want true", ok, err)
	}
	if !strings.Contains(logs.String(), "slack rate limit; retrying once") {
		t.Errorf("no rate-limit warning logged:\n%s", logs)
	}
}

func TestSlackRateLimitWaitEndsWithContext(t *testing.T) {
	f := slacktest.New(t)
	s, _ := newSlackSink(t, f, nil)
	f.RateLimitNext(1, 30*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.Post(ctx, samplePost()) }()
	// Cancel once the 429 was answered; Post must then return, not wait 30 s.
	deadline := time.Now().Add(30 * time.Second)
	for f.PostCalls() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-errc:
		if err == nil || !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want context.Canceled", err)
		}
	case <-time.After(25 * time.Second):
		t.Fatal("Post kept waiting for Retry-After after its context ended")
	}
	if n := f.PostCalls(); n != 1 {
		t.Errorf("%d chat.postMessage calls, want 1", n)
	}
}

// TestSlackTokenReadPerCall: a rotated token is used at the next call.
func TestSlackTokenReadPerCall(t *testing.T) {
	f := slacktest.New(t)
	var mu sync.Mutex
	token := "xoxb-old"
	s, _ := newSlackSink(t, f, func(o *SlackOptions) {
		o.Token = func() (string, error) { mu.Lock(); defer mu.Unlock(); return token, nil }
	})
	f.SetToken("xoxb-new")
	if err := s.Post(testCtx(t), samplePost()); err == nil {
		t.Fatal("Post with the old token succeeded")
	}
	mu.Lock()
	token = "xoxb-new"
	mu.Unlock()
	if err := s.Post(testCtx(t), samplePost()); err != nil {
		t.Fatalf("Post with the rotated token: %v", err)
	}
}

func TestScrub(t *testing.T) {
	const tok = "123456:AAsecretsecretsecret"
	inner := fmt.Errorf("Post \"http://x/bot%s/sendMessage\": %w", tok, context.DeadlineExceeded)
	err := scrub(fmt.Errorf("send: %w", inner), tok)
	if strings.Contains(err.Error(), "secretsecret") || !strings.Contains(err.Error(), "<redacted>") {
		t.Errorf("scrub left the token: %v", err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Error("errors.Is lost the sentinel")
	}
	if errors.Unwrap(err) != nil {
		t.Error("scrubbed error unwraps to the unredacted one")
	}
	if scrub(nil, tok) != nil {
		t.Error("scrub(nil) != nil")
	}
	if got := redact("a QUERY "+strings.ReplaceAll(tok, ":", "%3A"), tok); strings.Contains(got, "secretsecret") {
		t.Errorf("redact left the escaped token: %s", got)
	}
}

// recordingClient is an HTTP client that reports every request body it
// sends.
func recordingClient(report func(string)) *http.Client {
	return &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.Body != nil {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				return nil, err
			}
			report(string(body))
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		return http.DefaultTransport.RoundTrip(r)
	})}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
