package telegram

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-telegram/bot"
	"github.com/go-telegram/bot/models"

	"gpuhost/api"
	"gpuhost/internal/jsonlimit"
)

// The bot long-polls getUpdates itself rather than through the library's
// Start: the library decodes a whole batch at once, so one update it cannot
// decode (a kind newer than the library, which any stranger can send) failed
// every batch, the offset never advanced and the bot was deaf for good. Here
// each update is decoded on its own and an undecodable one is skipped.

const (
	// maxResponseBytes bounds a Bot API answer (100 updates are far less).
	maxResponseBytes = 32 << 20
	// maxLoggedBody is how much of an invalid answer's body an error (and
	// so the log) carries.
	maxLoggedBody = 256
	// maxErrText bounds the text of any error the bot logs or returns: the
	// library puts whole response bodies into its errors.
	maxErrText = 1024
	// maxRetryAfter caps a 429's retry_after (Telegram's flood waits are
	// seconds to minutes; a bogus huge value must not park the bot).
	maxRetryAfter = time.Hour
	// maxReplyWait is the longest retry_after a reply waits for before its
	// one retry; beyond it the reply is given up.
	maxReplyWait = 30 * time.Second
	// noteAttempts is how often a notification is tried per chat.
	noteAttempts = 6
	// defaultPollTimeout is the long poll's length: Telegram answers a
	// getUpdates with no news after its timeout (this minus a second).
	// defaultHangMargin is how much longer the bot waits for that answer
	// before it calls the Bot API hanging: the status, the doctor and
	// gpuhost_telegram_up show a hang at most 30 s after it began.
	defaultPollTimeout = 25 * time.Second
	defaultHangMargin  = 5 * time.Second
)

// Kinds of failed Bot API calls, the keys of TelegramStatus.Errors and the
// kind label of gpuhost_telegram_errors_total.
const (
	errUnauthorized    = "unauthorized"
	errRateLimited     = "rate_limited"
	errConflict        = "conflict"
	errServer          = "server"
	errNetwork         = "network"
	errInvalidResponse = "invalid_response"
	errBadRequest      = "bad_request"
	errOther           = "other"
)

// ErrorKinds lists the kinds of TelegramStatus.Errors, so that a counter
// exists (at 0) before the first error of its kind.
var ErrorKinds = []string{errUnauthorized, errRateLimited, errConflict, errServer, errNetwork, errInvalidResponse, errBadRequest, errOther}

// callError is a failed Bot API call made by this package (getUpdates).
type callError struct {
	kind       string
	code       int // error_code or HTTP status; 0 when there was no answer
	retryAfter time.Duration
	msg        string
	// since is when the Bot API stopped answering, for a hang: the call
	// left then, not when its deadline passed.
	since time.Time
}

func (e *callError) Error() string { return e.msg }

// classify returns the kind of a failed call (ours or the library's) and
// the wait Telegram asked for (429 retry_after), if any. It must see the
// error before scrub, which hides the types.
func classify(err error) (kind string, retryAfter time.Duration) {
	var ce *callError
	if errors.As(err, &ce) {
		return ce.kind, ce.retryAfter
	}
	var tm *bot.TooManyRequestsError
	if errors.As(err, &tm) {
		return errRateLimited, min(time.Duration(tm.RetryAfter)*time.Second, maxRetryAfter)
	}
	switch {
	case errors.Is(err, bot.ErrorUnauthorized), errors.Is(err, bot.ErrorNotFound):
		return errUnauthorized, 0
	case errors.Is(err, bot.ErrorConflict):
		return errConflict, 0
	case errors.Is(err, bot.ErrorBadRequest), errors.Is(err, bot.ErrorForbidden):
		return errBadRequest, 0
	}
	var me *bot.MigrateError
	if errors.As(err, &me) {
		return errBadRequest, 0
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "error do request"), strings.Contains(msg, "error read response body"):
		return errNetwork, 0
	case strings.Contains(msg, "error decode response"):
		return errInvalidResponse, 0
	case strings.Contains(msg, "error response from telegram"):
		return errServer, 0
	}
	return errOther, 0
}

// kindOfCode maps an error_code (or HTTP status) to a kind.
func kindOfCode(code int) string {
	switch {
	case code == http.StatusUnauthorized, code == http.StatusNotFound:
		return errUnauthorized
	case code == http.StatusTooManyRequests:
		return errRateLimited
	case code == http.StatusConflict:
		return errConflict
	case code >= 500:
		return errServer
	case code >= 400:
		return errBadRequest
	}
	return errOther
}

// retryable reports whether a failed send is worth another try.
// Notifications also retry a refused token: the poll loop re-reads it.
func retryable(kind string, note bool) bool {
	switch kind {
	case errRateLimited, errServer, errNetwork, errInvalidResponse, errOther:
		return true
	case errUnauthorized, errConflict:
		return note
	}
	return false
}

