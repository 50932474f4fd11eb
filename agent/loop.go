package agent

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	openai "github.com/sashabaranov/go-openai"
)

// systemPrompt is the loop's only instruction to the model; it is versioned
// by file name so a change is a visible, reviewable diff.
//
//go:embed system.v1.md
var systemPrompt string

// Defaults of config's `agent:` section, applied where Options are zero.
const (
	DefaultMaxSteps         = 6
	DefaultMaxTokens        = 32768
	DefaultMaxQuestionBytes = 4000
	DefaultDeadline         = 120 * time.Second
	DefaultToolTimeout      = 20 * time.Second
)

// Limits that keep one question from flooding a timeline, a context window
// or the daemon's memory.
const (
	// ExcerptBytes bounds a tool's arguments and result in an Event: enough
	// to read on a phone, short enough for a Telegram trace.
	ExcerptBytes = 2000
	// ModelResultBytes bounds one tool result handed back to the model
	// (about 4k tokens): a long listing must not push the question out of
	// a 32k context.
	ModelResultBytes = 16000
	// maxReplyBytes bounds one streamed model reply; a runaway stream is cut
	// before the token budget (known only at its end) could stop it.
	maxReplyBytes = 1 << 20
	// maxCallsPerStep bounds the tool calls run for one model reply.
	maxCallsPerStep = 16
	// maxToolPages bounds tools/list pagination (a server that keeps
	// returning cursors must not hang the loop).
	maxToolPages = 16
	// listModelsTimeout bounds GET /models within the question's deadline.
	listModelsTimeout = 15 * time.Second
)

// Agent runs questions through the tool-using loop. It holds no state
// between questions: tools are looked up again for every question and
// (when Options.Model is empty) the model before every step, so a reloaded
// connector or a switched backend, even one switched mid-question, is
// picked up at once. Safe for concurrent use.
type Agent struct {
	mcp  MCPClient
	opts Options
	oai  *openai.Client
	log  *slog.Logger
}

