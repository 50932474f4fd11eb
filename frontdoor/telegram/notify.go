package telegram

import (
	"context"
	"fmt"
	"strings"
	"time"

	"gpuhost/api"
	"gpuhost/units"
)

// maxJournalLines is how much of a failed backend's journal a switch
// failure notification carries: enough to see why, short enough for a phone.
const maxJournalLines = 5

// noteState follows the event stream to decide what is worth a message.
type noteState struct {
	switching bool
	journal   []string // of the last failed step in the running switch
}

// note turns one Supervisor event into a notification text, or "" for
// events that are not worth one. A unit failing during a switch is left to
// the switch's own failure message, which says more.
func (n *noteState) note(e api.Event, profiles map[string]*units.Profile) string {
	switch e.Kind {
	case api.EventSwitch:
		switch e.Status {
		case api.StatusStarted:
			n.switching, n.journal = true, nil
		case api.StatusDone:
			n.switching, n.journal = false, nil
			what := e.Profile
			if p, ok := profiles[e.Profile]; ok && p != nil {
				what = fmt.Sprintf("%s (%s, %s)", p.Name, p.Backend, p.ServedName)
			}
			return fmt.Sprintf("✅ switch done: %s is active (%s)", what, humanDuration(time.Duration(e.DurationMS*float64(time.Millisecond))))
		case api.StatusFailed:
			var b strings.Builder
			msg := e.Message
			if msg == "" {
				msg = "switch to " + e.Profile + " failed"
			}
			b.WriteString("❌ " + clip(msg, 1500))
			if len(n.journal) > 0 {
				j := n.journal[max(0, len(n.journal)-maxJournalLines):]
				b.WriteString("\n\nlast journal lines:")
				for _, l := range j {
					b.WriteString("\n" + clip(l, 300))
				}
			}
			n.switching, n.journal = false, nil
			return b.String()
		}
	case api.EventStep:
		if e.Status == api.StatusFailed && len(e.Journal) > 0 {
			n.journal = e.Journal
		}
	case api.EventCrash:
		// A backend that died without gpuhost asking: the active one
		// (restarted, or given up on) or one in standby (dropped). The
		// unit events around it say less, so they are not notes.
		unit, _ := e.Detail[api.DetailUnit].(string)
		where, _ := e.Detail[api.DetailLog].(string)
		if where == "" {
			where = "its log: journalctl -u " + unit
		}
		return "💥 " + clip(e.Message, 1000) + "; " + strings.ReplaceAll(where, "`", "")
	case api.EventHeal:
		if e.Status != api.StatusFailed {
			return "" // the restart's own switch note says it is active again
		}
		var b strings.Builder
		b.WriteString("❌ " + clip(strings.ReplaceAll(e.Message, "`", ""), 1500))
		if len(e.Journal) > 0 {
			b.WriteString("\n\nlast journal lines:")
			for _, l := range e.Journal[max(0, len(e.Journal)-maxJournalLines):] {
				b.WriteString("\n" + clip(l, 300))
			}
		}
		return b.String()
	case api.EventPaused:
		return "⏸ " + clip(strings.ReplaceAll(e.Message, "`", ""), 1000)
	}
	return ""
}

// watchEvents follows the Supervisor's events from seq since on and queues
// notifications.
func (b *Bot) watchEvents(ctx context.Context, since uint64) {
	ch, backlog, cancel := b.sup.Subscribe(since)
	defer cancel()
	var n noteState
	handle := func(e api.Event) {
		if text := n.note(e, b.daemon.Profiles); text != "" {
			b.enqueue(text)
		}
	}
	for _, e := range backlog {
		handle(e)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case e := <-ch:
			handle(e)
		}
	}
}

// enqueue hands a notification to sendNotes without ever blocking the event
// stream; when Telegram is unreachable long enough to fill the queue (32),
// the notification is dropped and counted.
func (b *Bot) enqueue(text string) {
	select {
	case b.notes <- text:
	default:
		b.dropped.Add(1)
		b.log.Warn("telegram notification queue full; dropping a notification", "notification", firstLine(text))
	}
}

// sendNotes sends queued notifications to every allowlisted user's private
// chat. The allowlist is read per notification, so `gpuhost pair revoke`
// takes effect at once.
func (b *Bot) sendNotes(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case text := <-b.notes:
			a, err := b.store.ReadAllowlist()
			if err != nil {
				b.log.Error("allowlist unreadable; notification not sent (fail closed)", "err", err, "notification", firstLine(text))
				continue
			}
			for _, u := range a.Users {
				// Retried with backoff (429's retry_after honoured); the
				// queue above is what bounds the backlog meanwhile.
				if err := b.send(ctx, u.ChatID, text, noteAttempts, true); err != nil && ctx.Err() == nil {
					b.dropped.Add(1)
					b.log.Warn("telegram notification dropped after retries", "chat_id", u.ChatID, "attempts", noteAttempts, "notification", firstLine(text))
				}
			}
		}
	}
}

// watchDoctor runs the doctor periodically and notifies when it turns red
// (exit 2) and when it stops being red. Runs during a switch are skipped:
// a backend that is loading is not a finding.
func (b *Bot) watchDoctor(ctx context.Context) {
	if b.doctor == nil {
		return
	}
	red := false
	t := time.NewTimer(b.doctorFirst)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if b.sup.State().Phase == api.PhaseSwitching {
			t.Reset(min(b.doctorEvery, 30*time.Second))
			continue
		}
		dctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		rep := b.doctor(dctx, "")
		cancel()
		if ctx.Err() != nil {
			return
		}
		// The bot's own telegram.bot check does not count: a bot that
		// cannot reach Telegram cannot say so through Telegram.
		nowRed := false
		for _, c := range rep.Checks {
			nowRed = nowRed || (c.Severity == units.SeverityFail && c.ID != "telegram.bot")
		}
		switch {
		case nowRed && !red:
			b.log.Warn("doctor turned red; notifying", "worst", rep.Worst)
			b.enqueue("🔴 doctor turned red\n\n" + formatDoctor(rep))
		case !nowRed && red:
			b.enqueue(fmt.Sprintf("🟢 doctor is no longer red (worst now: %s)", rep.Worst))
		}
		red = nowRed
		t.Reset(b.doctorEvery)
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return clip(line, 120)
}