// clipBody renders at most maxLoggedBody bytes of a response body for an
// error: valid UTF-8, control characters escaped, and the full size.
func clipBody(body []byte) string {
	b := body
	if len(b) > maxLoggedBody {
		b = b[:maxLoggedBody]
	}
	s := strings.ToValidUTF8(string(b), "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(body) > maxLoggedBody {
		return fmt.Sprintf("%q… (%d bytes)", s, len(body))
	}
	return strconv.Quote(s)
}

// clipText bounds an error text, cutting at a rune boundary.
func clipText(s string) string {
	if len(s) <= maxErrText {
		return s
	}
	cut := maxErrText
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("… (%d bytes in all)", len(s))
}

// apiEnvelope is every Bot API answer.
type apiEnvelope struct {
	OK          bool            `json:"ok"`
	Result      json.RawMessage `json:"result"`
	ErrorCode   int             `json:"error_code"`
	Description string          `json:"description"`
	Parameters  struct {
		RetryAfter int `json:"retry_after"`
	} `json:"parameters"`
}

// call posts form to method and decodes the result into dest. Its errors
// are *callError; their text never carries more than maxLoggedBody bytes of
// the body (it may carry the token in a URL: callers scrub).
func (b *Bot) call(ctx context.Context, method string, form url.Values, dest any) error {
	u := b.apiURL + "/bot" + b.currentToken() + "/" + method
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, strings.NewReader(form.Encode()))
	if err != nil {
		return &callError{kind: errOther, msg: fmt.Sprintf("%s: build request: %v", method, err)}
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := b.pollClient.Do(req)
	if err != nil {
		return &callError{kind: errNetwork, msg: fmt.Sprintf("%s: %v", method, err)}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		return &callError{kind: errNetwork, code: resp.StatusCode, msg: fmt.Sprintf("%s: read the answer (HTTP %d): %v", method, resp.StatusCode, err)}
	}
	if len(body) > maxResponseBytes {
		return &callError{kind: errInvalidResponse, code: resp.StatusCode, msg: fmt.Sprintf("%s: answer larger than %d bytes (HTTP %d)", method, maxResponseBytes, resp.StatusCode)}
	}
	// An answer of maxResponseBytes could hold millions of values, each
	// allocated by the decoder: bounded before it is decoded.
	if _, err := jsonlimit.Check(body, jsonlimit.Default); err != nil {
		var le *jsonlimit.Error
		if errors.As(err, &le) && le.Kind != "syntax" {
			return &callError{kind: errInvalidResponse, code: resp.StatusCode, msg: fmt.Sprintf("%s: answer refused before decoding (HTTP %d): %v", method, resp.StatusCode, err)}
		}
	}
	var env apiEnvelope
	if err := json.Unmarshal(body, &env); err != nil {
		kind := errInvalidResponse
		if resp.StatusCode >= 400 {
			kind = kindOfCode(resp.StatusCode)
		}
		return &callError{kind: kind, code: resp.StatusCode,
			msg: fmt.Sprintf("%s: invalid answer (HTTP %d, %d bytes, not the Bot API's JSON: %v): %s", method, resp.StatusCode, len(body), err, clipBody(body))}
	}
	if !env.OK {
		code := env.ErrorCode
		if code == 0 {
			code = resp.StatusCode
		}
		ce := &callError{kind: kindOfCode(code), code: code,
			msg: fmt.Sprintf("%s: Telegram answered %d: %s", method, code, clipText(env.Description))}
		if env.Parameters.RetryAfter > 0 {
			ce.retryAfter = min(time.Duration(env.Parameters.RetryAfter)*time.Second, maxRetryAfter)
			ce.msg += fmt.Sprintf(" (retry after %d s)", env.Parameters.RetryAfter)
		}
		return ce
	}
	if dest != nil {
		if err := json.Unmarshal(env.Result, dest); err != nil {
			return &callError{kind: errInvalidResponse, code: resp.StatusCode,
				msg: fmt.Sprintf("%s: invalid result (%v): %s", method, err, clipBody(env.Result))}
		}
	}
	return nil
}

// getUpdates long-polls once and returns the raw updates.
func (b *Bot) getUpdates(ctx context.Context, offset int64) ([]json.RawMessage, error) {
	form := url.Values{
		"timeout":         {strconv.Itoa(max(int((b.pollTimeout - time.Second).Seconds()), 0))},
		"allowed_updates": {`["message"]`},
	}
	if offset > 0 {
		form.Set("offset", strconv.FormatInt(offset, 10))
	}
	// A Bot API that accepts the call and never answers must show within
	// the long poll plus a margin, not at some client timeout.
	limit := b.pollTimeout + b.hangMargin
	sent := b.now()
	cctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var raw []json.RawMessage
	if err := b.call(cctx, "getUpdates", form, &raw); err != nil {
		if ctx.Err() == nil && errors.Is(cctx.Err(), context.DeadlineExceeded) {
			return nil, &callError{kind: errNetwork, since: sent, msg: fmt.Sprintf("getUpdates: no answer within %s (a long poll of %s plus %s): the Bot API hangs",
				limit, b.pollTimeout, b.hangMargin)}
		}
		return nil, err
	}
	return raw, nil
}

