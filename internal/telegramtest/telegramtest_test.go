package telegramtest

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-telegram/bot"
	"github.com/go-telegram/bot/models"

	"gpuhost/internal/testkit"
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
		{"injected", func(f *Fake) { f.FailNext("", 1, Failure{Code: 400, Description: "Bad Request: chat not found"}) }, DefaultToken, 77, "x", bot.ErrorBadRequest, "chat not found"},
		{"injected for sendMessage", func(f *Fake) { f.FailNext("sendMessage", 1, Failure{Code: 400, Description: "Bad Request: nope"}) }, DefaultToken, 77, "x", bot.ErrorBadRequest, "nope"},
		{"unknown chat", func(f *Fake) { f.RequireKnownChats() }, DefaultToken, 77, "x", bot.ErrorBadRequest, "chat not found"},
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
	f.RateLimitNext("", 1, 1500*time.Millisecond)
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

// call posts vals to method as a form and returns the decoded envelope and
// the HTTP status.
func call(t *testing.T, f *Fake, method string, vals url.Values) (map[string]any, int) {
	t.Helper()
	resp, err := http.PostForm(f.URL()+"/bot"+DefaultToken+"/"+method, vals)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatalf("%s: not JSON: %q", method, data)
	}
	return out, resp.StatusCode
}

// updateIDs are the update_ids of a getUpdates answer.
func updateIDs(t *testing.T, out map[string]any) []int64 {
	t.Helper()
	if out["ok"] != true {
		t.Fatalf("getUpdates: %v", out)
	}
	var ids []int64
	for _, u := range out["result"].([]any) {
		ids = append(ids, int64(u.(map[string]any)["update_id"].(float64)))
	}
	return ids
}

// TestGetUpdates: scripted updates come in order, an offset confirms (and
// forgets) the ones below it, limit caps the batch, a long poll returns
// when an update is pushed, and raw updates go out verbatim.
func TestGetUpdates(t *testing.T) {
	f := New(t)
	alice := models.User{ID: 7, FirstName: "Alice", Username: "alice"}
	a := f.Push(alice, Private(alice), "/gpu status")
	b := f.PushRawText(alice, Private(alice), []byte("caf\xe9"))
	c := f.PushRaw(`{"some_future_update":{"id":1}}`)
	if b != a+1 || c != b+1 {
		t.Fatalf("update ids %d %d %d, want consecutive", a, b, c)
	}
	out, _ := call(t, f, "getUpdates", url.Values{"allowed_updates": {`["message"]`}})
	if ids := updateIDs(t, out); len(ids) != 3 || ids[0] != a || ids[2] != c {
		t.Fatalf("getUpdates = %v, want %d..%d", ids, a, c)
	}
	first := out["result"].([]any)[0].(map[string]any)["message"].(map[string]any)
	if first["text"] != "/gpu status" || first["chat"].(map[string]any)["type"] != "private" || first["from"].(map[string]any)["username"] != "alice" {
		t.Errorf("first update's message: %v", first)
	}
	if got := f.AllowedUpdates(); len(got) != 1 || got[0] != "message" {
		t.Errorf("AllowedUpdates = %q", got)
	}
	// The raw bytes are in the body as they were (the decoder above made
	// them U+FFFD); check the wire.
	resp, err := http.Get(f.URL() + "/bot" + DefaultToken + "/getUpdates")
	if err != nil {
		t.Fatal(err)
	}
	wire, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(wire), "caf\xe9") || !strings.Contains(string(wire), `"some_future_update":{"id":1}`) {
		t.Errorf("raw updates not verbatim on the wire: %q", wire)
	}

	out, _ = call(t, f, "getUpdates", url.Values{"offset": {strconv.FormatInt(b, 10)}, "limit": {"1"}})
	if ids := updateIDs(t, out); len(ids) != 1 || ids[0] != b {
		t.Fatalf("offset %d, limit 1: %v", b, ids)
	}
	if f.Confirmed() != b {
		t.Errorf("Confirmed = %d, want %d", f.Confirmed(), b)
	}
	out, _ = call(t, f, "getUpdates", url.Values{"offset": {strconv.FormatInt(c+1, 10)}})
	if ids := updateIDs(t, out); len(ids) != 0 {
		t.Fatalf("after confirming everything: %v", ids)
	}

	// A long poll is answered by the next push.
	got := make(chan map[string]any, 1)
	go func() {
		var out map[string]any
		resp, err := http.PostForm(f.URL()+"/bot"+DefaultToken+"/getUpdates", url.Values{"offset": {strconv.FormatInt(c+1, 10)}, "timeout": {"20"}})
		if err == nil {
			_ = json.NewDecoder(resp.Body).Decode(&out)
			resp.Body.Close()
		}
		got <- out
	}()
	testkit.Eventually(t, 10*time.Second, func() bool { return f.Calls("getUpdates") == 5 }, "the long poll to arrive")
	d := f.Push(alice, Private(alice), "hi")
	select {
	case out := <-got:
		if ids := updateIDs(t, out); len(ids) != 1 || ids[0] != d {
			t.Fatalf("long poll = %v, want [%d]", ids, d)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the long poll did not return on a push")
	}
	if out, code := call(t, f, "getUpdates", url.Values{"allowed_updates": {"message"}}); code != 400 || out["ok"] != false {
		t.Errorf("bad allowed_updates: %d %v", code, out)
	}
	if n := len(f.CallTimes("getUpdates")); n != 6 || f.Calls("getUpdates") != 6 {
		t.Errorf("%d getUpdates call times, %d calls, want 6", n, f.Calls("getUpdates"))
	}
}

