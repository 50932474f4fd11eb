package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	openai "github.com/sashabaranov/go-openai"
)

// emptySchema is offered for a tool whose input schema is missing or not a
// JSON object, so one odd tool does not make the model endpoint refuse the
// whole request.
var emptySchema = json.RawMessage(`{"type":"object","properties":{}}`)

// toolSet is what one question offers the model.
type toolSet struct {
	tools   []openai.Tool
	names   []string
	offered map[string]bool
	refused []string
}

// listTools pages through tools/list and keeps the read-only tools.
func (a *Agent) listTools(ctx context.Context) (toolSet, error) {
	var all []mcpgo.Tool
	var cursor mcpgo.Cursor
	for page := 0; ; page++ {
		if page == maxToolPages {
			return toolSet{}, fmt.Errorf("tools/list returned more than %d pages", maxToolPages)
		}
		req := mcpgo.ListToolsRequest{}
		req.Params.Cursor = cursor
		res, err := a.mcp.ListTools(ctx, req)
		if err != nil {
			return toolSet{}, err
		}
		if res == nil {
			return toolSet{}, errors.New("tools/list returned no result")
		}
		all = append(all, res.Tools...)
		if res.NextCursor == "" {
			break
		}
		cursor = res.NextCursor
	}
	return offerTools(all), nil
}

// offerTools converts MCP tools to the model's function tools: the input
// schema passes through unchanged as the function's parameters. Rights
// live in the server (the registry holds only read-only tools); as defence
// in depth a tool whose annotations do not say read-only, or do say
// destructive, is not offered.
func offerTools(list []mcpgo.Tool) toolSet {
	ts := toolSet{offered: map[string]bool{}, names: []string{}}
	for _, t := range list {
		if t.Name == "" || ts.offered[t.Name] {
			continue
		}
		if !readOnly(t.Annotations) {
			ts.refused = append(ts.refused, t.Name)
			continue
		}
		ts.offered[t.Name] = true
		ts.names = append(ts.names, t.Name)
		ts.tools = append(ts.tools, openai.Tool{Type: openai.ToolTypeFunction, Function: &openai.FunctionDefinition{
			Name:        t.Name,
			Description: clip(t.Description, ExcerptBytes),
			Parameters:  inputSchema(t),
		}})
	}
	return ts
}

// readOnly is the MCP annotations' promise that a tool only reads:
// readOnlyHint true (its default is false) and destructiveHint not true.
func readOnly(a mcpgo.ToolAnnotation) bool {
	return a.ReadOnlyHint != nil && *a.ReadOnlyHint && (a.DestructiveHint == nil || !*a.DestructiveHint)
}

// inputSchema is the tool's input schema as raw JSON, whichever of
// InputSchema or RawInputSchema carries it.
func inputSchema(t mcpgo.Tool) json.RawMessage {
	if raw := bytes.TrimSpace(t.RawInputSchema); len(raw) > 0 && raw[0] == '{' && json.Valid(raw) {
		return raw
	}
	b, err := json.Marshal(t.InputSchema)
	if err != nil || !bytes.HasPrefix(b, []byte("{")) {
		return emptySchema
	}
	return b
}

// outcome is one executed (or refused) tool call.
type outcome struct {
	index    int
	id       string
	name     string
	forModel string // the tool message content
	excerpt  string // for the timeline
	isError  bool
	latency  time.Duration
}

// runTools runs one reply's tool calls, independent ones in parallel, and
// returns the assistant message to record and the outcomes in call order.
// Unknown tools and arguments that are not a JSON object are not raised:
// they become error results the model reads and can recover from. Results
// are emitted as they arrive, on this goroutine.
func (r *run) runTools(ctx context.Context, calls []openai.ToolCall, offered map[string]bool) (openai.ChatCompletionMessage, []outcome) {
	outs := make([]outcome, len(calls))
	assistant := openai.ChatCompletionMessage{Role: openai.ChatMessageRoleAssistant}
	type job struct {
		i    int
		args map[string]any
	}
	var jobs []job
	for i, c := range calls {
		id := c.ID
		if id == "" {
			id = fmt.Sprintf("call_%d_%d", r.step, i)
		}
		name := c.Function.Name
		r.emit(Event{Kind: EventToolCall, Tool: name, CallID: id, Arguments: clip(c.Function.Arguments, ExcerptBytes)})
		args, argErr := parseArguments(c.Function.Arguments)
		recorded := c.Function.Arguments
		if argErr != nil || strings.TrimSpace(recorded) == "" {
			// vLLM parses the arguments of past calls (json.loads) when it
			// renders the chat template: echoing invalid JSON back would
			// make the next request fail. The error message quotes them.
			recorded = "{}"
		}
		assistant.ToolCalls = append(assistant.ToolCalls, openai.ToolCall{ID: id, Type: openai.ToolTypeFunction,
			Function: openai.FunctionCall{Name: name, Arguments: recorded}})
		outs[i] = outcome{index: i, id: id, name: name}
		switch {
		case i >= maxCallsPerStep:
			outs[i].fail(fmt.Sprintf("not run: more than %d tool calls in one step; call fewer tools at once", maxCallsPerStep))
		case !offered[name]:
			outs[i].fail(fmt.Sprintf("unknown tool %q; available: %s", clip(name, 200), availableList(offered)))
		case argErr != nil:
			outs[i].fail(fmt.Sprintf("arguments are not valid JSON: %v; got %s. Send one JSON object that matches the tool's input schema",
				argErr, clip(c.Function.Arguments, 500)))
		default:
			jobs = append(jobs, job{i: i, args: args})
			continue
		}
		r.record(outs[i])
	}
	done := make(chan outcome, len(jobs))
	for _, j := range jobs {
		o := outs[j.i]
		go func() {
			start := time.Now()
			text, isErr := r.a.callTool(ctx, o.name, j.args)
			o.latency = time.Since(start)
			o.setResult(text, isErr)
			done <- o
		}()
	}
	for range jobs {
		o := <-done
		outs[o.index] = o
		r.markUsed(o.name)
		r.record(o)
	}
	return assistant, outs
}

