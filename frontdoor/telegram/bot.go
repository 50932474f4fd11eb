// Package telegram is gpuhost's Telegram bot: `/gpu status` and `/gpu doctor`
// for the operator's phone, and notifications when a switch finishes or
// fails, a backend unit fails or the doctor turns red.
//
// Access follows DESIGN decision 1 (rights live in the server): the bot
// answers only senders on an allowlist kept in the state directory, and only
// `gpuhost pair approve CODE` on the machine adds to it. A stranger gets a
// one-time pairing code and nothing else; no chat text can change the
// allowlist, and the commands are read-only. The bot token (which Telegram
// puts in every API URL) is scrubbed from every log line and error.
//
// The bot long-polls getUpdates itself (poll.go), decoding each update on
// its own so that one it cannot decode is skipped rather than fatal, and
// sends with github.com/go-telegram/bot. It is one of the daemon's
// independent pieces and never gives up: every failure (a refused token
// included, which may be rotated) is retried with backoff, honouring a 429's
// retry_after, and shown by Status (GET /api/status, the panel, the
// telegram.bot doctor check, gpuhost_telegram_* on /metrics).
package telegram

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-telegram/bot"
	"github.com/go-telegram/bot/models"

	"gpuhost/api"
	"gpuhost/config"
	"gpuhost/internal/pairing"
	"gpuhost/internal/redactlog"
	"gpuhost/units"
)

// Supervisor is what the bot needs of the daemon's Supervisor (internal/assemble,
// which builds the bot, hands it over): state for the doctor schedule, status for /gpu status, and the event
// stream for notifications.
type Supervisor interface {
	State() api.State
	Status(ctx context.Context) api.Status
	Subscribe(since uint64) (<-chan api.Event, []api.Event, func())
	LastSeq() uint64
}

// ErrDisabled is returned by New when telegram.enabled is false, so that the
// caller can tell "off by config" from a broken setup.
var ErrDisabled = errors.New("telegram bot disabled (telegram.enabled is false)")

// Daemon are the daemon-wide facts the bot needs besides its telegram:
// section (internal/assemble builds them from gpuhost.yaml).
type Daemon struct {
	// StateDir holds the pairing store: the allowlist and pending codes.
	StateDir string
	// Profiles name the backend and served model in "switch done"
	// notifications.
	Profiles map[string]*units.Profile
	// AskEvery is the per-chat rate limit of /ask (agent.telegram_every;
	// 0 means 10 s).
	AskEvery time.Duration
	// DialBackend reaches the active backend for /status's health probe
	// (under systemd through its unix socket); nil dials TCP.
	DialBackend func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Bot is the Telegram front door. Build it with New, run it with Run.
type Bot struct {
	tc     config.TelegramConfig
	daemon Daemon
	sup    Supervisor
	doctor api.DoctorFunc
	log    *slog.Logger
	store  *pairing.Store

	tokenSource string // "environment variable X" or "telegram.token_file /p", for messages
	apiURL      string

	mu        sync.Mutex
	token     string   // in use; changes when a rotated token is read
	oldTokens []string // earlier tokens, still redacted
	st        api.TelegramStatus
	skipped   atomic.Uint64 // undecodable updates
	dropped   atomic.Uint64 // notifications given up on

	// Tunables: New sets the production values; this package's tests
	// shorten them before Run.
	pollTimeout time.Duration // long-poll length (getUpdates timeout + 1 s)
	hangMargin  time.Duration // a getUpdates unanswered pollTimeout+hangMargin after it left: the API hangs
	doctorFirst time.Duration // first periodic doctor run after start
	doctorEvery time.Duration
	retryMin    time.Duration // backoff of failed calls
	retryMax    time.Duration
	sendTimeout time.Duration
	now         func() time.Time
	sleep       func(ctx context.Context, d time.Duration) bool // false: ctx ended
	httpClient  *http.Client                                    // Bot API (nil: a default one)
	pollClient  *http.Client                                    // set by Run
	probe       *http.Client                                    // backend endpoint health

	running  atomic.Bool
	botName  string // our @username without "@", set before polling starts
	tgp      atomic.Pointer[bot.Bot]
	work     chan struct{} // bounds concurrent status/doctor commands
	notes    chan string   // notifications waiting to be sent
	handlers sync.WaitGroup
	ask      atomic.Pointer[askDoor] // nil: /ask answers that the agent is off

	// Messages from an invalid sender id (≤ 0; real Telegram sends none)
	// are logged at warn once per invalidLogEvery, at debug in between.
	invalidMu     sync.Mutex
	invalidLogged time.Time
	invalidQuiet  int // not logged at warn since invalidLogged
}

// invalidLogEvery is the window in which messages from invalid sender ids
// make one warn line: a fuzzer or a broken proxy sending many must not
// flood the log with errors about something the bot only ignores.
const invalidLogEvery = time.Minute

// New reads the bot token (tc.TokenFile, else the environment variable
// tc.TokenEnv) and prepares the bot of the telegram: section tc; it makes no network
// call. A missing or malformed token is an error naming where it was looked
// for, never containing the token. doctor may be nil (no /gpu doctor, no
// red-doctor notifications); log nil means slog.Default().
func New(tc config.TelegramConfig, d Daemon, sup Supervisor, doctor api.DoctorFunc, log *slog.Logger) (*Bot, error) {
	if sup == nil {
		return nil, errors.New("telegram: New needs a config and a supervisor")
	}
	if !tc.Enabled {
		return nil, ErrDisabled
	}
	token, source, err := readToken(tc)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	apiURL := strings.TrimRight(tc.APIURL, "/")
	if apiURL == "" {
		apiURL = "https://api.telegram.org"
	}
	b := &Bot{
		tc: tc, daemon: d, sup: sup, doctor: doctor,
		store:       pairing.New(d.StateDir),
		token:       token,
		tokenSource: source,
		apiURL:      apiURL,
		pollTimeout: defaultPollTimeout,
		hangMargin:  defaultHangMargin,
		doctorFirst: time.Minute,
		doctorEvery: 5 * time.Minute,
		retryMin:    time.Second,
		retryMax:    time.Minute,
		sendTimeout: 15 * time.Second,
		now:         time.Now,
		sleep:       realSleep,
		probe:       &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{Proxy: nil, DialContext: d.DialBackend}},
		work:        make(chan struct{}, 2),
		notes:       make(chan string, 32),
	}
	b.store.Now = func() time.Time { return b.now() }
	b.st = api.TelegramStatus{State: api.TelegramStarting, Since: time.Now(), Errors: map[string]uint64{}}
	b.log = slog.New(redactlog.New(log.Handler(), b.redact))
	return b, nil
}

