// Package telegramtest is the one fake Telegram Bot API server of the
// tests: the bot's (getUpdates, commands, replies, notifications) and the
// triage sink's (sendMessage to paired chats). It is a real HTTP server on
// 127.0.0.1 with the real API's shape:
//
//   - /bot<token>/<method>, parameters as multipart (what go-telegram/bot
//     sends), form, JSON or query;
//   - {"ok":true,"result":…} envelopes, and {"ok":false,"error_code":…,
//     "description":…} on errors, with "parameters":{"retry_after":N} on
//     429;
//   - getMe, deleteWebhook, getUpdates (offset confirmation: updates below
//     the offset are forgotten; long polling up to timeout seconds; limit;
//     allowed_updates) and sendMessage, which checks what Telegram checks:
//     the token (401 Unauthorized), chat_id, an empty, non-UTF-8 or too long
//     text (4096 UTF-16 units), parse_mode, link_preview_options, a blocked
//     chat (403) and, after RequireKnownChats, a chat the bot never saw
//     ("chat not found").
//
// Tests script updates (Push, PushRawText, PushRaw), inject faults
// (FailNext, RateLimitNext, SetToken, Block) and read what happened (Sent,
// SentTo, WaitFor, WaitMessage, Calls, CallTimes, Confirmed). All methods
// are safe for concurrent use.
package telegramtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/go-telegram/bot/models"
)

// DefaultToken is the token a new Fake accepts.
const DefaultToken = "4242424242:AAFakeSecretTokenValue_abcdefghijklmnopq"

// BotUserID and BotUsername are the bot getMe reports (and the sender of
// the messages sendMessage returns).
const (
	BotUserID   = 4242424242
	BotUsername = "gpuhost_test_bot"
)

const (
	maxTextUnits = 4096
	maxBodyBytes = 4 << 20
	maxUpdates   = 100 // getUpdates' default and largest limit
	waitBudget   = 30 * time.Second
)

// Sent is one message the fake accepted.
type Sent struct {
	ChatID int64
	Text   string
	// ParseMode is the parse_mode parameter ("" = plain text).
	ParseMode string
	// LinkPreviewDisabled is link_preview_options.is_disabled (or the older
	// disable_web_page_preview).
	LinkPreviewDisabled bool
}

// Failure is an injected answer: an API error envelope with HTTP status
// and error_code Code and Description (and parameters.retry_after when
// RetryAfter > 0, as Telegram sends with 429), or, with Raw set, status
// Code with Raw as the whole body (a proxy's error page, not JSON at all).
type Failure struct {
	Code        int
	Description string
	RetryAfter  int // seconds
	Raw         string
}

// Fake is the fake Bot API.
type Fake struct {
	srv *httptest.Server
	me  models.User

	mu       sync.Mutex
	wake     chan struct{} // closed and replaced on every change
	token    string
	queue    []queued
	nextID   int64
	offset   int64 // highest offset the client confirmed
	allowed  []string
	chats    map[int64]models.Chat
	strict   bool // sendMessage only to chats in chats
	blocked  map[int64]bool
	sent     []Sent
	calls    map[string]int
	callAt   map[string][]time.Time
	failures map[string][]Failure // by method; "" for any method
	hang     chan struct{}        // non-nil: every call waits until it is closed (Hang)
}

type queued struct {
	id  int64
	raw json.RawMessage
}

// New starts a fake that is closed when the test ends.
func New(t testing.TB) *Fake {
	t.Helper()
	f := NewServer()
	t.Cleanup(f.Close)
	return f
}

// NewServer starts a fake; Close stops it.
func NewServer() *Fake {
	f := &Fake{
		me:    models.User{ID: BotUserID, IsBot: true, FirstName: "gpuhost", Username: BotUsername},
		wake:  make(chan struct{}),
		token: DefaultToken, nextID: 1000,
		chats: map[int64]models.Chat{}, blocked: map[int64]bool{},
		calls: map[string]int{}, callAt: map[string][]time.Time{}, failures: map[string][]Failure{},
	}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	return f
}

// Close stops the server (after the requests in flight, long polls
// included, have ended: stop the client first).
func (f *Fake) Close() { f.srv.Close() }

// URL is the Bot API server base without a trailing slash, as
// bot.WithServerURL wants it.
func (f *Fake) URL() string { return f.srv.URL }

// changed wakes the long polls and WaitFor; f.mu is held.
func (f *Fake) changed() {
	close(f.wake)
	f.wake = make(chan struct{})
}

// Token is the token the fake accepts.
func (f *Fake) Token() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.token
}

// SetToken makes the fake accept only token from now on (a rotation at
// @BotFather: the old token gets 401).
func (f *Fake) SetToken(token string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.token = token
	f.changed()
}

