package telegram

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/go-telegram/bot/models"
)

// fakeAPI is a Bot API server with the real API's shape: /bot<token>/<method>,
// form or multipart parameters, {"ok":…,"result":…} envelopes with
// error_code/description on errors, getUpdates with offset confirmation and
// long polling up to `timeout` seconds, sendMessage validating chat and text
// as Telegram does (unknown chat, empty, too long, not UTF-8).
type fakeAPI struct {
	t     testing.TB
	srv   *httptest.Server
	token string
	me    models.User

	mu       sync.Mutex
	wake     chan struct{} // closed and replaced on every change
	queue    []queued
	nextID   int64
	offset   int64 // highest offset the client confirmed
	chats    map[int64]models.Chat
	sent     []sentMsg
	calls    map[string]int
	callAt   map[string][]time.Time // when each call arrived
	failures map[string][]failure
	allowed  []string // allowed_updates of the last getUpdates
}

type queued struct {
	id  int64
	raw json.RawMessage
}

type sentMsg struct {
	ChatID int64
	Text   string
}

// failure is an injected answer: an API error envelope or, with raw set, a
// body that is not JSON at all.
type failure struct {
	code       int
	desc       string
	raw        string
	retryAfter int // parameters.retry_after, as Telegram sends with 429
}

const (
	testToken   = "4242424242:AAFakeSecretTokenValue_abcdefghijklmnopq"
	testBotName = "gpuhost_test_bot"
)

func newFakeAPI(t testing.TB) *fakeAPI {
	f := &fakeAPI{
		t: t, token: testToken, wake: make(chan struct{}), nextID: 1000,
		me:       models.User{ID: 4242424242, IsBot: true, FirstName: "gpuhost", Username: testBotName},
		chats:    map[int64]models.Chat{},
		calls:    map[string]int{},
		callAt:   map[string][]time.Time{},
		failures: map[string][]failure{},
	}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeAPI) URL() string { return f.srv.URL }

func (f *fakeAPI) changed() {
	close(f.wake)
	f.wake = make(chan struct{})
}

// failNext makes the next n calls of method fail.
func (f *fakeAPI) failNext(method string, n int, fl failure) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for range n {
		f.failures[method] = append(f.failures[method], fl)
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func apiError(w http.ResponseWriter, code int, desc string) {
	writeJSON(w, code, map[string]any{"ok": false, "error_code": code, "description": desc})
}

func (f *fakeAPI) serve(w http.ResponseWriter, r *http.Request) {
	rest, ok := strings.CutPrefix(r.URL.Path, "/bot")
	if !ok {
		apiError(w, http.StatusNotFound, "Not Found")
		return
	}
	token, method, ok := strings.Cut(rest, "/")
	if !ok {
		apiError(w, http.StatusNotFound, "Not Found")
		return
	}
	f.mu.Lock()
	want := f.token
	f.mu.Unlock()
	if token != want {
		apiError(w, http.StatusUnauthorized, "Unauthorized")
		return
	}
	if strings.HasPrefix(r.Header.Get("Content-Type"), "multipart/") {
		// A method without parameters comes as an empty multipart body
		// (go-telegram/bot does that for getMe); Telegram accepts it.
		if err := r.ParseMultipartForm(1 << 20); err != nil && !errors.Is(err, io.EOF) {
			apiError(w, http.StatusBadRequest, "Bad Request: "+err.Error())
			return
		}
	} else if err := r.ParseForm(); err != nil {
		apiError(w, http.StatusBadRequest, "Bad Request: "+err.Error())
		return
	}
	f.mu.Lock()
	f.calls[method]++
	f.callAt[method] = append(f.callAt[method], time.Now())
	if fl := f.failures[method]; len(fl) > 0 {
		f.failures[method] = fl[1:]
		f.changed()
		f.mu.Unlock()
		if fl[0].raw != "" {
			w.WriteHeader(fl[0].code)
			_, _ = w.Write([]byte(fl[0].raw))
			return
		}
		if fl[0].retryAfter > 0 {
			writeJSON(w, fl[0].code, map[string]any{"ok": false, "error_code": fl[0].code, "description": fl[0].desc,
				"parameters": map[string]any{"retry_after": fl[0].retryAfter}})
			return
		}
		apiError(w, fl[0].code, fl[0].desc)
		return
	}
	f.mu.Unlock()
	switch method {
	case "getMe":
		writeJSON(w, http.StatusOK, map[string]any{"ok": true, "result": f.me})
	case "deleteWebhook":
		writeJSON(w, http.StatusOK, map[string]any{"ok": true, "result": true})
	case "getUpdates":
		f.getUpdates(w, r)
	case "sendMessage":
		f.sendMessage(w, r)
	default:
		apiError(w, http.StatusNotFound, "Not Found: method not found")
	}
}

func (f *fakeAPI) getUpdates(w http.ResponseWriter, r *http.Request) {
	offset, _ := strconv.ParseInt(r.FormValue("offset"), 10, 64)
	timeout, _ := strconv.Atoi(r.FormValue("timeout"))
	var allowed []string
	if v := r.FormValue("allowed_updates"); v != "" {
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
			n := min(len(f.queue), 100)
			out := make([]json.RawMessage, n)
			for i := range n {
				out[i] = f.queue[i].raw
			}
			f.mu.Unlock()
			writeJSON(w, http.StatusOK, map[string]any{"ok": true, "result": out})
			return
		}
		wake := f.wake
		f.mu.Unlock()
		wait := time.Until(deadline)
		if wait <= 0 {
			writeJSON(w, http.StatusOK, map[string]any{"ok": true, "result": []any{}})
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

func (f *fakeAPI) sendMessage(w http.ResponseWriter, r *http.Request) {
	chatID, err := strconv.ParseInt(r.FormValue("chat_id"), 10, 64)
	if err != nil {
		apiError(w, http.StatusBadRequest, "Bad Request: chat_id is empty")
		return
	}
	text := r.FormValue("text")
	switch {
	case text == "":
		apiError(w, http.StatusBadRequest, "Bad Request: message text is empty")
		return
	case !utf8.ValidString(text):
		apiError(w, http.StatusBadRequest, "Bad Request: text must be encoded in UTF-8")
		return
	case utf16Len(text) > maxMessageUnits:
		apiError(w, http.StatusBadRequest, "Bad Request: message is too long")
		return
	}
	f.mu.Lock()
	chat, ok := f.chats[chatID]
	if !ok {
		f.mu.Unlock()
		apiError(w, http.StatusBadRequest, "Bad Request: chat not found")
		return
	}
	f.sent = append(f.sent, sentMsg{ChatID: chatID, Text: text})
	id := len(f.sent)
	f.changed()
	f.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"ok": true, "result": models.Message{
		ID: id, From: &f.me, Date: int(time.Now().Unix()), Chat: chat, Text: text}})
}

// push queues a text message from user in chat and returns its update id.
// rawText, when set, replaces the text bytes in the JSON verbatim (to send
// what a JSON encoder would refuse to produce, such as invalid UTF-8).
func (f *fakeAPI) push(from models.User, chat models.Chat, text string, rawText ...[]byte) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextID++
	id := f.nextID
	f.chats[chat.ID] = chat
	const placeholder = "\x00RAW\x00"
	if len(rawText) > 0 {
		text = placeholder
	}
	raw, err := json.Marshal(models.Update{ID: id, Message: &models.Message{
		ID: int(id), From: &from, Date: int(time.Now().Unix()), Chat: chat, Text: text}})
	if err != nil {
		f.t.Fatalf("encode update: %v", err)
	}
	if len(rawText) > 0 {
		enc, _ := json.Marshal(placeholder)
		raw = bytes.Replace(raw, enc[1:len(enc)-1], rawText[0], 1)
	}
	f.queue = append(f.queue, queued{id: id, raw: raw})
	f.changed()
	return id
}

