package simulator

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// This file decodes and validates the request bodies of the OpenAI-compatible
// endpoints (shared by both flavours) and of vLLM's /tokenize. Everything here
// is pure so the fuzz tests can drive it without a server.

// oaiMessage is one chat message as OpenAI clients send it. Content is a
// string, null, or a list of typed parts.
type oaiMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	Name       string          `json:"name"`
	ToolCalls  json.RawMessage `json:"tool_calls"`
	ToolCallID string          `json:"tool_call_id"`
}

type oaiStreamOptions struct {
	IncludeUsage         *bool `json:"include_usage"`
	ContinuousUsageStats bool  `json:"continuous_usage_stats"`
}

// oaiTool is one entry of "tools"; Parameters stays raw so any JSON Schema
// (2020-12 keywords such as $defs, prefixItems, unevaluatedProperties
// included) passes through untouched.
type oaiTool struct {
	Type     string `json:"type"`
	Function struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	} `json:"function"`
}

// oaiChatRequest is the body of POST /v1/chat/completions (and the chat form
// of vLLM's /tokenize). Unknown fields are ignored, as vLLM does.
type oaiChatRequest struct {
	Model               string            `json:"model"`
	Messages            []oaiMessage      `json:"messages"`
	Stream              bool              `json:"stream"`
	StreamOptions       *oaiStreamOptions `json:"stream_options"`
	MaxTokens           *int              `json:"max_tokens"`
	MaxCompletionTokens *int              `json:"max_completion_tokens"`
	MinTokens           int               `json:"min_tokens"`
	IgnoreEOS           bool              `json:"ignore_eos"`
	N                   *int              `json:"n"`
	Tools               []oaiTool         `json:"tools"`
	ToolChoice          json.RawMessage   `json:"tool_choice"`
	AddGenerationPrompt *bool             `json:"add_generation_prompt"`
	ReturnTokenStrs     bool              `json:"return_token_strs"`
	// ResponseFormat is OpenAI's response_format ({"type":"json_schema",
	// "json_schema":{...}} or {"type":"json_object"}); see schema.go.
	ResponseFormat json.RawMessage `json:"response_format"`
	// Prompt is set only on a /tokenize body of the completion form.
	Prompt *string `json:"prompt"`
}

// oaiCompletionRequest is the body of POST /v1/completions.
type oaiCompletionRequest struct {
	Model         string            `json:"model"`
	Prompt        json.RawMessage   `json:"prompt"`
	Stream        bool              `json:"stream"`
	StreamOptions *oaiStreamOptions `json:"stream_options"`
	MaxTokens     *int              `json:"max_tokens"`
	MinTokens     int               `json:"min_tokens"`
	IgnoreEOS     bool              `json:"ignore_eos"`
	N             *int              `json:"n"`
}

// toolChoice is the decoded tool_choice: mode "none", "auto", "required" or
// "named" (with Name).
type toolChoice struct {
	Mode string
	Name string
}

// forcedToolCall is the call the simulated model makes when tool_choice
// forces one.
type forcedToolCall struct {
	Name      string
	Arguments string
	Finish    string // "tool_calls" for required, "stop" for a named function (as OpenAI)
}

func decodeJSON(data []byte, v any) *apiError {
	if len(bytes.TrimSpace(data)) == 0 {
		return badRequest("request body is empty; expected a JSON object")
	}
	if err := json.Unmarshal(data, v); err != nil {
		return badRequest("invalid JSON body: %v", err)
	}
	return nil
}

// decodeChatRequest parses and validates a chat completion body.
func decodeChatRequest(data []byte) (*oaiChatRequest, *apiError) {
	var req oaiChatRequest
	if err := decodeJSON(data, &req); err != nil {
		return nil, err
	}
	if len(req.Messages) == 0 {
		return nil, badRequest("messages: field required and must not be empty")
	}
	if err := validateCommon(req.N, req.MinTokens, req.Stream, req.StreamOptions); err != nil {
		return nil, err
	}
	for i, t := range req.Tools {
		if t.Type != "" && t.Type != "function" {
			return nil, badRequest("tools[%d].type: only \"function\" tools are supported, got %q", i, t.Type)
		}
		if t.Function.Name == "" {
			return nil, badRequest("tools[%d].function.name: field required", i)
		}
	}
	return &req, nil
}

