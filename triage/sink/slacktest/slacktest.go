// Package slacktest is a fake of the Slack Web API for tests: a real HTTP
// server on 127.0.0.1 that answers chat.postMessage, conversations.history
// and auth.test with the request and response shapes of the real API
// (form-encoded or JSON POST, token in the form or as a Bearer header,
// HTTP 200 with {"ok":false,"error":…} for API errors, HTTP 429 with
// Retry-After for rate limits, cursor pagination). Because it is an HTTP
// server, a test can hand URL() to a gpuhost process it starts and inspect
// what that process posted.
//
// It checks what the real API refuses and a sink could get wrong: a wrong
// or missing token, an unknown channel (once SetChannels names the known
// ones), a message without text or blocks, malformed blocks and Block Kit
// limits (header 150 characters, section text 3000, 10 fields of 2000,
// context 10 elements, 50 blocks), malformed metadata. It ignores
// everything else a real workspace would do (threads, edits, users).
package slacktest

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"math"
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
	"unicode/utf8"
)

// DefaultToken is the token a new Fake accepts.
const DefaultToken = "xoxb-0000000000-slacktest-fake-token"

// Identity the fake reports in auth.test and puts on posted messages.
const (
	BotUserID = "U0SLACKTEST"
	BotID     = "B0SLACKTEST"
	TeamID    = "T0SLACKTEST"
)

// Limits the fake enforces, as Slack documents them.
const (
	maxBlocks       = 50
	maxHeader       = 150
	maxSectionText  = 3000
	maxFields       = 10
	maxField        = 2000
	maxContextElems = 10
	maxTextObject   = 3000
	maxMessageText  = 40000
	defaultLimit    = 100
	maxLimit        = 999
	maxFormBytes    = 4 << 20
)

// Message is one posted message as the fake stored it.
type Message struct {
	Channel string
	TS      string
	Text    string
	// Blocks is the blocks JSON as posted (nil when none).
	Blocks json.RawMessage
	// Metadata is the message metadata as posted (nil when none).
	Metadata *Metadata
}

// Metadata is Slack message metadata.
type Metadata struct {
	EventType    string         `json:"event_type"`
	EventPayload map[string]any `json:"event_payload"`
}

// Key is the "key" of the metadata's event_payload, or "".
func (m Message) Key() string {
	if m.Metadata == nil {
		return ""
	}
	k, _ := m.Metadata.EventPayload["key"].(string)
	return k
}

// Fake is the fake Web API. All methods are safe for concurrent use.
type Fake struct {
	srv *httptest.Server

	mu       sync.Mutex
	token    string
	channels map[string]bool // nil: every channel exists
	msgs     map[string][]Message
	nextTS   int64
	calls    map[string]int
	fail     []string        // Slack error codes of the next calls
	limited  []time.Duration // Retry-After of the next rate-limited calls
}

// New starts a fake that is closed when the test ends.
func New(t testing.TB) *Fake {
	t.Helper()
	f := NewServer()
	t.Cleanup(f.Close)
	return f
}

// NewServer starts a fake; Close stops it. For use outside a test's
// lifetime (a helper process); tests use New.
func NewServer() *Fake {
	f := &Fake{
		token:  DefaultToken,
		msgs:   map[string][]Message{},
		calls:  map[string]int{},
		nextTS: 1_700_000_000_000_000,
	}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	return f
}

// Close stops the server.
func (f *Fake) Close() { f.srv.Close() }

// URL is the Web API base with a trailing slash, as slack.OptionAPIURL
// wants it ("http://127.0.0.1:PORT/api/").
func (f *Fake) URL() string { return f.srv.URL + "/api/" }

// Token is the token the fake accepts.
func (f *Fake) Token() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.token
}

// SetToken changes the token the fake accepts; calls with any other get
// invalid_auth.
func (f *Fake) SetToken(token string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.token = token
}

// SetChannels makes only these channels exist (others: channel_not_found).
// With no arguments, every channel exists again (the default).
func (f *Fake) SetChannels(ids ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(ids) == 0 {
		f.channels = nil
		return
	}
	f.channels = map[string]bool{}
	for _, id := range ids {
		f.channels[id] = true
	}
}

