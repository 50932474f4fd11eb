package telegramtest

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-telegram/bot"
	"github.com/go-telegram/bot/models"
)

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func newBot(t *testing.T, f *Fake, token string) *bot.Bot {
	t.Helper()
	b, err := bot.New(token, bot.WithServerURL(f.URL()), bot.WithSkipGetMe())
	if err != nil {
		t.Fatalf("bot.New: %v", err)
	}
	return b
}

func TestGetMe(t *testing.T) {
	f := New(t)
	me, err := newBot(t, f, DefaultToken).GetMe(ctx(t))
	if err != nil || me.ID != BotUserID || me.Username != BotUsername || !me.IsBot {
		t.Fatalf("getMe = %+v, %v", me, err)
	}
	if _, err := newBot(t, f, "1:wrong").GetMe(ctx(t)); !errors.Is(err, bot.ErrorUnauthorized) {
		t.Errorf("wrong token: err = %v, want Unauthorized", err)
	}
}

func TestSendMessage(t *testing.T) {
	f := New(t)
	b := newBot(t, f, DefaultToken)
	off := true
	m, err := b.SendMessage(ctx(t), &bot.SendMessageParams{ChatID: int64(77), Text: "hi <b>",
		LinkPreviewOptions: &models.LinkPreviewOptions{IsDisabled: &off}})
	if err != nil || m.Chat.ID != 77 || m.Text != "hi <b>" || m.ID != 1 || m.From == nil || m.From.ID != BotUserID {
		t.Fatalf("sendMessage = %+v, %v", m, err)
	}
	if _, err := b.SendMessage(ctx(t), &bot.SendMessageParams{ChatID: int64(78), Text: "<b>x</b>", ParseMode: models.ParseModeHTML}); err != nil {
		t.Fatal(err)
	}
	want := []Sent{{ChatID: 77, Text: "hi <b>", LinkPreviewDisabled: true}, {ChatID: 78, Text: "<b>x</b>", ParseMode: "HTML"}}
	got := f.Sent()
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("Sent = %+v, want %+v", got, want)
	}
	if s := f.SentTo(77); len(s) != 1 || s[0] != "hi <b>" {
		t.Errorf("SentTo(77) = %q", s)
	}
	if f.Calls("sendMessage") != 2 {
		t.Errorf("Calls = %d", f.Calls("sendMessage"))
	}
}

func TestSendMessageRefused(t *testing.T) {
	tests := []struct {
		name   string
		setup  func(f *Fake)
		token  string
		chat   int64
		text   string
		is     error
		wantIn string
	}{
		{"wrong token", nil, "1:AAwrong", 77, "x", bot.ErrorUnauthorized, "Unauthorized"},
		{"empty text", nil, DefaultToken, 77, "", bot.ErrorBadRequest, "message text is empty"},
		{"too long", nil, DefaultToken, 77, strings.Repeat("😀", 2049), bot.ErrorBadRequest, "message is too long"},
		{"blocked", func(f *Fake) { f.Block(77) }, DefaultToken, 77, "x", bot.ErrorForbidden, "blocked by the user"},
		{"injected", func(f *Fake) { f.FailNext(1, 400, "Bad Request: chat not found") }, DefaultToken, 77, "x", bot.ErrorBadRequest, "chat not found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := New(t)
			if tc.setup != nil {
				tc.setup(f)
			}
			_, err := newBot(t, f, tc.token).SendMessage(ctx(t), &bot.SendMessageParams{ChatID: tc.chat, Text: tc.text})
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.wantIn) {
				t.Fatalf("err = %v, want %v with %q", err, tc.is, tc.wantIn)
			}
			if n := len(f.Sent()); n != 0 {
				t.Errorf("%d messages recorded", n)
			}
		})
	}
}

func TestRateLimit(t *testing.T) {
	f := New(t)
	f.RateLimitNext(1, 1500*time.Millisecond)
	b := newBot(t, f, DefaultToken)
	_, err := b.SendMessage(ctx(t), &bot.SendMessageParams{ChatID: int64(1), Text: "x"})
	var tm *bot.TooManyRequestsError
	if !errors.As(err, &tm) || tm.RetryAfter != 2 {
		t.Fatalf("err = %v, want 429 with retry_after 2", err)
	}
	if _, err := b.SendMessage(ctx(t), &bot.SendMessageParams{ChatID: int64(1), Text: "x"}); err != nil {
		t.Fatalf("second send: %v", err)
	}
}

// TestOtherEncodings: form-encoded and JSON bodies, as other clients send.
func TestOtherEncodings(t *testing.T) {
	f := New(t)
	post := func(contentType, body string) map[string]any {
		req, _ := http.NewRequestWithContext(ctx(t), http.MethodPost, f.URL()+"/bot"+DefaultToken+"/sendMessage", strings.NewReader(body))
		req.Header.Set("Content-Type", contentType)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		var out map[string]any
		if err := json.Unmarshal(data, &out); err != nil {
			t.Fatalf("not JSON: %q", data)
		}
		return out
	}
	if out := post("application/x-www-form-urlencoded", url.Values{"chat_id": {"5"}, "text": {"form"}}.Encode()); out["ok"] != true {
		t.Errorf("form: %v", out)
	}
	if out := post("application/json", `{"chat_id":6,"text":"json","link_preview_options":{"is_disabled":true}}`); out["ok"] != true {
		t.Errorf("json: %v", out)
	}
	if out := post("application/json", `{"chat_id":"@name","text":"x"}`); out["ok"] != false || out["error_code"] != float64(400) {
		t.Errorf("username chat: %v", out)
	}
	got := f.Sent()
	if len(got) != 2 || got[0] != (Sent{ChatID: 5, Text: "form"}) || got[1] != (Sent{ChatID: 6, Text: "json", LinkPreviewDisabled: true}) {
		t.Errorf("Sent = %+v", got)
	}
}
