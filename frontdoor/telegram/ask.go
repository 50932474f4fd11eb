package telegram

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/go-telegram/bot"
	"github.com/go-telegram/bot/models"

	"gpuhost/agent"
)

// Asker is the agent loop as /ask uses it. Hand SetAsker the daemon's
// *agent.Limiter (shared with the API and the panel), so the bound on
// concurrent loops holds across every front door.
type Asker interface {
	Ask(ctx context.Context, question string, emit func(agent.Event)) agent.Result
}

// askUsage answers a bare /ask.
const askUsage = `Usage: /ask <question>
Example: /ask how warm is the GPU, and how much memory is free?
The box's own model answers, using read-only tools; the reply lists the tools it used.`

// askWorking is the immediate reply: a loop takes seconds to minutes.
const askWorking = "working…"

// askDisabled answers /ask when the daemon runs no agent.
const askDisabled = "The agent is not enabled on this machine (agent.disabled in gpuhost's config)."

// askDoor is /ask's state: the loop, the per-chat rate limit and the
// chats with a question in flight.
type askDoor struct {
	asker Asker
	every time.Duration

	mu      sync.Mutex
	running map[int64]bool
	last    map[int64]time.Time // when the chat's last question started
}

// SetAsker enables /ask for allowlisted senders; call it before Run. The
// per-chat rate limit is Daemon.AskEvery (agent.telegram_every, default 10 s).
func (b *Bot) SetAsker(a Asker) {
	if l, ok := a.(*agent.Limiter); a == nil || (ok && l == nil) {
		b.ask.Store(nil) // a nil *agent.Limiter means disabled, like nil
		return
	}
	every := b.daemon.AskEvery
	if every <= 0 {
		every = 10 * time.Second
	}
	b.ask.Store(&askDoor{asker: a, every: every, running: map[int64]bool{}, last: map[int64]time.Time{}})
}

// askKind is what parseAsk found.
type askKind int

const (
	askNone     askKind = iota // not /ask
	askOtherBot                // /ask@someoneelse
	askEmpty                   // /ask without a question
	askQuestion
)

// parseAsk reads "/ask <question>" and "/ask@botname <question>" (groups).
// The question is everything after the command word, trimmed; it may span
// lines. botName is our username without "@" (case-insensitive).
func parseAsk(text, botName string) (string, askKind) {
	if !utf8.ValidString(text) {
		return "", askNone
	}
	s := strings.TrimLeftFunc(text, unicode.IsSpace)
	head, rest := s, ""
	if i := strings.IndexFunc(s, unicode.IsSpace); i >= 0 {
		head, rest = s[:i], s[i:]
	}
	cmd, addressee, addressed := strings.Cut(head, "@")
	if cmd != "/ask" {
		return "", askNone
	}
	if addressed && (botName == "" || !strings.EqualFold(addressee, botName)) {
		return "", askOtherBot
	}
	q := strings.TrimSpace(rest)
	if q == "" {
		return "", askEmpty
	}
	return q, askQuestion
}

// handleAsk answers an /ask message from an allowlisted sender and reports
// whether the message was one (so onUpdate does not treat it as anything
// else). The loop runs in its own goroutine; the reply comes when it ends.
func (b *Bot) handleAsk(ctx context.Context, tg *bot.Bot, m *models.Message) bool {
	q, kind := parseAsk(m.Text, b.botName)
	switch kind {
	case askNone:
		return false
	case askOtherBot:
		return true
	}
	door := b.ask.Load()
	if door == nil {
		b.reply(ctx, tg, m.Chat.ID, askDisabled)
		return true
	}
	if kind == askEmpty {
		b.reply(ctx, tg, m.Chat.ID, askUsage)
		return true
	}
	chat := m.Chat.ID
	now := b.now()
	if refusal := door.begin(chat, now); refusal != "" {
		b.log.Info("telegram /ask refused", "user_id", m.From.ID, "chat_id", chat, "reason", refusal)
		b.reply(ctx, tg, chat, refusal)
		return true
	}
	b.log.Info("telegram /ask", "user_id", m.From.ID, "chat_id", chat, "question_bytes", len(q))
	b.handlers.Add(1)
	go func() {
		defer b.handlers.Done()
		defer door.end(chat)
		b.reply(ctx, tg, chat, askWorking)
		t0 := b.now()
		var events []agent.Event
		res := door.asker.Ask(ctx, q, func(e agent.Event) { events = append(events, e) })
		if ctx.Err() != nil {
			return // the bot is stopping; nobody to answer
		}
		b.log.Info("telegram /ask answered", "chat_id", chat, "stop", res.Stop, "steps", res.Steps, "tool_errors", res.Errors)
		// The loop is over: a question sent after the answer arrives must
		// not be told the previous one still runs.
		door.end(chat)
		b.reply(ctx, tg, chat, formatAskReply(res, events, b.now().Sub(t0)))
	}()
	return true
}

