package api

import "time"

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

// TelegramTokenRefused starts the Reason of a bot backing off because the
// Bot API answered 401: the doctor fails at once for it.
const TelegramTokenRefused = "Telegram refuses the bot token"