var tokenRE = regexp.MustCompile(`^[0-9]{1,20}:[A-Za-z0-9_-]{1,200}$`)

// readToken returns the token and where it came from.
func readToken(tc config.TelegramConfig) (token, source string, err error) {
	if tc.TokenFile != "" {
		source = "telegram.token_file " + tc.TokenFile
		data, err := os.ReadFile(tc.TokenFile)
		if err != nil {
			return "", source, fmt.Errorf("read the telegram bot token (telegram.token_file): %w", err)
		}
		token = strings.TrimSpace(string(data))
		if token == "" {
			return "", source, fmt.Errorf("telegram bot token missing: telegram.token_file %s is empty", tc.TokenFile)
		}
	} else {
		if tc.TokenEnv == "" {
			return "", "", errors.New("telegram bot token missing: set telegram.token_env (an environment variable name) or telegram.token_file")
		}
		source = "environment variable " + tc.TokenEnv
		token = strings.TrimSpace(os.Getenv(tc.TokenEnv))
		if token == "" {
			return "", source, fmt.Errorf("telegram bot token missing: set the environment variable %s (telegram.token_env) or telegram.token_file", tc.TokenEnv)
		}
	}
	if !tokenRE.MatchString(token) {
		return "", source, fmt.Errorf("telegram bot token from %s is malformed (want the form 123456789:AA…, as @BotFather gives it)", source)
	}
	return token, source, nil
}

