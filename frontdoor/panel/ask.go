package panel

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"gpuhost/agent"
)

// Asker is the agent loop as the Ask page uses it. Hand SetAsker the same
// *agent.Limiter the API and the bot get, so the bound on concurrent loops
// holds across all of them; any other Asker gets a Limiter of its own.
type Asker interface {
	Ask(ctx context.Context, question string, emit func(agent.Event)) agent.Result
}

// askState is what SetAsker derives from an Asker: the bounded loop for the
// form fallback and the SSE handler for the page's script.
type askState struct {
	lim    *agent.Limiter
	stream *agent.Handler
}

// SetAsker enables the Ask page; without it (or with a nil Asker, also a
// nil *agent.Limiter) the page says the agent is disabled. It may be
// called before or after Register.
func (p *Panel) SetAsker(a Asker) {
	var st *askState
	lim, isLim := a.(*agent.Limiter)
	if !isLim && a != nil {
		lim = agent.NewLimiter(a, agent.DefaultMaxConcurrent)
	}
	if lim != nil { // a nil *agent.Limiter means disabled, like nil
		st = &askState{lim: lim, stream: agent.NewHandler(lim, p.log)}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ask = st
}

func (p *Panel) askState() *askState {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.ask
}

// askView is the body of the Ask page.
type askView struct {
	Disabled bool
	Question string
	Notice   string
	Rows     []askRow
}

// askRow is one timeline entry as both the template and static/ask.js
// render it (the script carries the same words; keep them in step).
type askRow struct {
	Kind     string // the event kind
	Step     int
	Label    string
	Tool     string
	Detail   string
	Code     bool // Detail is arguments (monospace)
	Latency  string
	Failed   bool // a tool result with isError
	Recovery bool // in the step after a failed call
	Badge    bool // first row of a recovery step: carries the label
	Text     string
	Title    string
	Reason   string // stop rows: the reason, for the class
}

// stopWords says why the loop ended, in the panel's words.
var stopWords = map[string]string{
	agent.StopAnswer:   "answered",
	agent.StopMaxSteps: "step cap reached",
	agent.StopTokens:   "token budget used up",
	agent.StopDeadline: "deadline passed",
	agent.StopEmpty:    "the model returned neither text nor a tool call",
	agent.StopError:    "the model endpoint failed",
	agent.StopCanceled: "canceled",
	agent.StopInvalid:  "invalid question",
	agent.StopBusy:     "busy",
}

// askRows folds a timeline into rows: failed calls are marked, and the
// rows of the step after one are the model's recovery.
func askRows(events []agent.Event) []askRow {
	failedSteps := map[int]bool{}
	badged := map[int]bool{}
	rows := make([]askRow, 0, len(events))
	for _, e := range events {
		r := askRow{Kind: e.Kind, Step: e.Step}
		if e.Step > 1 && failedSteps[e.Step-1] && e.Kind != agent.EventStop {
			r.Recovery = true
			if !badged[e.Step] {
				r.Badge, badged[e.Step] = true, true
			}
		}
		switch e.Kind {
		case agent.EventStart:
			r.Label = "question"
			r.Text = e.Text
			r.Detail = fmt.Sprintf("%d tools offered", len(e.Tools))
			r.Title = strings.Join(e.Tools, ", ")
		case agent.EventModel:
			r.Label = "model request"
			r.Detail = fmt.Sprintf("%d + %d tokens", e.PromptTokens, e.CompletionTokens)
			if e.Model != "" {
				r.Detail += " · " + e.Model
			}
			r.Latency = formatDuration(e.LatencyMS)
		case agent.EventToolCall:
			r.Label, r.Tool, r.Detail, r.Code = "tool call", e.Tool, e.Arguments, true
		case agent.EventToolResult:
			r.Label, r.Tool, r.Detail = "tool result", e.Tool, e.Result
			r.Latency = formatDuration(e.LatencyMS)
			if e.IsError {
				r.Failed = true
				failedSteps[e.Step] = true
			}
		case agent.EventAnswer:
			r.Label, r.Text = "answer", e.Text
		case agent.EventStop:
			r.Label, r.Reason = "stopped", e.Reason
			words, ok := stopWords[e.Reason]
			if !ok {
				words = e.Reason
			}
			r.Detail = words
			switch {
			case e.Text == "":
			case e.Reason == agent.StopAnswer:
				r.Detail = e.Text // the loop's own summary says it answered
			default:
				r.Detail += ": " + e.Text
			}
		default:
			r.Label, r.Detail = e.Kind, e.Text
		}
		rows = append(rows, r)
	}
	return rows
}

func (p *Panel) handleAsk(c echo.Context) error {
	return p.render(c, http.StatusOK, "ask", p.pageData(c, "ask", "Ask", askView{Disabled: p.askState() == nil}))
}

// handleAskForm answers the form without JavaScript: the loop runs to its
// end (bounded by agent.deadline) and the page shows the whole timeline.
func (p *Panel) handleAskForm(c echo.Context) error {
	st := p.askState()
	if st == nil {
		return p.render(c, http.StatusServiceUnavailable, "ask", p.pageData(c, "ask", "Ask", askView{Disabled: true}))
	}
	q := c.FormValue("question")
	v := askView{Question: q}
	if strings.TrimSpace(q) == "" {
		v.Notice = "Type a question first."
		return p.render(c, http.StatusBadRequest, "ask", p.pageData(c, "ask", "Ask", v))
	}
	var events []agent.Event
	res := st.lim.Ask(c.Request().Context(), q, func(e agent.Event) { events = append(events, e) })
	v.Rows = askRows(events)
	code := http.StatusOK
	if res.Stop == agent.StopBusy {
		code = http.StatusTooManyRequests
		v.Notice = st.lim.BusyMessage()
	}
	return p.render(c, code, "ask", p.pageData(c, "ask", "Ask", v))
}

// handleAskStream is the page script's endpoint: POST /api/ask's SSE
// answer behind the panel's session and CSRF checks.
func (p *Panel) handleAskStream(c echo.Context) error {
	st := p.askState()
	if st == nil {
		return agent.NewHandler(nil, p.log).Serve(c)
	}
	return st.stream.Serve(c)
}
