package slacktest

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

	"github.com/slack-go/slack"
)

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func client(f *Fake, token string) *slack.Client {
	return slack.New(token, slack.OptionAPIURL(f.URL()))
}

// rawCall posts a body to a method and decodes the JSON answer.
func rawCall(t *testing.T, f *Fake, method, contentType, body string, header map[string]string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx(t), http.MethodPost, f.URL()+method, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatalf("%s: answer is not JSON: %q", method, data)
	}
	return resp.StatusCode, out
}

func TestAuth(t *testing.T) {
	f := New(t)
	res, err := client(f, DefaultToken).AuthTestContext(ctx(t))
	if err != nil || res.UserID != BotUserID || res.BotID != BotID || res.TeamID != TeamID {
		t.Fatalf("auth.test = %+v, %v", res, err)
	}
	tests := []struct {
		name, body string
		header     map[string]string
		want       string
	}{
		{"wrong token", "token=xoxb-wrong", nil, "invalid_auth"},
		{"no token", "", nil, "not_authed"},
		{"bearer token", "", map[string]string{"Authorization": "Bearer " + DefaultToken}, ""},
		{"wrong bearer", "", map[string]string{"Authorization": "Bearer nope"}, "invalid_auth"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out := rawCall(t, f, "auth.test", "application/x-www-form-urlencoded", tc.body, tc.header)
			if code != http.StatusOK {
				t.Errorf("HTTP %d, want 200 (Slack answers API errors with 200)", code)
			}
			if tc.want == "" {
				if out["ok"] != true {
					t.Errorf("answer %v, want ok", out)
				}
				return
			}
			if out["ok"] != false || out["error"] != tc.want {
				t.Errorf("answer %v, want error %s", out, tc.want)
			}
		})
	}
	f.SetToken("xoxb-rotated")
	if _, err := client(f, DefaultToken).AuthTestContext(ctx(t)); err == nil || err.Error() != "invalid_auth" {
		t.Errorf("old token after SetToken: %v, want invalid_auth", err)
	}
}

func TestPostMessage(t *testing.T) {
	f := New(t)
	c := client(f, DefaultToken)
	md := slack.SlackMetadata{EventType: "gpuhost_triage", EventPayload: map[string]any{"key": "INBOX/1/2"}}
	ch, ts, err := c.PostMessageContext(ctx(t), "C1",
		slack.MsgOptionText("hello", false),
		slack.MsgOptionBlocks(slack.NewSectionBlock(slack.NewTextBlockObject(slack.PlainTextType, "hi", false, false), nil, nil)),
		slack.MsgOptionMetadata(md))
	if err != nil || ch != "C1" || ts == "" {
		t.Fatalf("postMessage = %q, %q, %v", ch, ts, err)
	}
	msgs := f.Messages("C1")
	if len(msgs) != 1 || msgs[0].Text != "hello" || msgs[0].TS != ts || msgs[0].Key() != "INBOX/1/2" || !strings.Contains(string(msgs[0].Blocks), `"hi"`) {
		t.Fatalf("stored %+v", msgs)
	}
	// JSON body with a Bearer token, as Slack also accepts.
	_, out := rawCall(t, f, "chat.postMessage", "application/json; charset=utf-8",
		`{"channel":"C2","text":"json","metadata":{"event_type":"e","event_payload":{"key":"INBOX/1/2"}}}`,
		map[string]string{"Authorization": "Bearer " + DefaultToken})
	if out["ok"] != true || out["channel"] != "C2" {
		t.Fatalf("JSON post answer %v", out)
	}
	if f.CountKey("INBOX/1/2") != 2 || f.CountKeyIn("C2", "INBOX/1/2") != 1 || f.CountKeyIn("C3", "INBOX/1/2") != 0 {
		t.Errorf("CountKey = %d, CountKeyIn(C2) = %d", f.CountKey("INBOX/1/2"), f.CountKeyIn("C2", "INBOX/1/2"))
	}
	if f.PostCalls() != 2 {
		t.Errorf("PostCalls = %d, want 2", f.PostCalls())
	}
}

func TestPostMessageRefused(t *testing.T) {
	longHeader := slack.NewHeaderBlock(slack.NewTextBlockObject(slack.PlainTextType, strings.Repeat("x", 151), false, false))
	tests := []struct {
		name  string
		setup func(f *Fake)
		opts  []slack.MsgOption
		want  string
	}{
		{"no text", nil, nil, "no_text"},
		{"header too long", nil, []slack.MsgOption{slack.MsgOptionBlocks(longHeader)}, "invalid_blocks"},
		{"bad metadata", nil, []slack.MsgOption{slack.MsgOptionText("x", false), slack.MsgOptionMetadata(slack.SlackMetadata{})}, "invalid_metadata_format"},
		{"unknown channel", func(f *Fake) { f.SetChannels("C9") }, []slack.MsgOption{slack.MsgOptionText("x", false)}, "channel_not_found"},
		{"injected failure", func(f *Fake) { f.FailNext(1, "is_archived") }, []slack.MsgOption{slack.MsgOptionText("x", false)}, "is_archived"},
		{"too long", nil, []slack.MsgOption{slack.MsgOptionText(strings.Repeat("x", 40001), false)}, "msg_too_long"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := New(t)
			if tc.setup != nil {
				tc.setup(f)
			}
			_, _, err := client(f, DefaultToken).PostMessageContext(ctx(t), "C1", tc.opts...)
			var se slack.SlackErrorResponse
			if !errors.As(err, &se) || se.Err != tc.want {
				t.Fatalf("err = %v, want %s", err, tc.want)
			}
			if n := len(f.All()); n != 0 {
				t.Errorf("%d messages stored", n)
			}
		})
	}
}