// Run connects and long-polls until ctx ends, answering commands and
// sending notifications. Every failure of the Bot API (unreachable, 5xx,
// 429, a refused token) is retried with backoff and reported in Status, so
// Run returns nil when ctx ends; an error only when the client cannot be
// built at all. The daemon logs it and carries on without the bot. Run may
// be called once.
func (b *Bot) Run(ctx context.Context) (err error) {
	if !b.running.CompareAndSwap(false, true) {
		return errors.New("telegram: Run called twice")
	}
	defer func() {
		reason := "the daemon is stopping"
		if err != nil {
			reason = clipText(err.Error())
		}
		b.setState(api.TelegramStopped, reason)
	}()
	since := b.sup.LastSeq() // notify about what happens from now on
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	b.pollClient = b.httpClientOrDefault()
	tg, err := b.newClient(b.currentToken())
	if err != nil {
		return b.scrub(fmt.Errorf("telegram: create client: %w", err))
	}
	b.tgp.Store(tg)
	me := b.connect(ctx)
	if me == nil {
		return nil
	}
	b.botName = me.Username
	b.mu.Lock()
	b.st.Bot = me.Username
	b.mu.Unlock()
	// getMe answered: the API is reached. The first long poll returns only
	// when it ends, and the status must not say starting (or the old
	// failure) until then.
	b.setState(api.TelegramPolling, "")
	b.log.Info("telegram bot polling", "bot", "@"+me.Username, "api", b.apiURL, "allow_groups", b.tc.AllowGroups,
		"allowlist", b.store.AllowlistPath())

	var bg sync.WaitGroup
	for _, fn := range []func(context.Context){
		func(ctx context.Context) { b.watchEvents(ctx, since) },
		b.sendNotes,
		b.watchDoctor,
		b.handOutLine,
	} {
		bg.Add(1)
		go func() { defer bg.Done(); fn(ctx) }()
	}
	b.poll(ctx) // returns when ctx ends
	cancel()
	b.handlers.Wait()
	bg.Wait()
	return nil
}

// newClient builds the library client (getMe, sendMessage) for token.
func (b *Bot) newClient(token string) (*bot.Bot, error) {
	return bot.New(token,
		bot.WithSkipGetMe(), // we call getMe ourselves, with retries
		bot.WithServerURL(b.apiURL),
		bot.WithHTTPClient(b.pollTimeout, b.pollClient),
		bot.WithDefaultHandler(func(context.Context, *bot.Bot, *models.Update) {}),
		bot.WithErrorsHandler(b.onLibError),
		bot.WithDebugHandler(func(string, ...any) {}),
	)
}

func (b *Bot) httpClientOrDefault() *http.Client {
	if b.httpClient != nil {
		return b.httpClient
	}
	// Longer than the long poll, so a quiet poll is never a client timeout.
	return &http.Client{Timeout: b.pollTimeout + b.hangMargin}
}

// connect calls getMe until it succeeds (backing off like the poll loop,
// a refused token included) or ctx ends (nil).
func (b *Bot) connect(ctx context.Context) *models.User {
	attempt := 0
	for {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		me, err := b.client().GetMe(cctx)
		cancel()
		if err == nil {
			return me
		}
		if ctx.Err() != nil {
			return nil
		}
		if !b.backoff(ctx, "getMe", err, &attempt) {
			return nil
		}
	}
}

// onLibError receives the library's background errors (none of them is a
// call's result; those come back from the calls).
func (b *Bot) onLibError(err error) {
	b.log.Warn("telegram client error", "err", b.scrub(err))
}

// onUpdate handles one update, in order. It decides access first: only
// private chats (and groups when allowed) from human senders; allowlisted
// senders get answers, strangers in private chats get a pairing code, and
// everyone else gets nothing.
func (b *Bot) onUpdate(ctx context.Context, tg *bot.Bot, upd *models.Update) {
	m := upd.Message
	if m == nil || m.From == nil || m.From.IsBot {
		return
	}
	if m.From.ID <= 0 {
		b.invalidSender(m.From.ID, m.Chat.ID)
		return
	}
	private := false
	switch m.Chat.Type {
	case models.ChatTypePrivate:
		if m.Chat.ID != m.From.ID {
			return
		}
		private = true
	case models.ChatTypeGroup, models.ChatTypeSupergroup:
		if !b.tc.AllowGroups {
			return
		}
	default:
		return
	}
	allowed, err := b.store.Allowed(m.From.ID)
	if err != nil {
		b.log.Error("allowlist unreadable; ignoring the message (fail closed)", "user_id", m.From.ID, "err", err)
		return
	}
	if !allowed {
		if private {
			b.pair(ctx, tg, m)
		}
		return
	}
	if b.handleAsk(ctx, tg, m) {
		return
	}
	kind := parseCommand(m.Text, b.botName)
	switch kind {
	case cmdOtherBot:
		return
	case cmdNone:
		if !private {
			return // in groups, only /gpu commands are for us
		}
		b.reply(ctx, tg, m.Chat.ID, helpText)
	case cmdHelp, cmdUnknown:
		b.reply(ctx, tg, m.Chat.ID, helpText)
	case cmdStatus, cmdDoctor:
		select {
		case b.work <- struct{}{}:
		case <-ctx.Done():
			return
		}
		b.log.Info("telegram command", "user_id", m.From.ID, "chat_id", m.Chat.ID, "command", kind.String())
		b.handlers.Add(1)
		go func() {
			defer b.handlers.Done()
			defer func() { <-b.work }()
			var text string
			if kind == cmdStatus {
				text = b.statusText(ctx)
			} else {
				text = b.doctorText(ctx)
			}
			b.reply(ctx, tg, m.Chat.ID, text)
		}()
	}
}

