package simulator

import (
	"encoding/json"
	"fmt"
	"strings"
)

// The agent APIs — Anthropic Messages (what Claude Code speaks) and OpenAI
// Responses (what the Codex CLI speaks) — are served by translating the
// request into the chat request the engine already plans (token counts,
// tool choice, scripted tool use all stay one implementation), and the
// planned reply back into each API's documented answer and event sequence
// (agentapis.go). This file holds the pure request translations, so the
// fuzz tests drive them without a server.

// anthMessage is one Anthropic message: content is a string or a list of
// blocks (text, tool_use, tool_result; images count as one token).
type anthMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type anthBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
}

type anthTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
}

// anthRequest is the body of POST /v1/messages (and count_tokens).
type anthRequest struct {
	Model      string          `json:"model"`
	Messages   []anthMessage   `json:"messages"`
	System     json.RawMessage `json:"system"`
	MaxTokens  *int            `json:"max_tokens"`
	Stream     bool            `json:"stream"`
	Tools      []anthTool      `json:"tools"`
	ToolChoice json.RawMessage `json:"tool_choice"`
}

// chatFromMessages translates an Anthropic Messages body into the chat
// request the engine plans; count is true for count_tokens (no max_tokens).
func chatFromMessages(data []byte, count bool) (*anthRequest, []byte, *apiError) {
	var req anthRequest
	if e := decodeJSON(data, &req); e != nil {
		return nil, nil, e
	}
	if req.Model == "" {
		return nil, nil, badRequest("model: field required")
	}
	if len(req.Messages) == 0 {
		return nil, nil, badRequest("messages: field required and must not be empty")
	}
	if !count && req.MaxTokens == nil {
		return nil, nil, badRequest("max_tokens: field required")
	}
	sys, err := blocksText(req.System)
	if err != nil {
		return nil, nil, badRequest("system: %v", err)
	}
	var msgs []map[string]any
	for i, m := range req.Messages {
		out, err := anthToChat(m)
		if err != nil {
			return nil, nil, badRequest("messages[%d]: %v", i, err)
		}
		for _, o := range out {
			if o["role"] == "system" {
				// Claude Code's reminders: part of the system prompt, so
				// the turn still ends with the user's message.
				sys += "\n" + o["content"].(string)
				continue
			}
			msgs = append(msgs, o)
		}
	}
	if sys != "" {
		msgs = append([]map[string]any{{"role": "system", "content": sys}}, msgs...)
	}
	chat := map[string]any{"model": req.Model, "messages": msgs, "stream": req.Stream}
	if req.MaxTokens != nil {
		chat["max_tokens"] = *req.MaxTokens
	}
	if len(req.Tools) > 0 {
		tools := make([]any, 0, len(req.Tools))
		for i, t := range req.Tools {
			if t.Name == "" {
				return nil, nil, badRequest("tools[%d].name: field required", i)
			}
			schema := t.InputSchema
			if len(schema) == 0 {
				schema = json.RawMessage(`{"type":"object"}`)
			}
			tools = append(tools, map[string]any{"type": "function",
				"function": map[string]any{"name": t.Name, "description": t.Description, "parameters": schema}})
		}
		chat["tools"] = tools
		chat["tool_choice"] = anthToolChoice(req.ToolChoice)
	}
	body, err := json.Marshal(chat)
	if err != nil {
		return nil, nil, badRequest("translating the request: %v", err)
	}
	return &req, body, nil
}

// anthToolChoice maps Anthropic's tool_choice ({"type":"auto"|"any"|"tool"|
// "none"}, auto when absent) to the chat one.
func anthToolChoice(raw json.RawMessage) any {
	var tc struct {
		Type string `json:"type"`
		Name string `json:"name"`
	}
	_ = json.Unmarshal(raw, &tc)
	switch tc.Type {
	case "any":
		return "required"
	case "none":
		return "none"
	case "tool":
		return map[string]any{"type": "function", "function": map[string]any{"name": tc.Name}}
	}
	return "auto"
}

// anthToChat translates one Anthropic message: tool_result blocks become
// tool messages, tool_use blocks an assistant message's tool_calls.
func anthToChat(m anthMessage) ([]map[string]any, error) {
	// Claude Code also puts "system" messages in the list (its reminders).
	if m.Role != "user" && m.Role != "assistant" && m.Role != "system" {
		return nil, fmt.Errorf("role: must be \"user\", \"assistant\" or \"system\", got %q", m.Role)
	}
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return []map[string]any{{"role": m.Role, "content": s}}, nil
	}
	var blocks []anthBlock
	if err := json.Unmarshal(m.Content, &blocks); err != nil {
		return nil, fmt.Errorf("content: must be a string or a list of blocks")
	}
	var out []map[string]any
	var text strings.Builder
	var calls []any
	for _, b := range blocks {
		switch b.Type {
		case "text":
			if strings.HasPrefix(strings.TrimSpace(b.Text), "<system-reminder>") {
				// Claude Code's reminders ride in the user's turn; they
				// are context, not the question.
				out = append(out, map[string]any{"role": "system", "content": b.Text})
				continue
			}
			text.WriteString(b.Text)
		case "tool_use":
			args := string(b.Input)
			if args == "" || args == "null" {
				args = "{}"
			}
			calls = append(calls, map[string]any{"id": b.ID, "type": "function",
				"function": map[string]any{"name": b.Name, "arguments": args}})
		case "tool_result":
			res, err := blocksText(b.Content)
			if err != nil {
				return nil, fmt.Errorf("tool_result content: %v", err)
			}
			if b.IsError && !looksLikeError(res) {
				res = "Error: " + res
			}
			out = append(out, map[string]any{"role": "tool", "tool_call_id": b.ToolUseID, "content": res})
		default:
			text.WriteString(" ") // an image or document: one placeholder token
		}
	}
	if text.Len() > 0 || len(calls) > 0 {
		msg := map[string]any{"role": m.Role, "content": text.String()}
		if len(calls) > 0 {
			msg["tool_calls"] = calls
		}
		out = append(out, msg)
	}
	return out, nil
}

