package appliance

import (
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"gpuhost/api"
	"gpuhost/units"
)

// SetTelegramStatus makes Status (and so /api/status, the panel and the
// metrics) include the Telegram bot's status from fn; nil removes it. The
// daemon calls it when telegram.enabled is set, also when the bot could
// not be started (with a stopped status that says why).
func (s *Supervisor) SetTelegramStatus(fn api.TelegramStatusFunc) {
	if fn == nil {
		s.telegram.Store(nil)
		return
	}
	s.telegram.Store(&fn)
}

// TelegramStatus returns the bot's status, or nil when there is no bot
// (telegram.enabled is false). Doctor.Telegram takes it.
func (s *Supervisor) TelegramStatus() *api.TelegramStatus {
	fn := s.telegram.Load()
	if fn == nil {
		return nil
	}
	st := (*fn)()
	return &st
}

// telegramSlot holds the status function; the zero value is "no bot".
type telegramSlot = atomic.Pointer[api.TelegramStatusFunc]

// telegramBackoffFail is how long the bot may back off for reasons other
// than a refused token before the doctor reports it as failing rather than
// warning (a short network blip is not a finding worth a red doctor).
const telegramBackoffFail = 5 * time.Minute

// telegramCheck is the doctor's telegram.bot check.
func telegramCheck(st *api.TelegramStatus, now time.Time) api.DoctorCheck {
	c := api.DoctorCheck{ID: "telegram.bot", Value: st.State}
	since := ""
	if !st.Since.IsZero() {
		since = fmt.Sprintf(" for %s", now.Sub(st.Since).Round(time.Second))
	}
	switch st.State {
	case api.TelegramPolling:
		c.Severity = units.SeverityOK
		c.Message = "polling the Bot API" + since
		if st.Bot != "" {
			c.Message = "@" + st.Bot + " is " + c.Message
		}
	case api.TelegramStarting:
		c.Severity = units.SeverityOK
		c.Message = "connecting to the Bot API" + since
	case api.TelegramBackingOff:
		c.Severity = units.SeverityWarn
		if strings.HasPrefix(st.Reason, api.TelegramTokenRefused) || now.Sub(st.Since) >= telegramBackoffFail {
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
