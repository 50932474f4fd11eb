package sink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/go-telegram/bot"
	"github.com/go-telegram/bot/models"

	"gpuhost/internal/pairing"
)

// Telegram defaults.
const (
	// DefaultTelegramAPIURL is the Bot API server.
	DefaultTelegramAPIURL = "https://api.telegram.org"
	// DefaultTelegramTimeout bounds one sendMessage.
	DefaultTelegramTimeout = 15 * time.Second
	// maxDelivered bounds the keys remembered as partly delivered.
	maxDelivered = 1000
)

// TelegramOptions configures the Telegram sink.
type TelegramOptions struct {
	// Token returns the bot token (the daemon's bot, 123456:AA…). It is
	// called for every Post; its error for a missing token must name where
	// the token is looked for.
	Token func() (string, error)
	// TokenSource says where the token comes from, for messages. Optional.
	TokenSource string
	// APIURL is the Bot API server base (default DefaultTelegramAPIURL).
	APIURL string
	// StateDir is gpuhost's state directory; the pairing allowlist
	// (<StateDir>/telegram/allowlist.json) says who gets posts.
	StateDir string
	// ImportantOnly sends only posts with Important set.
	ImportantOnly bool
	// HTTPClient is used for every call; nil means a plain client (each
	// call is bounded by Timeout through its context).
	HTTPClient *http.Client
	// Timeout bounds one sendMessage (default DefaultTelegramTimeout).
	Timeout time.Duration
	// Log gets per-chat failures that a retry cannot fix; nil means
	// slog.Default().
	Log *slog.Logger
}

// Telegram sends triage results to every allowlisted user's private chat
// with the daemon's bot (sendMessage, plain text without parse mode, link
// previews off). It implements Sink, not Checker: the Bot API cannot list
// what a bot sent, so a crash between sending and recording can repeat a
// Telegram message.
//
// The allowlist is read for every post, so `gpuhost pair revoke` takes
// effect at the next post, and an unreadable allowlist sends nothing and is
// an error (fail closed). With nobody paired, Post sends nothing and
// returns nil: that is a valid setup (Telegram enabled, pairing not done
// yet), and an error would make the worker retry every mail forever.
//
// Failures per chat: a chat that can never be reached (the user blocked
// the bot, the chat is gone: Telegram's 403 and 400) is logged with its
// chat id and skipped, since retrying cannot help; any other failure
// (network, 5xx, 429 twice) is returned, naming the chat id, so the worker
// retries. A refused token (401) stops the post at the first chat. A retry
// in the same process does not resend to the chats that already got the
// post.
type Telegram struct {
	o       TelegramOptions
	store   *pairing.Store
	apiURL  string
	hc      *http.Client
	timeout time.Duration
	log     *slog.Logger

	mu sync.Mutex
	// delivered holds, per key of a post that failed for some chats, the
	// chats that got it.
	delivered map[string]map[int64]bool
}

var _ Sink = (*Telegram)(nil)

// telegramTokenRE is the shape @BotFather gives; it also keeps anything
// that would change the URL path ("/", "?") out of the Bot API URL.
var telegramTokenRE = regexp.MustCompile(`^[0-9]{1,20}:[A-Za-z0-9_-]{1,200}$`)

// NewTelegram checks the options; it makes no network call and does not
// read the token or the allowlist yet.
func NewTelegram(o TelegramOptions) (*Telegram, error) {
	if o.Token == nil {
		return nil, errors.New("telegram sink: no token source (TelegramOptions.Token is nil)")
	}
	if strings.TrimSpace(o.StateDir) == "" {
		return nil, errors.New("telegram sink: no state directory (the pairing allowlist lives there)")
	}
	apiURL := strings.TrimRight(strings.TrimSpace(o.APIURL), "/")
	if apiURL == "" {
		apiURL = DefaultTelegramAPIURL
	}
	u, err := url.Parse(apiURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("telegram sink: API URL %q is not an http(s) URL", apiURL)
	}
	t := &Telegram{
		o: o, store: pairing.New(o.StateDir), apiURL: apiURL,
		hc: o.HTTPClient, timeout: o.Timeout, log: o.Log,
		delivered: map[string]map[int64]bool{},
	}
	if t.hc == nil {
		t.hc = &http.Client{}
	}
	if t.timeout <= 0 {
		t.timeout = DefaultTelegramTimeout
	}
	if t.log == nil {
		t.log = slog.Default()
	}
	t.log = t.log.With("sink", "telegram")
	return t, nil
}