// decodeCompletionRequest parses and validates a text completion body.
func decodeCompletionRequest(data []byte) (*oaiCompletionRequest, *apiError) {
	var req oaiCompletionRequest
	if err := decodeJSON(data, &req); err != nil {
		return nil, err
	}
	if len(req.Prompt) == 0 || string(req.Prompt) == "null" {
		return nil, badRequest("prompt: field required")
	}
	if err := validateCommon(req.N, req.MinTokens, req.Stream, req.StreamOptions); err != nil {
		return nil, err
	}
	return &req, nil
}

func validateCommon(n *int, minTokens int, stream bool, so *oaiStreamOptions) *apiError {
	if n != nil && *n != 1 {
		return badRequest("n: only n=1 is supported by the simulator, got %d", *n)
	}
	if minTokens < 0 {
		return badRequest("min_tokens must be greater than or equal to 0, got %d.", minTokens)
	}
	if so != nil && !stream {
		return badRequest("Stream options can only be defined when `stream=True`.")
	}
	return nil
}

// includeUsage reports whether a stream ends with a usage chunk.
func includeUsage(so *oaiStreamOptions) (final, continuous bool) {
	if so == nil {
		return false, false
	}
	return so.IncludeUsage == nil || *so.IncludeUsage, so.ContinuousUsageStats
}

// maxTokensOf picks max_completion_tokens over the deprecated max_tokens.
func (r *oaiChatRequest) maxTokensOf() (*int, string) {
	if r.MaxCompletionTokens != nil {
		return r.MaxCompletionTokens, "max_completion_tokens"
	}
	return r.MaxTokens, "max_tokens"
}

// chatMessages reduces OpenAI messages to template input.
func chatMessages(msgs []oaiMessage) ([]chatMessage, *apiError) {
	out := make([]chatMessage, 0, len(msgs))
	for i, m := range msgs {
		if m.Role == "" {
			return nil, badRequest("messages[%d].role: field required", i)
		}
		text, err := contentText(m.Content)
		if err != nil {
			return nil, badRequest("messages[%d].content: %s", i, err.Error())
		}
		cm := chatMessage{Role: m.Role, Content: text}
		if len(m.ToolCalls) > 0 && string(m.ToolCalls) != "null" {
			var buf bytes.Buffer
			if err := json.Compact(&buf, m.ToolCalls); err != nil {
				return nil, badRequest("messages[%d].tool_calls: %v", i, err)
			}
			cm.ToolCalls = buf.String()
		}
		out = append(out, cm)
	}
	return out, nil
}

// contentText flattens a message content: a string, null, or a list of parts
// of which text parts count as text and any other part (image, audio) as one
// placeholder token.
func contentText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", fmt.Errorf("invalid string: %w", err)
		}
		return s, nil
	case '[':
		var parts []struct {
			Type string  `json:"type"`
			Text *string `json:"text"`
		}
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", fmt.Errorf("invalid content parts: %w", err)
		}
		var b strings.Builder
		for j, p := range parts {
			switch {
			case p.Type == "text" && p.Text != nil:
				b.WriteString(*p.Text)
			case p.Type == "text":
				return "", fmt.Errorf("part %d: text part without text", j)
			case p.Type == "":
				return "", fmt.Errorf("part %d: type required", j)
			default:
				b.WriteString("<|vision_pad|>")
			}
		}
		return b.String(), nil
	default:
		return "", fmt.Errorf("must be a string, null or a list of parts")
	}
}

// compactTools renders the tool list as the chat template shows it.
func compactTools(tools []oaiTool) json.RawMessage {
	if len(tools) == 0 {
		return nil
	}
	b, err := json.Marshal(tools)
	if err != nil {
		return nil
	}
	return b
}