// decodeUpdate decodes one update. id is its update_id (-1 when even that
// cannot be read) and kind the first field besides update_id, for the log.
func decodeUpdate(raw json.RawMessage) (upd *models.Update, id int64, kind string, err error) {
	var head map[string]json.RawMessage
	id = -1
	if herr := json.Unmarshal(raw, &head); herr == nil {
		if v, ok := head["update_id"]; ok {
			if n, perr := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64); perr == nil {
				id = n
			}
		}
		for k := range head {
			if k != "update_id" && (kind == "" || k < kind) {
				kind = k
			}
		}
	}
	if len(kind) > 64 {
		kind = kind[:64]
	}
	upd = &models.Update{}
	if err := json.Unmarshal(raw, upd); err != nil {
		return nil, id, kind, err
	}
	if id < 0 {
		return nil, id, kind, errors.New("no update_id")
	}
	return upd, id, kind, nil
}

// poll long-polls until ctx ends, handing each decodable update to
// onUpdate in order and skipping the others.
func (b *Bot) poll(ctx context.Context) {
	var offset int64
	attempt := 0
	for ctx.Err() == nil {
		ups, err := b.getUpdates(ctx, offset)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if !b.backoff(ctx, "getUpdates", err, &attempt) {
				return
			}
			b.reachedAgain(ctx, err)
			continue
		}
		attempt = 0
		b.polled()
		advanced := false
		for _, raw := range ups {
			upd, id, kind, err := decodeUpdate(raw)
			if id >= offset {
				offset, advanced = id+1, true
			}
			if err != nil {
				b.skipped.Add(1)
				b.log.Warn("skipping a Telegram update that cannot be decoded", "update_id", id, "kind", kind, "err", clipText(err.Error()))
				continue
			}
			b.onUpdate(ctx, b.client(), upd)
			if ctx.Err() != nil {
				return
			}
		}
		if len(ups) > 0 && !advanced {
			// Not one update_id readable: the same batch would come back
			// at once. Back off as from a bad answer.
			err := &callError{kind: errInvalidResponse, msg: fmt.Sprintf("getUpdates: %d updates without a readable update_id", len(ups))}
			if !b.backoff(ctx, "getUpdates", err, &attempt) {
				return
			}
		}
	}
}

// backoff records a failed call (counter, state backing_off with the
// reason), logs it and waits: exponentially longer per attempt up to
// retryMax, and at least the retry_after Telegram asked for. A refused
// token is re-read from its source after the wait (it may have been
// rotated). It returns false when ctx ended.
func (b *Bot) backoff(ctx context.Context, method string, err error, attempt *int) bool {
	kind, after := classify(err)
	b.countError(kind)
	serr := b.scrub(err)
	delay := b.retryMin
	for i := 0; i < *attempt && delay < b.retryMax; i++ {
		delay *= 2
	}
	delay = min(delay, b.retryMax)
	*attempt++
	delay = max(delay, after)
	reason := fmt.Sprintf("%s failed (%s): %s", method, kind, serr)
	level, msg := slog.LevelWarn, "telegram API error; backing off"
	switch kind {
	case errUnauthorized:
		reason = fmt.Sprintf("%s from %s (%s answered %s); re-reading the token on every retry", api.TelegramTokenRefused, b.tokenSource, method, serr)
		level, msg = slog.LevelError, "telegram API refuses the bot token; retrying with backoff (rotate it in the token file or environment)"
	case errConflict:
		level, msg = slog.LevelError, "telegram API conflict: another process polls with this bot token, or a webhook is set (delete it); backing off"
	case errRateLimited:
		msg = "telegram API rate limit; waiting as long as it asks"
	}
	var since time.Time
	if ce, ok := err.(*callError); ok {
		since = ce.since
	}
	b.setStateSince(api.TelegramBackingOff, clipText(reason), since)
	b.log.Log(ctx, level, msg, "method", method, "kind", kind, "err", serr, "retry_in", delay, "token_source", b.tokenSource)
	if !b.sleep(ctx, delay) {
		return false
	}
	if kind == errUnauthorized {
		b.reloadToken()
	}
	return true
}

// reachedAgain asks getMe after a network failure of the long poll has been
// waited out: the next long poll answers only when it ends (up to
// pollTimeout), and until then the status would keep the old failure as
// if it still held. An answer puts the state back to polling at once.
func (b *Bot) reachedAgain(ctx context.Context, failed error) {
	if kind, _ := classify(failed); kind != errNetwork && kind != errServer {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, b.hangMargin)
	defer cancel()
	if _, err := b.client().GetMe(pctx); err == nil {
		b.setState(api.TelegramPolling, "")
	}
}