// pushRaw queues an update given as a JSON object without its update_id
// (added here), verbatim otherwise: for updates the library cannot decode.
func (f *fakeAPI) pushRaw(obj string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextID++
	id := f.nextID
	raw := fmt.Sprintf(`{"update_id":%d,%s`, id, strings.TrimPrefix(strings.TrimSpace(obj), "{"))
	if !json.Valid([]byte(raw)) {
		f.t.Fatalf("pushRaw: invalid JSON %s", raw)
	}
	f.queue = append(f.queue, queued{id: id, raw: json.RawMessage(raw)})
	f.changed()
	return id
}

// setToken makes the fake accept only token from now on (a rotation at
// @BotFather: the old token gets 401).
func (f *fakeAPI) setToken(token string) {
	f.mu.Lock()
	f.token = token
	f.changed()
	f.mu.Unlock()
}

// confirmed is the highest offset the client confirmed.
func (f *fakeAPI) confirmed() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.offset
}

// callTimes returns when each call of method arrived.
func (f *fakeAPI) callTimes(method string) []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Time(nil), f.callAt[method]...)
}

// private is a user's private chat with the bot.
func private(u models.User) models.Chat {
	return models.Chat{ID: u.ID, Type: models.ChatTypePrivate, FirstName: u.FirstName, Username: u.Username}
}

// knowChat lets sendMessage reach a chat that has not written yet.
func (f *fakeAPI) knowChat(c models.Chat) {
	f.mu.Lock()
	f.chats[c.ID] = c
	f.mu.Unlock()
}

// waitFor waits until cond holds over the sent messages, or fails the test.
func (f *fakeAPI) waitFor(t testing.TB, what string, cond func(sent []sentMsg) bool) []sentMsg {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		f.mu.Lock()
		sent := append([]sentMsg(nil), f.sent...)
		ok := cond(sent)
		wake := f.wake
		f.mu.Unlock()
		if ok {
			return sent
		}
		select {
		case <-wake:
		case <-deadline:
			t.Fatalf("timed out waiting for %s; sent so far:\n%s", what, describeSent(sent))
		}
	}
}

// waitMessage waits for a message to chat containing want and returns it.
func (f *fakeAPI) waitMessage(t testing.TB, chat int64, want string) string {
	t.Helper()
	var got string
	f.waitFor(t, fmt.Sprintf("a message to %d containing %q", chat, want), func(sent []sentMsg) bool {
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

func (f *fakeAPI) sentTo(chat int64) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, m := range f.sent {
		if m.ChatID == chat {
			out = append(out, m.Text)
		}
	}
	return out
}

func (f *fakeAPI) allSent() []sentMsg {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]sentMsg(nil), f.sent...)
}

func (f *fakeAPI) callCount(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

func describeSent(sent []sentMsg) string {
	var b strings.Builder
	for _, m := range sent {
		fmt.Fprintf(&b, "  → %d: %q\n", m.ChatID, clip(m.Text, 200))
	}
	return b.String()
}