// begin claims the chat's slot, or says why not: a question still running
// in the chat, or the last one started less than `every` ago.
func (d *askDoor) begin(chat int64, now time.Time) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.running[chat] {
		return "I'm still working on your previous question; its answer comes first."
	}
	if last, ok := d.last[chat]; ok {
		if wait := d.every - now.Sub(last); wait > 0 {
			secs := int((wait + time.Second - 1) / time.Second)
			return fmt.Sprintf("Please wait %d s before the next /ask.", secs)
		}
	}
	for c, t := range d.last { // forget chats whose limit has passed
		if now.Sub(t) >= d.every {
			delete(d.last, c)
		}
	}
	d.running[chat], d.last[chat] = true, now
	return ""
}

func (d *askDoor) end(chat int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.running, chat)
}

// askStopWords says why a loop ended without an answer.
var askStopWords = map[string]string{
	agent.StopMaxSteps: "the step cap was reached",
	agent.StopTokens:   "the token budget was used up",
	agent.StopDeadline: "the deadline passed",
	agent.StopEmpty:    "the model returned neither text nor a tool call",
	agent.StopError:    "the model endpoint failed",
	agent.StopCanceled: "the question was canceled",
	agent.StopInvalid:  "the question was not accepted",
	agent.StopBusy:     "the box is busy",
}

// maxTraceTools bounds the tools the trace lists; the rest is counted.
const maxTraceTools = 12

// formatAskReply is the answer (or why there is none) and a compact trace:
// each tool call with ✓ or ✗, the error count, steps, time and the stop
// reason. The trace always fits; the answer is clipped to make room.
func formatAskReply(res agent.Result, events []agent.Event, took time.Duration) string {
	var tools []string
	nErr, steps := 0, res.Steps
	stop := res.Stop
	stopText := ""
	for _, e := range events {
		switch e.Kind {
		case agent.EventToolResult:
			mark := "✓"
			if e.IsError {
				mark = "✗"
				nErr++
			}
			tools = append(tools, clip(oneLineText(e.Tool), 64)+" "+mark)
		case agent.EventStop:
			stop, stopText = e.Reason, e.Text
		}
		steps = max(steps, e.Step)
	}
	nErr = max(nErr, res.Errors)
	var trace strings.Builder
	trace.WriteString("\n\n— ")
	if len(tools) == 0 {
		trace.WriteString("no tools used")
	} else {
		shown := tools
		if len(shown) > maxTraceTools {
			shown = shown[:maxTraceTools]
		}
		trace.WriteString("tools: " + strings.Join(shown, ", "))
		if n := len(tools) - len(shown); n > 0 {
			fmt.Fprintf(&trace, " (+%d more)", n)
		}
	}
	fmt.Fprintf(&trace, " · errors: %d · steps: %d · %s · stop: %s", nErr, steps, humanDuration(took), clip(oneLineText(stop), 40))

	var head string
	switch {
	case stop == agent.StopAnswer && strings.TrimSpace(res.Answer) != "":
		head = strings.TrimSpace(res.Answer)
	case stop == agent.StopBusy:
		head = "The box is busy: " + stopText
		return clip(oneLineText(head), 1000) // no loop ran: no trace
	default:
		words, ok := askStopWords[stop]
		if !ok {
			words = "the loop stopped (" + stop + ")"
		}
		head = "No answer: " + words
		if stopText != "" {
			head += ": " + stopText
		}
	}
	head = strings.ToValidUTF8(head, "\uFFFD")
	tail := strings.ToValidUTF8(trace.String(), "\uFFFD")
	room := maxMessageUnits - utf16Len(tail)
	return clipUnits(head, room) + tail
}

// clipUnits keeps s within n UTF-16 code units (Telegram's measure),
// ending with "…" when cut.
func clipUnits(s string, n int) string {
	if utf16Len(s) <= n {
		return s
	}
	if n < 1 {
		return ""
	}
	used := 0
	for i, r := range s {
		w := utf16.RuneLen(r)
		if w < 0 {
			w = 1
		}
		if used+w > n-1 {
			return s[:i] + "…"
		}
		used += w
	}
	return s
}

// oneLineText keeps a name or reason on one line.
func oneLineText(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