// fail makes o an error result that never reached a tool.
func (o *outcome) fail(msg string) { o.setResult(msg, true) }

// setResult fills the model's and the timeline's copies of a result; an
// error is marked in words, since a tool message has no error flag.
func (o *outcome) setResult(text string, isErr bool) {
	o.isError = isErr
	o.excerpt = clip(text, ExcerptBytes)
	if isErr {
		text = "[tool error] " + text
	}
	o.forModel = clip(text, ModelResultBytes)
}

// record emits a result and keeps it for the stop summary.
func (r *run) record(o outcome) {
	if o.isError {
		r.res.Errors++
	}
	r.learned = append(r.learned, o)
	r.emit(Event{Kind: EventToolResult, Tool: o.name, CallID: o.id, Result: o.excerpt, IsError: o.isError, LatencyMS: ms(o.latency)})
	r.a.log.Debug("agent tool call", "tool", o.name, "call_id", o.id, "is_error", o.isError, "latency_ms", ms(o.latency))
}

// markUsed records a tool that ran, once, in call order.
func (r *run) markUsed(name string) {
	if r.usedSet == nil {
		r.usedSet = map[string]bool{}
	}
	if !r.usedSet[name] {
		r.usedSet[name] = true
		r.res.ToolsUsed = append(r.res.ToolsUsed, name)
	}
}

// parseArguments decodes a call's arguments; empty means none, as models
// send for tools without parameters.
func parseArguments(s string) (map[string]any, error) {
	if strings.TrimSpace(s) == "" {
		return map[string]any{}, nil
	}
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		return nil, err
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("want a JSON object, got %s", jsonKind(v))
	}
	return m, nil
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case []any:
		return "an array"
	case string:
		return "a string"
	case float64:
		return "a number"
	case bool:
		return "a boolean"
	}
	return fmt.Sprintf("%T", v)
}

// availableList names the offered tools for an unknown-tool error.
func availableList(offered map[string]bool) string {
	if len(offered) == 0 {
		return "none"
	}
	names := make([]string, 0, len(offered))
	for n := range offered {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// callTool runs one call through the MCP client within ToolTimeout. The
// call runs on its own goroutine so that a client or tool that ignores its
// context still cannot hold the loop: at the timeout the result is an
// error and the goroutine is left to finish on its own.
func (a *Agent) callTool(ctx context.Context, name string, args map[string]any) (string, bool) {
	cctx, cancel := context.WithTimeout(ctx, a.opts.ToolTimeout)
	defer cancel()
	type result struct {
		res *mcpgo.CallToolResult
		err error
	}
	ch := make(chan result, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				a.log.Error("agent: MCP client panicked in CallTool", "tool", name, "panic", fmt.Sprint(p))
				ch <- result{err: fmt.Errorf("the MCP client failed internally (logged on the server)")}
			}
		}()
		req := mcpgo.CallToolRequest{}
		req.Params.Name = name
		req.Params.Arguments = args
		res, err := a.mcp.CallTool(cctx, req)
		ch <- result{res, err}
	}()
	var r result
	select {
	case r = <-ch:
	case <-cctx.Done():
		if ctx.Err() != nil {
			return fmt.Sprintf("%s was stopped: the question ended (deadline or cancel) while it ran", name), true
		}
		return fmt.Sprintf("%s did not answer within %s (the per-call timeout, agent.tool_timeout); its result is unknown", name, a.opts.ToolTimeout), true
	}
	switch {
	case r.err != nil && cctx.Err() != nil && ctx.Err() == nil:
		return fmt.Sprintf("%s did not answer within %s (the per-call timeout, agent.tool_timeout); its result is unknown", name, a.opts.ToolTimeout), true
	case r.err != nil:
		return fmt.Sprintf("calling %s failed: %v", name, r.err), true
	case r.res == nil:
		return fmt.Sprintf("%s returned no result", name), true
	}
	return resultText(r.res), r.res.IsError
}

// resultText joins a result's text content; other content is named, and a
// result with only structured content is shown as its JSON.
func resultText(res *mcpgo.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		switch v := c.(type) {
		case mcpgo.TextContent:
			parts = append(parts, v.Text)
		case *mcpgo.TextContent:
			parts = append(parts, v.Text)
		case mcpgo.EmbeddedResource:
			parts = append(parts, embeddedText(v))
		case *mcpgo.EmbeddedResource:
			parts = append(parts, embeddedText(*v))
		case mcpgo.ImageContent, *mcpgo.ImageContent:
			parts = append(parts, "[image content omitted]")
		case mcpgo.AudioContent, *mcpgo.AudioContent:
			parts = append(parts, "[audio content omitted]")
		default:
			parts = append(parts, "[non-text content omitted]")
		}
	}
	if len(parts) == 0 && res.StructuredContent != nil {
		if b, err := json.Marshal(res.StructuredContent); err == nil {
			parts = append(parts, string(b))
		}
	}
	if len(parts) == 0 {
		return "(the tool returned nothing)"
	}
	return strings.Join(parts, "\n")
}

func embeddedText(e mcpgo.EmbeddedResource) string {
	switch r := e.Resource.(type) {
	case mcpgo.TextResourceContents:
		return r.Text
	case *mcpgo.TextResourceContents:
		return r.Text
	}
	return "[binary resource omitted]"
}