// FailNext makes the next n calls (any method, after the token check)
// answer {"ok":false,"error":slackError}.
func (f *Fake) FailNext(n int, slackError string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for range n {
		f.fail = append(f.fail, slackError)
	}
}

// RateLimitNext makes the next n calls answer HTTP 429 with Retry-After in
// whole seconds (retryAfter rounded up) and {"ok":false,"error":"ratelimited"}.
func (f *Fake) RateLimitNext(n int, retryAfter time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for range n {
		f.limited = append(f.limited, retryAfter)
	}
}

// Seed adds a message to a channel as if someone had posted it (to fill a
// history in front of or behind the messages under test).
func (f *Fake) Seed(channel, text string, md *Metadata) Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.store(channel, text, nil, md)
}

// Messages returns the messages of a channel, oldest first.
func (f *Fake) Messages(channel string) []Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.msgs[channel])
}

// All returns every message of every channel, by channel then oldest first.
func (f *Fake) All() []Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Message
	for _, ch := range slices.Sorted(maps.Keys(f.msgs)) {
		out = append(out, f.msgs[ch]...)
	}
	return out
}

// CountKey is how many messages, over all channels, carry key in their
// metadata's event_payload.
func (f *Fake) CountKey(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, ms := range f.msgs {
		n += countKey(ms, key)
	}
	return n
}

// CountKeyIn is CountKey for one channel.
func (f *Fake) CountKeyIn(channel, key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return countKey(f.msgs[channel], key)
}

func countKey(ms []Message, key string) int {
	n := 0
	for _, m := range ms {
		if m.Key() == key {
			n++
		}
	}
	return n
}

// Calls is how many requests a method got (rejected ones included).
func (f *Fake) Calls(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

// HistoryCalls is Calls("conversations.history").
func (f *Fake) HistoryCalls() int { return f.Calls("conversations.history") }

// PostCalls is Calls("chat.postMessage").
func (f *Fake) PostCalls() int { return f.Calls("chat.postMessage") }

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// apiError is Slack's error shape: HTTP 200, ok false.
func apiError(w http.ResponseWriter, code string, details ...string) {
	body := map[string]any{"ok": false, "error": code}
	if len(details) > 0 {
		body["errors"] = details
		msgs := make([]string, len(details))
		for i, d := range details {
			msgs[i] = "[ERROR] " + d
		}
		body["response_metadata"] = map[string]any{"messages": msgs}
	}
	writeJSON(w, http.StatusOK, body)
}

func (f *Fake) serve(w http.ResponseWriter, r *http.Request) {
	method, ok := strings.CutPrefix(r.URL.Path, "/api/")
	if !ok || method == "" || strings.Contains(method, "/") {
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodPost && r.Method != http.MethodGet {
		w.Header().Set("Allow", "GET, POST")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	params, err := readParams(r)
	if err != nil {
		apiError(w, "invalid_form_data", err.Error())
		return
	}
	f.mu.Lock()
	f.calls[method]++
	if len(f.limited) > 0 {
		d := f.limited[0]
		f.limited = f.limited[1:]
		f.mu.Unlock()
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(d.Seconds()))))
		writeJSON(w, http.StatusTooManyRequests, map[string]any{"ok": false, "error": "ratelimited"})
		return
	}
	token := params.Get("token")
	if auth, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		token = auth
	}
	switch {
	case token == "":
		f.mu.Unlock()
		apiError(w, "not_authed")
		return
	case token != f.token:
		f.mu.Unlock()
		apiError(w, "invalid_auth")
		return
	}
	if len(f.fail) > 0 {
		code := f.fail[0]
		f.fail = f.fail[1:]
		f.mu.Unlock()
		apiError(w, code)
		return
	}
	f.mu.Unlock()
	switch method {
	case "auth.test":
		writeJSON(w, http.StatusOK, map[string]any{"ok": true, "url": "https://slacktest.example/",
			"team": "slacktest", "user": "gpuhost", "team_id": TeamID, "user_id": BotUserID, "bot_id": BotID})
	case "chat.postMessage":
		f.postMessage(w, params)
	case "conversations.history":
		f.history(w, params)
	default:
		apiError(w, "unknown_method")
	}
}