// invalidSender ignores a message whose sender id is not a Telegram user
// id, logging it at warn once per invalidLogEvery (with how many were
// ignored quietly since) and at debug otherwise.
func (b *Bot) invalidSender(userID, chatID int64) {
	now := b.now()
	b.invalidMu.Lock()
	warn := b.invalidLogged.IsZero() || now.Sub(b.invalidLogged) >= invalidLogEvery
	quiet := b.invalidQuiet
	if warn {
		b.invalidLogged, b.invalidQuiet = now, 0
	} else {
		b.invalidQuiet++
	}
	b.invalidMu.Unlock()
	if warn {
		b.log.Warn("ignoring a message from an invalid sender id (not a Telegram user id); more in the next minute are logged at debug",
			"user_id", userID, "chat_id", chatID, "ignored_quietly_before", quiet)
		return
	}
	b.log.Debug("ignoring a message from an invalid sender id", "user_id", userID, "chat_id", chatID)
}

// pair answers a stranger in a private chat: a code, one reminder, then
// silence; never anything about the machine, whatever the message says.
// Codes the request freed for senders waiting in line go to their chats.
func (b *Bot) pair(ctx context.Context, tg *bot.Bot, m *models.Message) {
	out, err := b.store.Request(pairing.Sender{UserID: m.From.ID, ChatID: m.Chat.ID, Username: m.From.Username, FirstName: m.From.FirstName})
	b.sendGrants(ctx, out.Grants)
	if len(out.Evicted) > 0 {
		b.log.Warn("pairing flood: the oldest live pairing code was evicted for a new sender", "evicted_user_ids", out.Evicted,
			"live_max", pairing.MaxLivePending)
	}
	if err != nil {
		if errors.Is(err, pairing.ErrRateLimited) {
			// A flood: one line per refused sender would flood the log.
			b.log.Debug("pairing request refused for now; the sender waits in line", "user_id", m.From.ID, "err", err)
			return
		}
		b.log.Error("pairing request not recorded; not answering", "user_id", m.From.ID, "err", err)
		return
	}
	switch out.Action {
	case pairing.ActionNewCode:
		b.log.Info("pairing code sent to an unknown sender; the operator approves with `gpuhost pair list` and `gpuhost pair approve CODE`",
			"user_id", m.From.ID, "username", pairing.CleanName(m.From.Username))
		b.reply(ctx, tg, m.Chat.ID, pairingText(out.Code, pairing.CodeTTL))
	case pairing.ActionRemind:
		b.reply(ctx, tg, m.Chat.ID, reminderText(out.Code, out.ExpiresAt.Sub(b.now())))
	default:
		b.log.Debug("unknown sender already has a code and was reminded; not answering", "user_id", m.From.ID)
	}
}

// handOutLine moves the pairing line on its own clock: the codes the rate
// frees go to the senders waiting in line, unasked, whether or not anyone
// writes meanwhile.
func (b *Bot) handOutLine(ctx context.Context) {
	t := time.NewTicker(pairing.HandOutEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		grants, err := b.store.HandOut()
		if err != nil {
			b.log.Error("pairing line not moved", "err", err)
			continue
		}
		b.sendGrants(ctx, grants)
	}
}

// sendGrants sends each code freed for a sender who waited in line.
func (b *Bot) sendGrants(ctx context.Context, grants []pairing.Grant) {
	for _, g := range grants {
		b.log.Info("pairing code sent to a sender who waited in line for it", "user_id", g.UserID)
		b.reply(ctx, nil, g.ChatID, pairingText(g.Code, g.ExpiresAt.Sub(b.now())))
	}
}

