package appliance

import (
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"gpuhost/units"
)

// States of the Telegram bot in TelegramStatus.State.
const (
	TelegramStarting   = "starting"    // connecting (getMe) for the first time
	TelegramPolling    = "polling"     // long-polling; commands are answered
	TelegramBackingOff = "backing_off" // the last call failed; retrying after a pause
	TelegramStopped    = "stopped"     // not running (start failed, or the daemon is stopping)
)

// TelegramStatus is the Telegram bot's health, as GET /api/status, the
// panel, the telegram.bot doctor check and /metrics show it. The counters
// count since the daemon started.
type TelegramStatus struct {
	State string `json:"state"`
	// Reason says why the bot is backing off or stopped (never the token).
	Reason string    `json:"reason,omitempty"`
	Since  time.Time `json:"since"`
	// Bot is the bot's @username once getMe succeeded.
	Bot string `json:"bot,omitempty"`
	// LastPoll is the end of the last successful getUpdates.
	LastPoll time.Time `json:"last_poll,omitzero"`
	// Errors counts failed Bot API calls by kind: unauthorized,
	// rate_limited, conflict, server, network, invalid_response, send.
	Errors map[string]uint64 `json:"errors"`
	// UpdatesSkipped counts updates that could not be decoded and were
	// skipped (the offset advanced past them).
	UpdatesSkipped uint64 `json:"updates_skipped"`
	// NotificationsDropped counts notifications given up on (queue full or
	// every retry failed).
	NotificationsDropped uint64 `json:"notifications_dropped"`
}

// TelegramStatusFunc reports the bot's current status.
type TelegramStatusFunc func() TelegramStatus

// SetTelegramStatus makes Status (and so /api/status, the panel and the
// metrics) include the Telegram bot's status from fn; nil removes it. The
// daemon calls it when telegram.enabled is set, also when the bot could
// not be started (with a stopped status that says why).
func (s *Supervisor) SetTelegramStatus(fn TelegramStatusFunc) {
	if fn == nil {
		s.telegram.Store(nil)
		return
	}
	s.telegram.Store(&fn)
}

// TelegramStatus returns the bot's status, or nil when there is no bot
// (telegram.enabled is false). Doctor.Telegram takes it.
func (s *Supervisor) TelegramStatus() *TelegramStatus {
	fn := s.telegram.Load()
	if fn == nil {
		return nil
	}
	st := (*fn)()
	return &st
}

// telegramSlot holds the status function; the zero value is "no bot".
type telegramSlot = atomic.Pointer[TelegramStatusFunc]

// telegramBackoffFail is how long the bot may back off for reasons other
// than a refused token before the doctor reports it as failing rather than
// warning (a short network blip is not a finding worth a red doctor).
const telegramBackoffFail = 5 * time.Minute

// telegramCheck is the doctor's telegram.bot check.
func telegramCheck(st *TelegramStatus, now time.Time) DoctorCheck {
	c := DoctorCheck{ID: "telegram.bot", Value: st.State}
	since := ""
	if !st.Since.IsZero() {
		since = fmt.Sprintf(" for %s", now.Sub(st.Since).Round(time.Second))
	}
	switch st.State {
	case TelegramPolling:
		c.Severity = units.SeverityOK
		c.Message = "polling the Bot API" + since
		if st.Bot != "" {
			c.Message = "@" + st.Bot + " is " + c.Message
		}
	case TelegramStarting:
		c.Severity = units.SeverityOK
		c.Message = "connecting to the Bot API" + since
	case TelegramBackingOff:
		c.Severity = units.SeverityWarn
		if strings.HasPrefix(st.Reason, TelegramTokenRefused) || now.Sub(st.Since) >= telegramBackoffFail {
			c.Severity = units.SeverityFail
		}
		c.Message = "not reaching Telegram" + since + ": " + st.Reason + "; notifications wait and are retried"
		c.Fix = "check the token (telegram.token_file / telegram.token_env; the bot re-reads it on every retry) and the network to the Bot API; `journalctl -u gpuhost` has the details"
	default:
		c.Severity = units.SeverityFail
		c.Message = "the bot is " + st.State + since
		if st.Reason != "" {
			c.Message += ": " + st.Reason
		}
		c.Fix = "fix the cause above (telegram.* in the config, the token), then restart gpuhost"
	}
	return c
}

// TelegramTokenRefused starts the Reason of a bot backing off because the
// Bot API answered 401: the doctor fails at once for it.
const TelegramTokenRefused = "Telegram refuses the bot token"