// readParams reads the query and a form-encoded or JSON body into one set
// of values; JSON values that are not strings are kept as their JSON text
// (blocks, metadata), as in the form encoding.
func readParams(r *http.Request) (url.Values, error) {
	r.Body = http.MaxBytesReader(nil, r.Body, maxFormBytes)
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if ct != "application/json" {
		if err := r.ParseForm(); err != nil {
			return nil, err
		}
		return r.Form, nil
	}
	vals := r.URL.Query()
	var body map[string]json.RawMessage
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("JSON body: %w", err)
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
}

func (f *Fake) knownChannel(ch string) bool {
	return ch != "" && (f.channels == nil || f.channels[ch])
}

func (f *Fake) postMessage(w http.ResponseWriter, params url.Values) {
	channel := params.Get("channel")
	text := params.Get("text")
	var blocks json.RawMessage
	if b := params.Get("blocks"); b != "" {
		if err := ValidateBlocks(b); err != nil {
			apiError(w, "invalid_blocks", err.Error())
			return
		}
		blocks = json.RawMessage(b)
	}
	var md *Metadata
	if m := params.Get("metadata"); m != "" {
		md = &Metadata{}
		if err := json.Unmarshal([]byte(m), md); err != nil || md.EventType == "" || md.EventPayload == nil {
			apiError(w, "invalid_metadata_format")
			return
		}
	}
	switch {
	case text == "" && len(blocks) == 0 && params.Get("attachments") == "":
		apiError(w, "no_text")
		return
	case utf8.RuneCountInString(text) > maxMessageText:
		apiError(w, "msg_too_long")
		return
	}
	f.mu.Lock()
	if !f.knownChannel(channel) {
		f.mu.Unlock()
		apiError(w, "channel_not_found")
		return
	}
	m := f.store(channel, text, blocks, md)
	f.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"ok": true, "channel": channel, "ts": m.TS, "message": wireMessage(m, true)})
}

// store appends a message; f.mu is held.
func (f *Fake) store(channel, text string, blocks json.RawMessage, md *Metadata) Message {
	f.nextTS++
	ts := fmt.Sprintf("%d.%06d", f.nextTS/1_000_000, f.nextTS%1_000_000)
	m := Message{Channel: channel, TS: ts, Text: text, Blocks: blocks, Metadata: md}
	f.msgs[channel] = append(f.msgs[channel], m)
	return m
}

// wireMessage is a message in the API's shape; metadata only when asked
// for (include_all_metadata), as Slack does.
func wireMessage(m Message, withMetadata bool) map[string]any {
	out := map[string]any{"type": "message", "user": BotUserID, "bot_id": BotID, "team": TeamID, "text": m.Text, "ts": m.TS}
	if len(m.Blocks) > 0 {
		out["blocks"] = m.Blocks
	}
	if withMetadata && m.Metadata != nil {
		out["metadata"] = m.Metadata
	}
	return out
}

func (f *Fake) history(w http.ResponseWriter, params url.Values) {
	channel := params.Get("channel")
	limit := defaultLimit
	if v := params.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			apiError(w, "invalid_limit")
			return
		}
		if n > 0 {
			limit = min(n, maxLimit)
		}
	}
	offset := 0
	if c := params.Get("cursor"); c != "" {
		n, ok := parseCursor(c)
		if !ok {
			apiError(w, "invalid_cursor")
			return
		}
		offset = n
	}
	withMD := params.Get("include_all_metadata") == "1" || params.Get("include_all_metadata") == "true"
	f.mu.Lock()
	if !f.knownChannel(channel) {
		f.mu.Unlock()
		apiError(w, "channel_not_found")
		return
	}
	all := f.msgs[channel]
	var page []map[string]any
	// Newest first: index 0 of the answer is the last message stored.
	for i := len(all) - 1 - offset; i >= 0 && len(page) < limit; i-- {
		page = append(page, wireMessage(all[i], withMD))
	}
	more := offset+len(page) < len(all)
	f.mu.Unlock()
	next := ""
	if more {
		next = makeCursor(offset + len(page))
	}
	if page == nil {
		page = []map[string]any{}
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"ok": true, "messages": page, "has_more": more, "pin_count": 0,
		"response_metadata": map[string]any{"next_cursor": next},
	})
}