// Name is "telegram".
func (t *Telegram) Name() string { return "telegram" }

// Post sends Text(p) to every allowlisted user (see Telegram).
func (t *Telegram) Post(ctx context.Context, p Post) error {
	if t.o.ImportantOnly && !p.Important {
		return nil
	}
	allow, err := t.store.ReadAllowlist()
	if err != nil {
		return fmt.Errorf("telegram: post %s not sent: read the pairing allowlist: %w", p.Key, err)
	}
	if len(allow.Users) == 0 {
		t.log.Info("no Telegram user is paired; triage post not sent", "key", p.Key, "allowlist", t.store.AllowlistPath())
		return nil
	}
	tg, tok, err := t.client()
	if err != nil {
		return err
	}
	text := Text(p)
	var errs []error
	for _, u := range allow.Users {
		if t.wasDelivered(p.Key, u.ChatID) {
			continue
		}
		err := t.send(ctx, tg, u.ChatID, text)
		switch {
		case err == nil:
			t.markDelivered(p.Key, u.ChatID)
		case ctx.Err() != nil:
			return scrub(fmt.Errorf("telegram: send %s to chat %d: %w", p.Key, u.ChatID, err), tok)
		case errors.Is(err, bot.ErrorUnauthorized) || errors.Is(err, bot.ErrorNotFound):
			// The token is refused for every chat alike: stop here.
			return scrub(fmt.Errorf("telegram: send %s to chat %d: %w%s", p.Key, u.ChatID, err, t.hint(err)), tok)
		case errors.Is(err, bot.ErrorForbidden) || errors.Is(err, bot.ErrorBadRequest):
			t.log.Warn("telegram chat cannot receive the triage post; skipped (revoke the user with gpuhost pair revoke if this stays)",
				"key", p.Key, "chat_id", u.ChatID, "user_id", u.UserID, "err", redact(err.Error(), tok))
			t.markDelivered(p.Key, u.ChatID)
		default:
			errs = append(errs, scrub(fmt.Errorf("telegram: send %s to chat %d: %w%s", p.Key, u.ChatID, err, t.hint(err)), tok))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	t.forget(p.Key)
	return nil
}

// Alert sends an operator alert (poll failures, their reminder, the
// all-clear, a UIDVALIDITY re-baseline; see triage.Alerter) to every
// allowlisted chat, ImportantOnly or not: an alert is about the worker, not
// about a mail, and everyone who gets posts needs to know when none come.
// The text is one line of plain text, clipped to TelegramMaxUnits, link
// previews off. With nobody paired it sends nothing and returns nil, as
// Post does; an unreadable allowlist is an error.
//
// An alert that reached one chat has reached someone, so that is success
// and the chats that failed are logged (an error would make the worker send
// it again to the chats that have it). With no chat reached, the error is
// returned, naming the chats, never the token; a refused token stops at
// the first chat.
func (t *Telegram) Alert(ctx context.Context, text string) error {
	msg := alertLine(text, TelegramMaxUnits, func(s string) string { return s })
	if strings.TrimSpace(msg) == "" {
		return errors.New("telegram: the alert text is empty; nothing sent")
	}
	allow, err := t.store.ReadAllowlist()
	if err != nil {
		return fmt.Errorf("telegram: alert not sent: read the pairing allowlist: %w", err)
	}
	if len(allow.Users) == 0 {
		t.log.Info("no Telegram user is paired; alert not sent", "allowlist", t.store.AllowlistPath())
		return nil
	}
	tg, tok, err := t.client()
	if err != nil {
		return err
	}
	sent := 0
	var errs []error
	for _, u := range allow.Users {
		err := t.send(ctx, tg, u.ChatID, msg)
		if err == nil {
			sent++
			continue
		}
		errs = append(errs, scrub(fmt.Errorf("telegram: send the alert to chat %d: %w%s", u.ChatID, err, t.hint(err)), tok))
		if ctx.Err() != nil || errors.Is(err, bot.ErrorUnauthorized) || errors.Is(err, bot.ErrorNotFound) {
			break // the context ended or the token is refused: no other chat fares better
		}
	}
	switch {
	case len(errs) == 0:
		return nil
	case sent > 0:
		t.log.Error("telegram: the alert reached only some chats", "sent", sent, "err", errors.Join(errs...))
		return nil
	default:
		return errors.Join(errs...)
	}
}

// client reads the token and returns a Bot API client for one Post or
// Alert, with the token for scrubbing errors.
func (t *Telegram) client() (*bot.Bot, string, error) {
	tok, err := t.token()
	if err != nil {
		return nil, "", err
	}
	tg, err := bot.New(tok,
		bot.WithServerURL(t.apiURL),
		bot.WithSkipGetMe(),
		bot.WithHTTPClient(t.timeout, t.hc),
		bot.WithUpdatesChannelCap(1), // never polls
		bot.WithErrorsHandler(func(err error) {
			t.log.Warn("telegram client", "err", redact(err.Error(), tok))
		}),
		bot.WithDebugHandler(func(string, ...any) {}),
	)
	if err != nil {
		return nil, "", scrub(fmt.Errorf("telegram: create client: %w", err), tok)
	}
	return tg, tok, nil
}

func (t *Telegram) token() (string, error) {
	tok, err := t.o.Token()
	if err != nil {
		return "", fmt.Errorf("telegram: read the bot token: %w", err)
	}
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return "", fmt.Errorf("telegram: the bot token is empty%s", t.from())
	}
	if !telegramTokenRE.MatchString(tok) {
		return "", fmt.Errorf("telegram: the bot token%s is malformed (want the form 123456789:AA…, as @BotFather gives it)", t.from())
	}
	return tok, nil
}

func (t *Telegram) from() string {
	if t.o.TokenSource == "" {
		return ""
	}
	return " (" + t.o.TokenSource + ")"
}

func (t *Telegram) hint(err error) string {
	if errors.Is(err, bot.ErrorUnauthorized) || errors.Is(err, bot.ErrorNotFound) {
		return " (Telegram refuses the bot token" + t.from() + ")"
	}
	return ""
}

// send is one sendMessage, retried once after a 429 (bounded by ctx).
func (t *Telegram) send(ctx context.Context, tg *bot.Bot, chatID int64, text string) error {
	disabled := true
	params := &bot.SendMessageParams{
		ChatID: chatID,
		Text:   text,
		// A preview fetch of an unsubscribe link could unsubscribe.
		LinkPreviewOptions: &models.LinkPreviewOptions{IsDisabled: &disabled},
	}
	for attempt := 0; ; attempt++ {
		sctx, cancel := context.WithTimeout(ctx, t.timeout)
		_, err := tg.SendMessage(sctx, params)
		cancel()
		var tm *bot.TooManyRequestsError
		if err == nil || attempt > 0 || !errors.As(err, &tm) {
			return err
		}
		wait := time.Duration(tm.RetryAfter) * time.Second
		t.log.Warn("telegram rate limit; retrying once", "chat_id", chatID, "retry_after", wait)
		if werr := waitRetry(ctx, wait); werr != nil {
			return fmt.Errorf("%w (%w)", err, werr)
		}
	}
}

func (t *Telegram) wasDelivered(key string, chat int64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.delivered[key][chat]
}

func (t *Telegram) markDelivered(key string, chat int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.delivered[key]
	if m == nil {
		if len(t.delivered) >= maxDelivered {
			clear(t.delivered) // at worst a later retry repeats a message
		}
		m = map[int64]bool{}
		t.delivered[key] = m
	}
	m[chat] = true
}

func (t *Telegram) forget(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.delivered, key)
}