// reply sends plain text (no parse mode: nothing in it is markup), with
// one retry when the failure is worth one (429 after its retry_after, 5xx,
// network). tg is ignored: every try uses the current client, so that a
// rotated token is used at once.
func (b *Bot) reply(ctx context.Context, _ *bot.Bot, chatID int64, text string) {
	_ = b.send(ctx, chatID, text, 2, false)
}

// send tries up to attempts times with backoff, honouring retry_after.
func (b *Bot) send(ctx context.Context, chatID int64, text string, attempts int, note bool) error {
	delay := b.retryMin
	for i := 1; ; i++ {
		sctx, cancel := context.WithTimeout(ctx, b.sendTimeout)
		_, err := b.client().SendMessage(sctx, &bot.SendMessageParams{ChatID: chatID, Text: truncate(text)})
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		kind, after := classify(err)
		b.countError(kind)
		serr := b.scrub(err)
		// A reply waits at most maxReplyWait: it may be holding up the
		// poll loop, and a late answer is worth less than the next one.
		if i >= attempts || !retryable(kind, note) || (!note && after > maxReplyWait) {
			b.log.Warn("send telegram message", "chat_id", chatID, "kind", kind, "attempts", i, "err", serr)
			return serr
		}
		wait := max(delay, after)
		b.log.Info("send telegram message failed; retrying", "chat_id", chatID, "kind", kind, "retry_in", wait, "err", serr)
		if !b.sleep(ctx, wait) {
			return ctx.Err()
		}
		delay = min(delay*2, b.retryMax)
	}
}

// statusText gathers the status and probes the active endpoint.
func (b *Bot) statusText(ctx context.Context) string {
	sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	st := b.sup.Status(sctx)
	return formatStatus(st, b.probeEndpoint(sctx, st), b.now())
}

// probeEndpoint asks the active backend its health endpoint, as the
// Supervisor does when it waits for readiness.
func (b *Bot) probeEndpoint(ctx context.Context, st api.Status) health {
	if st.State.Phase != api.PhaseActive {
		return health{}
	}
	p, ok := profileInfo(st, st.State.Profile)
	if !ok || p.Port <= 0 {
		return health{}
	}
	path := units.HealthPath(p.Backend)
	u := fmt.Sprintf("http://127.0.0.1:%d%s", p.Port, path)
	h := health{Checked: true, URL: path}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		h.Detail = err.Error()
		return h
	}
	t0 := time.Now()
	resp, err := b.probe.Do(req)
	if err != nil {
		h.Detail = "unreachable: " + err.Error()
		return h
	}
	resp.Body.Close()
	h.OK = resp.StatusCode == http.StatusOK
	h.Detail = fmt.Sprintf("%d in %d ms", resp.StatusCode, time.Since(t0).Milliseconds())
	return h
}

func (b *Bot) doctorText(ctx context.Context) string {
	if b.doctor == nil {
		return "doctor is not available in this process; run gpuhost doctor on the machine"
	}
	dctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return formatDoctor(b.doctor(dctx, ""))
}

// redact removes the tokens (current and earlier ones, and their secret
// halves, raw or URL-escaped) from s.
func (b *Bot) redact(s string) string {
	b.mu.Lock()
	tokens := append([]string{b.token}, b.oldTokens...)
	b.mu.Unlock()
	for _, tok := range tokens {
		if tok == "" {
			continue
		}
		secrets := []string{tok, url.PathEscape(tok), url.QueryEscape(tok)}
		if _, secret, ok := strings.Cut(tok, ":"); ok && len(secret) >= 8 {
			secrets = append(secrets, secret)
		}
		for _, sec := range secrets {
			s = strings.ReplaceAll(s, sec, "<redacted>")
		}
	}
	return s
}

// scrub returns err with the tokens removed from its text and the text
// bounded (the library puts whole response bodies into its errors);
// errors.Is still sees the sentinels inside (bot.ErrorUnauthorized,
// context errors), but Unwrap is not offered, so the unredacted text cannot
// be reached.
func (b *Bot) scrub(err error) error {
	if err == nil {
		return nil
	}
	return &scrubbedError{msg: clipText(b.redact(err.Error())), inner: err}
}

type scrubbedError struct {
	msg   string
	inner error
}

func (e *scrubbedError) Error() string        { return e.msg }
func (e *scrubbedError) Is(target error) bool { return errors.Is(e.inner, target) }