// New returns an Agent that lists and calls tools through c and talks to
// the OpenAI-compatible endpoint at o.BaseURL; zero Options fields take the
// defaults above.
func New(c MCPClient, o Options) *Agent {
	if o.MaxSteps <= 0 {
		o.MaxSteps = DefaultMaxSteps
	}
	if o.MaxTokens <= 0 {
		o.MaxTokens = DefaultMaxTokens
	}
	if o.MaxQuestionBytes <= 0 {
		o.MaxQuestionBytes = DefaultMaxQuestionBytes
	}
	if o.Deadline <= 0 {
		o.Deadline = DefaultDeadline
	}
	if o.ToolTimeout <= 0 {
		o.ToolTimeout = DefaultToolTimeout
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.HTTPClient == nil {
		// No client timeout: a stream lasts as long as the model writes;
		// the question's deadline (a context) bounds every request.
		o.HTTPClient = &http.Client{}
	}
	o.BaseURL = strings.TrimRight(o.BaseURL, "/")
	cfg := openai.DefaultConfig(o.APIKey)
	cfg.BaseURL = o.BaseURL
	cfg.HTTPClient = o.HTTPClient
	return &Agent{mcp: c, opts: o, oai: openai.NewClientWithConfig(cfg), log: o.Log}
}

// Ask answers question with the tools, streaming each step to emit (which
// may be nil) synchronously and in order, on the caller's goroutine. It
// never fails: an invalid question, an unreachable model, the step cap, the
// token budget, the deadline or ctx ending all end the timeline with an
// EventStop whose Reason and Text say what happened; that event is always
// the last, and Result.Events holds the whole timeline.
func (a *Agent) Ask(ctx context.Context, question string, emit func(Event)) Result {
	r := &run{a: a, emitFn: emit, started: time.Now(), res: Result{ToolsUsed: []string{}}}
	r.ask(ctx, question)
	a.log.Info("agent question finished", "stop", r.res.Stop, "steps", r.res.Steps,
		"tools", strings.Join(r.res.ToolsUsed, ","), "tool_errors", r.res.Errors, "tokens", r.tokens,
		"question_bytes", len(question), "duration_ms", time.Since(r.started).Milliseconds())
	return r.res
}

// run is the state of one question.
type run struct {
	a       *Agent
	emitFn  func(Event)
	res     Result
	step    int
	tokens  int
	started time.Time
	usedSet map[string]bool
	learned []outcome // every tool outcome so far, for a stop without an answer
}

func (r *run) emit(e Event) {
	e.Seq = len(r.res.Events) + 1
	e.Step = r.step
	e.Time = time.Now()
	r.res.Events = append(r.res.Events, e)
	if r.emitFn != nil {
		r.emitFn(e)
	}
}

func (r *run) stop(reason, text string) {
	r.res.Stop, r.res.Message, r.res.Steps = reason, text, r.step
	r.emit(Event{Kind: EventStop, Reason: reason, Text: text})
}

func (r *run) ask(parent context.Context, question string) {
	o := r.a.opts
	switch {
	case strings.TrimSpace(question) == "":
		r.stop(StopInvalid, `the question is empty; ask something, e.g. "what is the GPU status?"`)
		return
	case len(question) > o.MaxQuestionBytes:
		r.stop(StopInvalid, fmt.Sprintf("the question is %d bytes; the limit is %d (agent.max_question_bytes): shorten it", len(question), o.MaxQuestionBytes))
		return
	case !utf8.ValidString(question):
		r.stop(StopInvalid, "the question is not valid UTF-8 text")
		return
	}
	question = strings.TrimSpace(question)
	ctx, cancel := context.WithTimeout(parent, o.Deadline)
	defer cancel()

	ts, err := r.a.listTools(ctx)
	if err != nil {
		r.fail(parent, ctx, "listing the MCP tools", err)
		return
	}
	for _, name := range ts.refused {
		r.a.log.Warn("agent: tool not offered to the model: its annotations do not say read-only", "tool", name)
	}
	r.emit(Event{Kind: EventStart, Text: question, Tools: ts.names, Refused: ts.refused})

	msgs := []openai.ChatCompletionMessage{
		{Role: openai.ChatMessageRoleSystem, Content: systemPrompt},
		{Role: openai.ChatMessageRoleUser, Content: question},
	}
	model := o.Model
	for r.step = 1; r.step <= o.MaxSteps; r.step++ {
		if o.Model == "" {
			// Looked up before every step, not once per question: after a
			// switch began mid-question, /v1 lists the target first, and a
			// request for it is held until it is up, whereas one for the
			// old model would be refused (or, with proxy.auto_switch,
			// switch the box back).
			if model, err = r.a.firstModel(ctx); err != nil {
				r.fail(parent, ctx, "finding the model", err)
				return
			}
		}
		rep, err := r.a.chat(ctx, model, msgs, ts.tools)
		if err != nil && o.Model == "" && isNotFound(err) {
			// A switch began between the lookup and the request: /v1 now
			// refuses the old name. Ask once more for the model it serves
			// (the switch target, held until it is up).
			if again, lerr := r.a.firstModel(ctx); lerr == nil && again != model {
				r.a.log.Info("agent: the served model changed during the step; asking the new one", "was", model, "now", again)
				model = again
				rep, err = r.a.chat(ctx, model, msgs, ts.tools)
			}
		}
		if err != nil {
			r.fail(parent, ctx, fmt.Sprintf("asking the model at %s (step %d)", o.BaseURL, r.step), err)
			return
		}
		r.tokens += rep.promptTokens + rep.completionTokens
		r.emit(Event{Kind: EventModel, Model: rep.model, PromptTokens: rep.promptTokens,
			CompletionTokens: rep.completionTokens, LatencyMS: ms(rep.latency)})
		if len(rep.calls) == 0 {
			if strings.TrimSpace(rep.text) == "" {
				r.stop(StopEmpty, fmt.Sprintf("the model returned neither text nor a tool call at step %d (finish_reason %q); try again or rephrase the question", r.step, rep.finish))
				return
			}
			r.res.Answer = strings.TrimSpace(rep.text)
			r.emit(Event{Kind: EventAnswer, Text: r.res.Answer})
			r.stop(StopAnswer, fmt.Sprintf("answered after %d step(s), %d tool call(s)", r.step, len(r.learned)))
			return
		}
		if r.tokens >= o.MaxTokens {
			r.stop(StopTokens, fmt.Sprintf("the token budget of %d (agent.max_tokens) is used up (%d tokens) after step %d, before its tool calls ran. %s",
				o.MaxTokens, r.tokens, r.step, r.summary()))
			return
		}
		assistant, outs := r.runTools(ctx, rep.calls, ts.offered)
		msgs = append(msgs, assistant)
		for _, out := range outs {
			msgs = append(msgs, openai.ChatCompletionMessage{Role: openai.ChatMessageRoleTool, ToolCallID: out.id, Content: out.forModel})
		}
		if ctx.Err() != nil {
			r.fail(parent, ctx, fmt.Sprintf("running the tools of step %d", r.step), ctx.Err())
			return
		}
	}
	r.step = o.MaxSteps
	r.stop(StopMaxSteps, fmt.Sprintf("stopped after %d steps (the step cap, agent.max_steps) without a final answer: the model kept calling tools. %s",
		o.MaxSteps, r.summary()))
}

// fail ends the question after err while doing what: the caller going away
// is "canceled", the deadline passing is "deadline", anything else an
// endpoint or client error.
func (r *run) fail(parent, ctx context.Context, what string, err error) {
	switch {
	case errors.Is(parent.Err(), context.Canceled):
		r.stop(StopCanceled, fmt.Sprintf("the question was canceled (the client went away) while %s", what))
	case ctx.Err() != nil:
		r.stop(StopDeadline, fmt.Sprintf("no answer within the deadline of %s (agent.deadline); it passed while %s. %s",
			r.a.opts.Deadline, what, r.summary()))
	default:
		r.stop(StopError, fmt.Sprintf("%s failed: %v", what, err))
	}
}

// summary says what the tools returned, for a stop without an answer.
func (r *run) summary() string {
	if len(r.learned) == 0 {
		return "No tool had returned anything yet."
	}
	var parts []string
	for _, o := range r.learned {
		s := o.name + ": " + clip(flatten(o.excerpt), 300)
		if o.isError {
			s = o.name + " failed: " + clip(flatten(o.excerpt), 300)
		}
		parts = append(parts, s)
	}
	if len(parts) > 6 {
		parts = append([]string{fmt.Sprintf("(%d earlier results left out)", len(parts)-6)}, parts[len(parts)-6:]...)
	}
	return "What the tools returned: " + strings.Join(parts, "; ")
}

// firstModel is the first model the endpoint lists (the active backend's
// served name behind the daemon's /v1).
func (a *Agent) firstModel(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, listModelsTimeout)
	defer cancel()
	list, err := a.oai.ListModels(ctx)
	if err != nil {
		return "", fmt.Errorf("GET %s/models: %w", a.opts.BaseURL, err)
	}
	if len(list.Models) == 0 || list.Models[0].ID == "" {
		return "", fmt.Errorf("GET %s/models lists no model (is a backend active?)", a.opts.BaseURL)
	}
	return list.Models[0].ID, nil
}