// Private is a user's private chat with the bot.
func Private(u models.User) models.Chat {
	return models.Chat{ID: u.ID, Type: models.ChatTypePrivate, FirstName: u.FirstName, Username: u.Username}
}

// KnowChat lets sendMessage reach a chat that has not written yet (see
// RequireKnownChats); sendMessage's answer then carries this chat.
func (f *Fake) KnowChat(c models.Chat) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.chats[c.ID] = c
}

// RequireKnownChats makes sendMessage answer 400 "Bad Request: chat not
// found", as Telegram does, for a chat that has not written (Push) and was
// not introduced with KnowChat. Without it any chat id but 0 is reachable.
func (f *Fake) RequireKnownChats() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.strict = true
}

// Block makes sendMessage to chat answer 403 "Forbidden: bot was blocked by
// the user", as Telegram does after the user blocked the bot.
func (f *Fake) Block(chat int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.blocked[chat] = true
}

// FailNext makes the next n calls of method (of any method when method is
// "") that carry the right token answer fl instead. A method's own
// failures come before the any-method ones.
func (f *Fake) FailNext(method string, n int, fl Failure) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for range n {
		f.failures[method] = append(f.failures[method], fl)
	}
}

// RateLimitNext makes the next n calls of method ("" = any) answer 429
// "Too Many Requests: retry after N" with parameters.retry_after N, the
// whole seconds of retryAfter rounded up.
func (f *Fake) RateLimitNext(method string, n int, retryAfter time.Duration) {
	secs := int((retryAfter + time.Second - 1) / time.Second)
	f.FailNext(method, n, Failure{Code: http.StatusTooManyRequests,
		Description: fmt.Sprintf("Too Many Requests: retry after %d", secs), RetryAfter: secs})
}

// Push queues a text message from user in chat (which becomes known) and
// returns its update id.
func (f *Fake) Push(from models.User, chat models.Chat, text string) int64 {
	return f.push(from, chat, text, nil)
}

// PushRawText is Push with text given as bytes that go into the update's
// JSON verbatim: what a JSON encoder would refuse to produce, such as
// invalid UTF-8.
func (f *Fake) PushRawText(from models.User, chat models.Chat, text []byte) int64 {
	return f.push(from, chat, "", text)
}

func (f *Fake) push(from models.User, chat models.Chat, text string, rawText []byte) int64 {
	const placeholder = "\x00RAW\x00"
	if rawText != nil {
		text = placeholder
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextID++
	id := f.nextID
	f.chats[chat.ID] = chat
	raw, err := json.Marshal(models.Update{ID: id, Message: &models.Message{
		ID: int(id), From: &from, Date: int(time.Now().Unix()), Chat: chat, Text: text}})
	if err != nil {
		panic(fmt.Sprintf("telegramtest: encode update: %v", err))
	}
	if rawText != nil {
		enc, _ := json.Marshal(placeholder)
		raw = bytes.Replace(raw, enc[1:len(enc)-1], rawText, 1)
	}
	f.queue = append(f.queue, queued{id: id, raw: raw})
	f.changed()
	return id
}

// PushRaw queues an update given as a JSON object without its update_id
// (added here), verbatim otherwise: for updates a client cannot decode. It
// panics on invalid JSON.
func (f *Fake) PushRaw(obj string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextID++
	id := f.nextID
	raw := fmt.Sprintf(`{"update_id":%d,%s`, id, strings.TrimPrefix(strings.TrimSpace(obj), "{"))
	if !json.Valid([]byte(raw)) {
		panic("telegramtest: PushRaw: invalid JSON " + raw)
	}
	f.queue = append(f.queue, queued{id: id, raw: json.RawMessage(raw)})
	f.changed()
	return id
}

// Confirmed is the highest offset the client confirmed with getUpdates.
func (f *Fake) Confirmed() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.offset
}

// AllowedUpdates is the allowed_updates of the last getUpdates (nil when
// it sent none).
func (f *Fake) AllowedUpdates() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.allowed)
}

// Sent returns the accepted messages in order.
func (f *Fake) Sent() []Sent {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.sent)
}

// SentTo returns the texts sent to one chat.
func (f *Fake) SentTo(chat int64) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, s := range f.sent {
		if s.ChatID == chat {
			out = append(out, s.Text)
		}
	}
	return out
}

// Calls is how many requests a method got (refused ones included).
func (f *Fake) Calls(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

// CallTimes returns when each request of method arrived.
func (f *Fake) CallTimes(method string) []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.callAt[method])
}

// WaitFor waits (up to 30 s; woken by every change, not polling) until
// cond holds over the accepted messages and returns them, or fails the
// test listing what was sent.
func (f *Fake) WaitFor(t testing.TB, what string, cond func(sent []Sent) bool) []Sent {
	t.Helper()
	deadline := time.After(waitBudget)
	for {
		f.mu.Lock()
		sent := slices.Clone(f.sent)
		ok := cond(sent)
		wake := f.wake
		f.mu.Unlock()
		if ok {
			return sent
		}
		select {
		case <-wake:
		case <-deadline:
			t.Fatalf("timed out after %v waiting for %s; sent so far:\n%s", waitBudget, what, describe(sent))
		}
	}
}