// TestFailures: a method's own failures come before the any-method ones;
// a raw failure is the whole body; 429 carries parameters.retry_after.
func TestFailures(t *testing.T) {
	f := New(t)
	f.FailNext("", 1, Failure{Code: 500, Description: "Internal Server Error"})
	f.FailNext("sendMessage", 1, Failure{Code: 502, Raw: "<html>Bad Gateway</html>"})
	f.RateLimitNext("getMe", 1, time.Second)

	resp, err := http.PostForm(f.URL()+"/bot"+DefaultToken+"/sendMessage", url.Values{"chat_id": {"1"}, "text": {"x"}})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 502 || string(body) != "<html>Bad Gateway</html>" {
		t.Errorf("raw failure: %d %q", resp.StatusCode, body)
	}
	out, code := call(t, f, "getMe", nil)
	if params, _ := out["parameters"].(map[string]any); code != 429 || out["error_code"] != float64(429) || params["retry_after"] != float64(1) ||
		out["description"] != "Too Many Requests: retry after 1" {
		t.Errorf("rate limit: %d %v", code, out)
	}
	if out, code := call(t, f, "getMe", nil); code != 500 || out["ok"] != false || out["description"] != "Internal Server Error" {
		t.Errorf("any-method failure: %d %v", code, out)
	}
	if out, _ := call(t, f, "getMe", nil); out["ok"] != true {
		t.Errorf("after the failures: %v", out)
	}
	if len(f.Sent()) != 0 {
		t.Errorf("a failed send was recorded: %+v", f.Sent())
	}
	if out, code := call(t, f, "sendMessage", url.Values{"text": {"x"}}); code != 400 || out["description"] != "Bad Request: chat_id is empty" {
		t.Errorf("no chat_id: %d %v", code, out)
	}
	if out, code := call(t, f, "noSuchMethod", nil); code != 404 || out["ok"] != false {
		t.Errorf("unknown method: %d %v", code, out)
	}
}

// TestKnownChatsAndWait: with RequireKnownChats a chat must have written or
// been introduced; sendMessage answers with that chat; WaitMessage wakes on
// the send.
func TestKnownChatsAndWait(t *testing.T) {
	f := New(t)
	f.RequireKnownChats()
	group := models.Chat{ID: -100, Type: models.ChatTypeSupergroup, Title: "ops"}
	f.KnowChat(group)
	b := newBot(t, f, DefaultToken)
	if _, err := b.SendMessage(ctx(t), &bot.SendMessageParams{ChatID: int64(5), Text: "x"}); !errors.Is(err, bot.ErrorBadRequest) {
		t.Fatalf("unknown chat: %v", err)
	}
	go func() {
		_, _ = b.SendMessage(context.Background(), &bot.SendMessageParams{ChatID: group.ID, Text: "switch done"})
	}()
	if got := f.WaitMessage(t, group.ID, "done"); got != "switch done" {
		t.Fatalf("WaitMessage = %q", got)
	}
	m, err := b.SendMessage(ctx(t), &bot.SendMessageParams{ChatID: group.ID, Text: "again"})
	if err != nil || m.Chat.Type != models.ChatTypeSupergroup || m.Chat.Title != "ops" {
		t.Fatalf("send to a known group = %+v, %v", m, err)
	}
	u := models.User{ID: 9, FirstName: "Bob"}
	f.Push(u, Private(u), "hi")
	if _, err := b.SendMessage(ctx(t), &bot.SendMessageParams{ChatID: u.ID, Text: "hello"}); err != nil {
		t.Fatalf("reply to a chat that wrote: %v", err)
	}
	if got := f.SentTo(u.ID); len(got) != 1 || got[0] != "hello" {
		t.Errorf("SentTo = %q", got)
	}
}