// reply is one streamed model reply, assembled.
type reply struct {
	model            string
	text             string
	calls            []openai.ToolCall
	finish           string
	promptTokens     int
	completionTokens int
	latency          time.Duration
}

// chat sends one streamed chat request and assembles text and tool calls;
// tool-call deltas are joined by index as OpenAI streams them.
func (a *Agent) chat(ctx context.Context, model string, msgs []openai.ChatCompletionMessage, tools []openai.Tool) (reply, error) {
	start := time.Now()
	req := openai.ChatCompletionRequest{
		Model:         model,
		Messages:      msgs,
		Stream:        true,
		StreamOptions: &openai.StreamOptions{IncludeUsage: true},
	}
	if len(tools) > 0 {
		req.Tools = tools
		req.ToolChoice = "auto"
	}
	stream, err := a.oai.CreateChatCompletionStream(ctx, req)
	if err != nil {
		return reply{}, err
	}
	defer stream.Close()
	rep := reply{model: model}
	var text strings.Builder
	var calls []*openai.ToolCall
	byIndex := map[int]*openai.ToolCall{}
	size := 0
	sawUsage := false
	for {
		chunk, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return reply{}, fmt.Errorf("reading the stream: %w", err)
		}
		if chunk.Model != "" {
			rep.model = chunk.Model
		}
		if chunk.Usage != nil {
			sawUsage = true
			rep.promptTokens, rep.completionTokens = chunk.Usage.PromptTokens, chunk.Usage.CompletionTokens
		}
		for _, ch := range chunk.Choices {
			if ch.Index != 0 {
				continue // n=1: only choice 0 exists
			}
			text.WriteString(ch.Delta.Content)
			size += len(ch.Delta.Content)
			for _, d := range ch.Delta.ToolCalls {
				var c *openai.ToolCall
				switch {
				case d.Index != nil:
					c = byIndex[*d.Index]
					if c == nil {
						c = &openai.ToolCall{Type: openai.ToolTypeFunction}
						byIndex[*d.Index] = c
						calls = append(calls, c)
					}
				case d.ID != "" || len(calls) == 0:
					// No index (some servers): a new id starts a new call.
					c = &openai.ToolCall{Type: openai.ToolTypeFunction}
					calls = append(calls, c)
				default:
					c = calls[len(calls)-1]
				}
				if d.ID != "" {
					c.ID = d.ID
				}
				if d.Function.Name != "" && d.Function.Name != c.Function.Name {
					c.Function.Name += d.Function.Name
				}
				c.Function.Arguments += d.Function.Arguments
				size += len(d.Function.Name) + len(d.Function.Arguments)
			}
			if ch.FinishReason != "" {
				rep.finish = string(ch.FinishReason)
			}
		}
		if size > maxReplyBytes {
			return reply{}, fmt.Errorf("the reply exceeded %d bytes; stopped reading it", maxReplyBytes)
		}
	}
	rep.text = text.String()
	for _, c := range calls {
		rep.calls = append(rep.calls, *c)
	}
	if !sawUsage {
		// A server that ignores stream_options still spends tokens; count
		// about four bytes a token so the budget holds.
		n := 0
		for _, m := range msgs {
			n += len(m.Content)
		}
		rep.promptTokens, rep.completionTokens = n/4, size/4
	}
	rep.latency = time.Since(start)
	return rep, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// clip cuts s to at most n bytes on a rune boundary and says so.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("… [clipped: %d of %d bytes]", cut, len(s))
}

// flatten joins lines and runs of blanks (indented JSON reads as one line).
func flatten(s string) string { return strings.Join(strings.Fields(s), " ") }

// isNotFound reports an HTTP 404 from the endpoint: /v1 answers it for a
// model that is not (or no longer) served.
func isNotFound(err error) bool {
	var apiErr *openai.APIError
	if errors.As(err, &apiErr) {
		return apiErr.HTTPStatusCode == http.StatusNotFound
	}
	var reqErr *openai.RequestError
	return errors.As(err, &reqErr) && reqErr.HTTPStatusCode == http.StatusNotFound
}