// decodeToolChoice reads tool_choice; absent means "auto" when tools are sent
// and "none" otherwise (vLLM's rule since 0.8).
func decodeToolChoice(raw json.RawMessage, tools []oaiTool) (toolChoice, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		if len(tools) > 0 {
			return toolChoice{Mode: "auto"}, nil
		}
		return toolChoice{Mode: "none"}, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "none", "auto", "required":
			if s == "required" && len(tools) == 0 {
				return toolChoice{}, badRequest("When using `tool_choice`, `tools` must be set.")
			}
			return toolChoice{Mode: s}, nil
		}
		return toolChoice{}, badRequest("tool_choice: %q is not one of none, auto, required or a named function", s)
	}
	var named struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &named); err != nil || named.Function.Name == "" {
		return toolChoice{}, badRequest("tool_choice: expected a string or {\"type\":\"function\",\"function\":{\"name\":…}}")
	}
	for _, t := range tools {
		if t.Function.Name == named.Function.Name {
			return toolChoice{Mode: "named", Name: named.Function.Name}, nil
		}
	}
	return toolChoice{}, badRequest("Tool '%s' has not been passed in `tools`.", named.Function.Name)
}

// planToolCall returns the call a forced tool_choice produces, with the
// function's required parameters filled with neutral values so the arguments
// validate against simple schemas.
func planToolCall(tc toolChoice, tools []oaiTool) *forcedToolCall {
	var tool *oaiTool
	switch tc.Mode {
	case "required":
		tool = &tools[0]
	case "named":
		for i := range tools {
			if tools[i].Function.Name == tc.Name {
				tool = &tools[i]
				break
			}
		}
	}
	if tool == nil {
		return nil
	}
	finish := "tool_calls"
	if tc.Mode == "named" {
		finish = "stop"
	}
	return &forcedToolCall{Name: tool.Function.Name, Arguments: neutralArguments(tool.Function.Parameters), Finish: finish}
}

// neutralArguments builds {"required_param": zero value, …} from a JSON
// Schema object; anything it does not understand gives "{}".
func neutralArguments(schema json.RawMessage) string {
	var s struct {
		Properties map[string]json.RawMessage `json:"properties"`
		Required   []string                   `json:"required"`
	}
	if len(schema) == 0 || json.Unmarshal(schema, &s) != nil {
		return "{}"
	}
	args := map[string]any{}
	req := append([]string{}, s.Required...)
	sort.Strings(req)
	for _, name := range req {
		var prop struct {
			Type  json.RawMessage `json:"type"`
			Enum  []any           `json:"enum"`
			Const any             `json:"const"`
		}
		_ = json.Unmarshal(s.Properties[name], &prop)
		switch {
		case prop.Const != nil:
			args[name] = prop.Const
		case len(prop.Enum) > 0:
			args[name] = prop.Enum[0]
		default:
			args[name] = zeroForType(prop.Type)
		}
	}
	b, err := json.Marshal(args)
	if err != nil {
		return "{}"
	}
	return string(b)
}

func zeroForType(raw json.RawMessage) any {
	var t string
	if json.Unmarshal(raw, &t) != nil {
		var ts []string
		if json.Unmarshal(raw, &ts) == nil {
			for _, x := range ts {
				if x != "null" {
					t = x
					break
				}
			}
		}
	}
	switch t {
	case "string":
		return ""
	case "integer", "number":
		return 0
	case "boolean":
		return false
	case "array":
		return []any{}
	case "object":
		return map[string]any{}
	}
	return nil
}

// completionPrompt returns the prompt text and its token count. A prompt is a
// string, a one-element list of strings, or token ids (one list of ints).
func completionPrompt(raw json.RawMessage) (text string, tokens int, e *apiError) {
	raw = bytes.TrimSpace(raw)
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, len(tokenize(s)), nil
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil {
		if len(ss) != 1 {
			return "", 0, badRequest("prompt: batched prompts (%d) are not supported by the simulator; send one prompt", len(ss))
		}
		return ss[0], len(tokenize(ss[0])), nil
	}
	var ids []int
	if json.Unmarshal(raw, &ids) == nil {
		return "", len(ids), nil
	}
	var batches [][]int
	if json.Unmarshal(raw, &batches) == nil {
		if len(batches) != 1 {
			return "", 0, badRequest("prompt: batched prompts (%d) are not supported by the simulator; send one prompt", len(batches))
		}
		return "", len(batches[0]), nil
	}
	return "", 0, badRequest("prompt: expected a string, a list of strings or a list of token ids")
}