// WaitMessage waits for a message to chat containing want and returns it.
func (f *Fake) WaitMessage(t testing.TB, chat int64, want string) string {
	t.Helper()
	var got string
	f.WaitFor(t, fmt.Sprintf("a message to %d containing %q", chat, want), func(sent []Sent) bool {
		for _, m := range sent {
			if m.ChatID == chat && strings.Contains(m.Text, want) {
				got = m.Text
				return true
			}
		}
		return false
	})
	return got
}

func describe(sent []Sent) string {
	var b strings.Builder
	for _, m := range sent {
		text := strings.ToValidUTF8(m.Text, "\uFFFD")
		if r := []rune(text); len(r) > 200 {
			text = string(r[:200]) + "…"
		}
		fmt.Fprintf(&b, "  → %d: %q\n", m.ChatID, text)
	}
	return b.String()
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func answer(w http.ResponseWriter, result any) {
	writeJSON(w, http.StatusOK, map[string]any{"ok": true, "result": result})
}

func apiError(w http.ResponseWriter, code int, desc string) {
	writeJSON(w, code, map[string]any{"ok": false, "error_code": code, "description": desc})
}

func (f *Fake) serve(w http.ResponseWriter, r *http.Request) {
	rest, found := strings.CutPrefix(r.URL.Path, "/bot")
	token, method, found2 := strings.Cut(rest, "/")
	if !found || !found2 || method == "" {
		apiError(w, http.StatusNotFound, "Not Found")
		return
	}
	params, err := readParams(r)
	if err != nil {
		apiError(w, http.StatusBadRequest, "Bad Request: "+err.Error())
		return
	}
	f.mu.Lock()
	f.calls[method]++
	f.callAt[method] = append(f.callAt[method], time.Now())
	if token != f.token {
		f.mu.Unlock()
		apiError(w, http.StatusUnauthorized, "Unauthorized")
		return
	}
	fl, failed := f.nextFailure(method)
	hang := f.hang
	f.mu.Unlock()
	if hang != nil {
		// A hanging Bot API: the request is accepted and never answered
		// (until the hang ends, then as usual).
		select {
		case <-hang:
		case <-r.Context().Done():
			return
		}
	}
	if failed {
		switch {
		case fl.Raw != "":
			w.WriteHeader(fl.Code)
			_, _ = io.WriteString(w, fl.Raw)
		case fl.RetryAfter > 0:
			writeJSON(w, fl.Code, map[string]any{"ok": false, "error_code": fl.Code, "description": fl.Description,
				"parameters": map[string]any{"retry_after": fl.RetryAfter}})
		default:
			apiError(w, fl.Code, fl.Description)
		}
		return
	}
	switch method {
	case "getMe":
		answer(w, map[string]any{"id": BotUserID, "is_bot": true, "first_name": f.me.FirstName, "username": BotUsername,
			"can_join_groups": false, "can_read_all_group_messages": false, "supports_inline_queries": false})
	case "deleteWebhook":
		answer(w, true)
	case "getUpdates":
		f.getUpdates(w, r, params)
	case "sendMessage":
		f.sendMessage(w, params)
	default:
		apiError(w, http.StatusNotFound, "Not Found: method not found")
	}
}

// Hang makes every call from now on hang, as a Bot API that accepts
// connections and never answers, until the returned func is called (the
// calls still waiting then go on as usual). Calls already being answered
// (a long poll in progress) are not affected.
func (f *Fake) Hang() (end func()) {
	ch := make(chan struct{})
	f.mu.Lock()
	f.hang = ch
	f.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			f.hang = nil
			f.mu.Unlock()
			close(ch)
		})
	}
}

// nextFailure takes the next injected failure for method; f.mu is held.
func (f *Fake) nextFailure(method string) (Failure, bool) {
	for _, key := range []string{method, ""} {
		if q := f.failures[key]; len(q) > 0 {
			f.failures[key] = q[1:]
			f.changed()
			return q[0], true
		}
	}
	return Failure{}, false
}

