// Package telegramtest is a fake Telegram Bot API server for tests of code
// that sends with a bot: a real HTTP server on 127.0.0.1 with the real
// API's shape (/bot<token>/<method>, multipart, form or JSON parameters,
// {"ok":true,"result":…} envelopes, {"ok":false,"error_code":…,
// "description":…} on errors). It serves getMe and sendMessage, records
// what was sent, and checks what Telegram checks: the token (401
// Unauthorized), chat_id, an empty, non-UTF-8 or too long text (4096 UTF-16
// units), a blocked chat (403). Other processes can use it through URL().
package telegramtest

import (
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
)

// DefaultToken is the token a new Fake accepts.
const DefaultToken = "4242424242:AATelegramTestFakeSecret_abcdefghij"

// BotUserID and BotUsername are what getMe reports.
const (
	BotUserID   = 4242424242
	BotUsername = "gpuhost_telegramtest_bot"
)

const (
	maxTextUnits = 4096
	maxBodyBytes = 4 << 20
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

// Fake is the fake Bot API. All methods are safe for concurrent use.
type Fake struct {
	srv *httptest.Server

	mu      sync.Mutex
	token   string
	blocked map[int64]bool
	sent    []Sent
	calls   map[string]int
	fail    []failure
}

type failure struct {
	code       int
	desc       string
	retryAfter int
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
	f := &Fake{token: DefaultToken, blocked: map[int64]bool{}, calls: map[string]int{}}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	return f
}

// Close stops the server.
func (f *Fake) Close() { f.srv.Close() }

// URL is the Bot API server base without a trailing slash, as
// bot.WithServerURL wants it.
func (f *Fake) URL() string { return f.srv.URL }

// Token is the token the fake accepts.
func (f *Fake) Token() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.token
}

// SetToken changes the token the fake accepts.
func (f *Fake) SetToken(token string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.token = token
}

// Block makes sendMessage to chat answer 403 "Forbidden: bot was blocked by
// the user", as Telegram does after the user blocked the bot.
func (f *Fake) Block(chat int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.blocked[chat] = true
}

// FailNext makes the next n calls (after the token check) answer
// {"ok":false,"error_code":code,"description":description} with HTTP code.
func (f *Fake) FailNext(n, code int, description string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for range n {
		f.fail = append(f.fail, failure{code: code, desc: description})
	}
}

// RateLimitNext makes the next n calls answer 429 with
// parameters.retry_after (whole seconds, rounded up).
func (f *Fake) RateLimitNext(n int, retryAfter time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	secs := int((retryAfter + time.Second - 1) / time.Second)
	for range n {
		f.fail = append(f.fail, failure{code: http.StatusTooManyRequests,
			desc: fmt.Sprintf("Too Many Requests: retry after %d", secs), retryAfter: secs})
	}
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

// Calls is how many requests a method got (rejected ones included).
func (f *Fake) Calls(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func apiError(w http.ResponseWriter, code int, desc string) {
	writeJSON(w, code, map[string]any{"ok": false, "error_code": code, "description": desc})
}

func (f *Fake) serve(w http.ResponseWriter, r *http.Request) {
	rest, ok := strings.CutPrefix(r.URL.Path, "/bot")
	token, method, ok2 := strings.Cut(rest, "/")
	if !ok || !ok2 || method == "" {
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
	if token != f.token {
		f.mu.Unlock()
		apiError(w, http.StatusUnauthorized, "Unauthorized")
		return
	}
	if len(f.fail) > 0 {
		fl := f.fail[0]
		f.fail = f.fail[1:]
		f.mu.Unlock()
		body := map[string]any{"ok": false, "error_code": fl.code, "description": fl.desc}
		if fl.retryAfter > 0 {
			body["parameters"] = map[string]any{"retry_after": fl.retryAfter}
		}
		writeJSON(w, fl.code, body)
		return
	}
	f.mu.Unlock()
	switch method {
	case "getMe":
		writeJSON(w, http.StatusOK, map[string]any{"ok": true, "result": map[string]any{
			"id": BotUserID, "is_bot": true, "first_name": "gpuhost", "username": BotUsername,
			"can_join_groups": false, "can_read_all_group_messages": false, "supports_inline_queries": false}})
	case "sendMessage":
		f.sendMessage(w, params)
	default:
		apiError(w, http.StatusNotFound, "Not Found: method not found")
	}
}

// readParams reads multipart (what go-telegram/bot sends), form-encoded,
// JSON or query parameters into one set of values; JSON values that are
// not strings keep their JSON text, as Telegram's form encoding does.
func readParams(r *http.Request) (url.Values, error) {
	r.Body = http.MaxBytesReader(nil, r.Body, maxBodyBytes)
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch ct {
	case "multipart/form-data":
		// A method without parameters comes as an empty multipart body.
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

func (f *Fake) sendMessage(w http.ResponseWriter, params url.Values) {
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
	if f.blocked[chatID] {
		f.mu.Unlock()
		apiError(w, http.StatusForbidden, "Forbidden: bot was blocked by the user")
		return
	}
	f.sent = append(f.sent, Sent{ChatID: chatID, Text: text, ParseMode: mode, LinkPreviewDisabled: noPreview})
	id := len(f.sent)
	f.mu.Unlock()
	chat := map[string]any{"id": chatID, "type": "private"}
	if chatID < 0 {
		chat["type"] = "group"
	}
	writeJSON(w, http.StatusOK, map[string]any{"ok": true, "result": map[string]any{
		"message_id": id,
		"from":       map[string]any{"id": BotUserID, "is_bot": true, "first_name": "gpuhost", "username": BotUsername},
		"chat":       chat,
		"date":       time.Now().Unix(),
		"text":       text,
	}})
}