func makeCursor(offset int) string {
	return base64.StdEncoding.EncodeToString([]byte("next_offset:" + strconv.Itoa(offset)))
}

func parseCursor(c string) (int, bool) {
	raw, err := base64.StdEncoding.DecodeString(c)
	if err != nil {
		return 0, false
	}
	v, ok := strings.CutPrefix(string(raw), "next_offset:")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(v)
	return n, err == nil && n >= 0
}

// textObject is a Block Kit text object.
type textObject struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type block struct {
	Type     string            `json:"type"`
	Text     *textObject       `json:"text"`
	Fields   []textObject      `json:"fields"`
	Elements []json.RawMessage `json:"elements"`
}

// ValidateBlocks applies the Block Kit rules the fake enforces on
// chat.postMessage to a blocks JSON array, so that a formatting test or
// fuzz target can check blocks without posting them. The error names the
// JSON pointer, as Slack's does.
func ValidateBlocks(raw string) error {
	var blocks []block
	if err := json.Unmarshal([]byte(raw), &blocks); err != nil {
		return fmt.Errorf("invalid JSON: %v", err)
	}
	if len(blocks) > maxBlocks {
		return fmt.Errorf("no more than %d items allowed [json-pointer:/blocks]", maxBlocks)
	}
	for i, b := range blocks {
		at := fmt.Sprintf("/blocks/%d", i)
		switch b.Type {
		case "header":
			if b.Text == nil || b.Text.Type != "plain_text" {
				return fmt.Errorf("must provide a plain_text object [json-pointer:%s/text]", at)
			}
			if err := checkText(*b.Text, maxHeader, at+"/text"); err != nil {
				return err
			}
		case "section":
			if b.Text == nil && len(b.Fields) == 0 {
				return fmt.Errorf("must provide text or fields [json-pointer:%s]", at)
			}
			if b.Text != nil {
				if err := checkText(*b.Text, maxSectionText, at+"/text"); err != nil {
					return err
				}
			}
			if len(b.Fields) > maxFields {
				return fmt.Errorf("no more than %d items allowed [json-pointer:%s/fields]", maxFields, at)
			}
			for j, fl := range b.Fields {
				if err := checkText(fl, maxField, fmt.Sprintf("%s/fields/%d", at, j)); err != nil {
					return err
				}
			}
		case "context":
			if len(b.Elements) == 0 || len(b.Elements) > maxContextElems {
				return fmt.Errorf("must have 1 to %d elements [json-pointer:%s/elements]", maxContextElems, at)
			}
			for j, e := range b.Elements {
				var t textObject
				if err := json.Unmarshal(e, &t); err != nil {
					return fmt.Errorf("invalid element [json-pointer:%s/elements/%d]", at, j)
				}
				if t.Type == "image" {
					continue
				}
				if err := checkText(t, maxTextObject, fmt.Sprintf("%s/elements/%d", at, j)); err != nil {
					return err
				}
			}
		case "":
			return fmt.Errorf("missing type [json-pointer:%s]", at)
		}
	}
	return nil
}

func checkText(t textObject, limit int, at string) error {
	switch {
	case t.Type != "plain_text" && t.Type != "mrkdwn":
		return fmt.Errorf("must be plain_text or mrkdwn [json-pointer:%s/type]", at)
	case t.Text == "":
		return fmt.Errorf("must be more than 0 characters [json-pointer:%s/text]", at)
	case utf8.RuneCountInString(t.Text) > limit:
		return fmt.Errorf("must be less than %d characters [json-pointer:%s/text]", limit+1, at)
	}
	return nil
}