// readParams reads multipart, form-encoded, JSON or query parameters into
// one set of values; JSON values that are not strings keep their JSON
// text, as Telegram's form encoding does.
func readParams(r *http.Request) (url.Values, error) {
	r.Body = http.MaxBytesReader(nil, r.Body, maxBodyBytes)
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch ct {
	case "multipart/form-data":
		// A method without parameters comes as an empty multipart body
		// (go-telegram/bot does that for getMe); Telegram accepts it.
		if err := r.ParseMultipartForm(maxBodyBytes); err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		vals := r.URL.Query()
		if r.MultipartForm != nil {
			for k, v := range r.MultipartForm.Value {
				vals[k] = v
			}
		}
		return vals, nil
	case "application/json":
		vals := r.URL.Query()
		var body map[string]json.RawMessage
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("can't parse JSON body: %v", err)
		}
		for k, raw := range body {
			var s string
			if json.Unmarshal(raw, &s) == nil {
				vals.Set(k, s)
				continue
			}
			vals.Set(k, string(raw))
		}
		return vals, nil
	default:
		if err := r.ParseForm(); err != nil {
			return nil, err
		}
		return r.Form, nil
	}
}

func (f *Fake) getUpdates(w http.ResponseWriter, r *http.Request, params url.Values) {
	offset, _ := strconv.ParseInt(params.Get("offset"), 10, 64)
	timeout, _ := strconv.Atoi(params.Get("timeout"))
	limit, err := strconv.Atoi(params.Get("limit"))
	if err != nil || limit < 1 || limit > maxUpdates {
		limit = maxUpdates
	}
	var allowed []string
	if v := params.Get("allowed_updates"); v != "" {
		if err := json.Unmarshal([]byte(v), &allowed); err != nil {
			apiError(w, http.StatusBadRequest, "Bad Request: can't parse allowed_updates JSON array")
			return
		}
	}
	deadline := time.Now().Add(time.Duration(timeout) * time.Second)
	for {
		f.mu.Lock()
		f.allowed = allowed
		if offset > 0 {
			// Updates below offset are confirmed: Telegram forgets them.
			for len(f.queue) > 0 && f.queue[0].id < offset {
				f.queue = f.queue[1:]
			}
			if offset > f.offset {
				f.offset = offset
				f.changed()
			}
		}
		if len(f.queue) > 0 {
			n := min(len(f.queue), limit)
			out := make([]json.RawMessage, n)
			for i := range n {
				out[i] = f.queue[i].raw
			}
			f.mu.Unlock()
			answer(w, out)
			return
		}
		wake := f.wake
		f.mu.Unlock()
		wait := time.Until(deadline)
		if wait <= 0 {
			answer(w, []any{})
			return
		}
		select {
		case <-wake:
		case <-time.After(wait):
		case <-r.Context().Done():
			return
		}
	}
}

func (f *Fake) sendMessage(w http.ResponseWriter, params url.Values) {
	if params.Get("chat_id") == "" {
		apiError(w, http.StatusBadRequest, "Bad Request: chat_id is empty")
		return
	}
	chatID, err := strconv.ParseInt(params.Get("chat_id"), 10, 64)
	if err != nil || chatID == 0 {
		apiError(w, http.StatusBadRequest, "Bad Request: chat not found")
		return
	}
	text := params.Get("text")
	switch {
	case text == "":
		apiError(w, http.StatusBadRequest, "Bad Request: message text is empty")
		return
	case !utf8.ValidString(text):
		apiError(w, http.StatusBadRequest, "Bad Request: text must be encoded in UTF-8")
		return
	case len(utf16.Encode([]rune(text))) > maxTextUnits:
		apiError(w, http.StatusBadRequest, "Bad Request: message is too long")
		return
	}
	mode := params.Get("parse_mode")
	switch mode {
	case "", "HTML", "Markdown", "MarkdownV2":
	default:
		apiError(w, http.StatusBadRequest, "Bad Request: unsupported parse_mode")
		return
	}
	noPreview := params.Get("disable_web_page_preview") == "true"
	if lp := params.Get("link_preview_options"); lp != "" {
		var o struct {
			IsDisabled bool `json:"is_disabled"`
		}
		if err := json.Unmarshal([]byte(lp), &o); err != nil {
			apiError(w, http.StatusBadRequest, "Bad Request: can't parse link preview options JSON object")
			return
		}
		noPreview = o.IsDisabled
	}
	f.mu.Lock()
	chat, known := f.chats[chatID]
	if !known && f.strict {
		f.mu.Unlock()
		apiError(w, http.StatusBadRequest, "Bad Request: chat not found")
		return
	}
	if f.blocked[chatID] {
		f.mu.Unlock()
		apiError(w, http.StatusForbidden, "Forbidden: bot was blocked by the user")
		return
	}
	if !known {
		chat = models.Chat{ID: chatID, Type: models.ChatTypePrivate}
		if chatID < 0 {
			chat.Type = models.ChatTypeGroup
		}
	}
	f.sent = append(f.sent, Sent{ChatID: chatID, Text: text, ParseMode: mode, LinkPreviewDisabled: noPreview})
	id := len(f.sent)
	f.changed()
	f.mu.Unlock()
	me := f.me
	answer(w, models.Message{ID: id, From: &me, Date: int(time.Now().Unix()), Chat: chat, Text: text})
}
