package telegram

import (
	"context"
	"maps"
	"time"

	"github.com/go-telegram/bot"

	"gpuhost/api"
)

// Status is the bot's health for GET /api/status, the panel, the
// telegram.bot doctor check and /metrics (the daemon hands it to
// Supervisor.SetTelegramStatus).
func (b *Bot) Status() api.TelegramStatus {
	b.mu.Lock()
	st := b.st
	st.Errors = maps.Clone(b.st.Errors)
	b.mu.Unlock()
	if st.Errors == nil {
		st.Errors = map[string]uint64{}
	}
	for _, k := range ErrorKinds {
		st.Errors[k] += 0
	}
	st.UpdatesSkipped = b.skipped.Load()
	st.NotificationsDropped = b.dropped.Load()
	return st
}

// StoppedStatus is the status of a bot that could not be started (New
// failed): stopped, with err as the reason.
func StoppedStatus(err error, now time.Time) api.TelegramStatusFunc {
	reason := "not started"
	if err != nil {
		reason = clipText(err.Error())
	}
	errs := map[string]uint64{}
	for _, k := range ErrorKinds {
		errs[k] = 0
	}
	return func() api.TelegramStatus {
		return api.TelegramStatus{State: api.TelegramStopped, Reason: reason, Since: now, Errors: maps.Clone(errs)}
	}
}

// setState moves to state with reason; Since changes only with the state,
// so it tells how long the bot has been backing off whatever the reasons.
func (b *Bot) setState(state, reason string) { b.setStateSince(state, reason, time.Time{}) }

// setStateSince is setState for a state that began before now (a hang
// began when the unanswered call left); zero since means now.
func (b *Bot) setStateSince(state, reason string, since time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.st.State != state {
		if since.IsZero() {
			since = b.now()
		}
		b.st.Since = since
	}
	b.st.State, b.st.Reason = state, reason
}

// polled records a successful getUpdates.
func (b *Bot) polled() {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	if b.st.State != api.TelegramPolling {
		b.st.Since = now
	}
	b.st.State, b.st.Reason, b.st.LastPoll = api.TelegramPolling, "", now
}

func (b *Bot) countError(kind string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.st.Errors == nil {
		b.st.Errors = map[string]uint64{}
	}
	b.st.Errors[kind]++
}

// currentToken is the token in use (it changes when a rotated one is read).
func (b *Bot) currentToken() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.token
}

// client is the library client for the current token (sendMessage, getMe).
func (b *Bot) client() *bot.Bot { return b.tgp.Load() }

// reloadToken re-reads the token from its source and, when it changed,
// switches every call to it. The old one stays redacted.
func (b *Bot) reloadToken() {
	tok, _, err := readToken(b.tc)
	if err != nil {
		b.log.Warn("re-read the telegram bot token", "err", err)
		return
	}
	b.mu.Lock()
	if tok == b.token {
		b.mu.Unlock()
		return
	}
	tg, err := b.newClient(tok)
	if err != nil {
		b.mu.Unlock()
		b.log.Warn("telegram client for the new bot token", "err", b.scrub(err))
		return
	}
	b.oldTokens = append(b.oldTokens, b.token)
	b.token = tok
	b.tgp.Store(tg)
	b.mu.Unlock()
	b.log.Info("telegram bot token changed in its source; using the new one", "token_source", b.tokenSource)
}

// realSleep waits d or until ctx ends (false).
func realSleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