// blocksText flattens a string or a list of text blocks (a system prompt,
// a tool result).
func blocksText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var blocks []anthBlock
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return "", fmt.Errorf("must be a string or a list of blocks")
	}
	var b strings.Builder
	for _, bl := range blocks {
		b.WriteString(bl.Text)
	}
	return b.String(), nil
}

// respItem is one item of a Responses "input" list.
type respItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
}

type respTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
}

// respRequest is the body of POST /v1/responses.
type respRequest struct {
	Model           string          `json:"model"`
	Input           json.RawMessage `json:"input"`
	Instructions    string          `json:"instructions"`
	MaxOutputTokens *int            `json:"max_output_tokens"`
	Stream          bool            `json:"stream"`
	Tools           []respTool      `json:"tools"`
	ToolChoice      json.RawMessage `json:"tool_choice"`
}

// chatFromResponses translates a Responses body into the chat request the
// engine plans. Only function tools are offered (the simulated model has
// no built-in tools).
func chatFromResponses(data []byte) (*respRequest, []byte, *apiError) {
	var req respRequest
	if e := decodeJSON(data, &req); e != nil {
		return nil, nil, e
	}
	if req.Model == "" {
		return nil, nil, badRequest("model: field required")
	}
	var msgs []map[string]any
	if req.Instructions != "" {
		msgs = append(msgs, map[string]any{"role": "system", "content": req.Instructions})
	}
	var s string
	if json.Unmarshal(req.Input, &s) == nil {
		msgs = append(msgs, map[string]any{"role": "user", "content": s})
	} else {
		var items []respItem
		if err := json.Unmarshal(req.Input, &items); err != nil || len(items) == 0 {
			return nil, nil, badRequest("input: must be a string or a non-empty list of items")
		}
		for i, it := range items {
			m, err := respToChat(it, msgs)
			if err != nil {
				return nil, nil, badRequest("input[%d]: %v", i, err)
			}
			msgs = m
		}
	}
	chat := map[string]any{"model": req.Model, "messages": msgs, "stream": req.Stream}
	if req.MaxOutputTokens != nil {
		chat["max_tokens"] = *req.MaxOutputTokens
	}
	var tools []any
	for _, t := range req.Tools {
		if t.Type != "function" || t.Name == "" {
			continue
		}
		schema := t.Parameters
		if len(schema) == 0 || string(schema) == "null" {
			schema = json.RawMessage(`{"type":"object"}`)
		}
		tools = append(tools, map[string]any{"type": "function",
			"function": map[string]any{"name": t.Name, "description": t.Description, "parameters": schema}})
	}
	if len(tools) > 0 {
		chat["tools"] = tools
		chat["tool_choice"] = respToolChoice(req.ToolChoice)
	}
	body, err := json.Marshal(chat)
	if err != nil {
		return nil, nil, badRequest("translating the request: %v", err)
	}
	return &req, body, nil
}

// respToolChoice maps the Responses tool_choice ("auto" when absent) to the
// chat one.
func respToolChoice(raw json.RawMessage) any {
	var s string
	if json.Unmarshal(raw, &s) == nil && (s == "none" || s == "required" || s == "auto") {
		return s
	}
	var named struct {
		Type string `json:"type"`
		Name string `json:"name"`
	}
	if json.Unmarshal(raw, &named) == nil && named.Type == "function" && named.Name != "" {
		return map[string]any{"type": "function", "function": map[string]any{"name": named.Name}}
	}
	return "auto"
}

// respToChat appends one input item to the chat messages: a message, a
// function_call (joined to the assistant message before it, as parallel
// calls are) or a function_call_output (a tool message).
func respToChat(it respItem, msgs []map[string]any) ([]map[string]any, error) {
	switch it.Type {
	case "", "message":
		role := it.Role
		if role == "developer" {
			role = "system"
		}
		if role != "user" && role != "assistant" && role != "system" {
			return nil, fmt.Errorf("role: must be user, assistant, system or developer, got %q", it.Role)
		}
		text, err := respContentText(it.Content)
		if err != nil {
			return nil, err
		}
		return append(msgs, map[string]any{"role": role, "content": text}), nil
	case "function_call":
		call := map[string]any{"id": it.CallID, "type": "function",
			"function": map[string]any{"name": it.Name, "arguments": it.Arguments}}
		if n := len(msgs); n > 0 && msgs[n-1]["role"] == "assistant" {
			calls, _ := msgs[n-1]["tool_calls"].([]any)
			msgs[n-1]["tool_calls"] = append(calls, call)
			return msgs, nil
		}
		return append(msgs, map[string]any{"role": "assistant", "content": "", "tool_calls": []any{call}}), nil
	case "function_call_output":
		out, err := respContentText(it.Output)
		if err != nil {
			return nil, fmt.Errorf("output: %v", err)
		}
		return append(msgs, map[string]any{"role": "tool", "tool_call_id": it.CallID, "content": out}), nil
	}
	return msgs, nil // reasoning and other items carry nothing the model reads
}

// respContentText flattens a Responses content: a string or parts with
// "text" (input_text, output_text).
func respContentText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", fmt.Errorf("content: must be a string or a list of parts")
	}
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String(), nil
}