func TestRateLimit(t *testing.T) {
	f := New(t)
	f.RateLimitNext(1, 1500*time.Millisecond)
	_, _, err := client(f, DefaultToken).PostMessageContext(ctx(t), "C1", slack.MsgOptionText("x", false))
	var rl *slack.RateLimitedError
	if !errors.As(err, &rl) || rl.RetryAfter != 2*time.Second {
		t.Fatalf("err = %v, want a rate limit with Retry-After 2s", err)
	}
	if _, _, err := client(f, DefaultToken).PostMessageContext(ctx(t), "C1", slack.MsgOptionText("x", false)); err != nil {
		t.Fatalf("second call: %v", err)
	}
}

func TestHistory(t *testing.T) {
	f := New(t)
	md := &Metadata{EventType: "e", EventPayload: map[string]any{"key": "k3"}}
	for i := 1; i <= 5; i++ {
		var m *Metadata
		if i == 3 {
			m = md
		}
		f.Seed("C1", string(rune('0'+i)), m)
	}
	c := client(f, DefaultToken)
	var texts []string
	cursor := ""
	pages := 0
	for {
		resp, err := c.GetConversationHistoryContext(ctx(t), &slack.GetConversationHistoryParameters{
			ChannelID: "C1", Limit: 2, Cursor: cursor, IncludeAllMetadata: true})
		if err != nil {
			t.Fatalf("history: %v", err)
		}
		pages++
		for _, m := range resp.Messages {
			texts = append(texts, m.Text)
			if m.Text == "3" && m.Metadata.EventPayload["key"] != "k3" {
				t.Errorf("message 3 lacks its metadata: %+v", m.Metadata)
			}
		}
		if resp.HasMore != (resp.ResponseMetaData.NextCursor != "") {
			t.Errorf("has_more %v with cursor %q", resp.HasMore, resp.ResponseMetaData.NextCursor)
		}
		cursor = resp.ResponseMetaData.NextCursor
		if cursor == "" {
			break
		}
	}
	if got := strings.Join(texts, ","); got != "5,4,3,2,1" || pages != 3 {
		t.Errorf("history = %s in %d pages, want 5,4,3,2,1 in 3", got, pages)
	}
	resp, err := c.GetConversationHistoryContext(ctx(t), &slack.GetConversationHistoryParameters{ChannelID: "C1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range resp.Messages {
		if m.Metadata.EventType != "" {
			t.Errorf("metadata returned without include_all_metadata: %+v", m.Metadata)
		}
	}
	if f.HistoryCalls() != 4 {
		t.Errorf("HistoryCalls = %d, want 4", f.HistoryCalls())
	}
	for _, tc := range []struct {
		params url.Values
		want   string
	}{
		{url.Values{"channel": {"C1"}, "cursor": {"garbage"}}, "invalid_cursor"},
		{url.Values{"channel": {"C1"}, "limit": {"-1"}}, "invalid_limit"},
	} {
		tc.params.Set("token", DefaultToken)
		if _, out := rawCall(t, f, "conversations.history", "application/x-www-form-urlencoded", tc.params.Encode(), nil); out["error"] != tc.want {
			t.Errorf("%v: answer %v, want %s", tc.params, out, tc.want)
		}
	}
	f.SetChannels("C2")
	if _, err := c.GetConversationHistoryContext(ctx(t), &slack.GetConversationHistoryParameters{ChannelID: "C1"}); err == nil || err.Error() != "channel_not_found" {
		t.Errorf("unknown channel: %v, want channel_not_found", err)
	}
}

func TestUnknownMethod(t *testing.T) {
	f := New(t)
	if _, out := rawCall(t, f, "chat.nope", "application/x-www-form-urlencoded", "token="+DefaultToken, nil); out["error"] != "unknown_method" {
		t.Errorf("answer %v, want unknown_method", out)
	}
}

func TestValidateBlocks(t *testing.T) {
	long := func(n int) string { return strings.Repeat("x", n) }
	tests := []struct {
		name, blocks, want string
	}{
		{"ok", `[{"type":"header","text":{"type":"plain_text","text":"h"}},{"type":"section","fields":[{"type":"mrkdwn","text":"f"}]},{"type":"context","elements":[{"type":"plain_text","text":"c"}]},{"type":"divider"}]`, ""},
		{"not JSON", `[{`, "invalid JSON"},
		{"header mrkdwn", `[{"type":"header","text":{"type":"mrkdwn","text":"h"}}]`, "plain_text object"},
		{"header 151", `[{"type":"header","text":{"type":"plain_text","text":"` + long(151) + `"}}]`, "less than 151"},
		{"section 3001", `[{"type":"section","text":{"type":"plain_text","text":"` + long(3001) + `"}}]`, "less than 3001"},
		{"section empty", `[{"type":"section"}]`, "text or fields"},
		{"field 2001", `[{"type":"section","fields":[{"type":"plain_text","text":"` + long(2001) + `"}]}]`, "less than 2001"},
		{"11 fields", `[{"type":"section","fields":[` + strings.TrimSuffix(strings.Repeat(`{"type":"plain_text","text":"f"},`, 11), ",") + `]}]`, "no more than 10"},
		{"empty text", `[{"type":"section","text":{"type":"plain_text","text":""}}]`, "more than 0"},
		{"bad text type", `[{"type":"section","text":{"type":"html","text":"x"}}]`, "plain_text or mrkdwn"},
		{"context empty", `[{"type":"context","elements":[]}]`, "1 to 10"},
		{"no type", `[{}]`, "missing type"},
		{"51 blocks", `[` + strings.TrimSuffix(strings.Repeat(`{"type":"divider"},`, 51), ",") + `]`, "no more than 50"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateBlocks(tc.blocks)
			if tc.want == "" {
				if err != nil {
					t.Errorf("err = %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
		})
	}
}
