// Package agent is a tool-using loop on the box's own model: it lists the
// tools of an MCP client, hands them to the managed /v1 endpoint, runs the
// model's tool calls through the same client and feeds results (errors
// included) back until the model answers in prose or a limit stops it. It
// talks only to the MCP client, exactly as to an external server.
package agent

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
)

// MCPClient is the part of an MCP client the loop uses; mcp-go's
// *client.Client satisfies it (in-process or over HTTP/stdio).
type MCPClient interface {
	ListTools(ctx context.Context, req mcpgo.ListToolsRequest) (*mcpgo.ListToolsResult, error)
	CallTool(ctx context.Context, req mcpgo.CallToolRequest) (*mcpgo.CallToolResult, error)
}

// Event kinds, in the order they occur within a step.
const (
	EventStart      = "start"       // Text: the question; Tools: names offered
	EventModel      = "model"       // one model request: tokens, LatencyMS
	EventToolCall   = "tool_call"   // Tool, CallID, Arguments
	EventToolResult = "tool_result" // Tool, CallID, Result excerpt, IsError, LatencyMS
	EventAnswer     = "answer"      // Text: the final prose answer
	EventStop       = "stop"        // Reason: why the loop ended (always last)
)

// Stop reasons.
const (
	StopAnswer   = "answer"
	StopMaxSteps = "max_steps"
	StopTokens   = "token_budget"
	StopDeadline = "deadline"
	StopEmpty    = "empty_reply" // neither text nor tool calls
	StopError    = "error"       // model endpoint failed; Text says how
	StopCanceled = "canceled"
	StopInvalid  = "invalid_question" // empty or larger than MaxQuestionBytes
)

// Event is one entry of the live timeline.
type Event struct {
	Seq              int       `json:"seq"`
	Step             int       `json:"step"`
	Kind             string    `json:"kind"`
	Time             time.Time `json:"time"`
	Tools            []string  `json:"tools,omitempty"`
	Tool             string    `json:"tool,omitempty"`
	CallID           string    `json:"call_id,omitempty"`
	Arguments        string    `json:"arguments,omitempty"`
	Result           string    `json:"result,omitempty"`
	IsError          bool      `json:"is_error,omitempty"`
	LatencyMS        float64   `json:"latency_ms,omitempty"`
	PromptTokens     int       `json:"prompt_tokens,omitempty"`
	CompletionTokens int       `json:"completion_tokens,omitempty"`
	Model            string    `json:"model,omitempty"`
	Text             string    `json:"text,omitempty"`
	Reason           string    `json:"reason,omitempty"`
	// Refused (EventStart) names tools the MCP server listed but the loop
	// did not offer because their annotations do not say read-only.
	Refused []string `json:"refused,omitempty"`
}

// Options tune one Agent. Zero values take the defaults of config's
// `agent:` section (6 steps, 32768 tokens, 120 s deadline, 20 s per tool
// call, 4000-byte questions).
type Options struct {
	// BaseURL is an OpenAI-compatible base including /v1, normally the
	// daemon's own managed endpoint (held, not rejected, during a switch).
	BaseURL string
	// Model empty means the first model of GET {BaseURL}/models, looked up
	// before every step: behind the daemon's /v1 that is the loaded model
	// or, during a switch, its target, so a question that meets a switch
	// is held until the new backend is up and goes on with it. A model set
	// here is asked for at every step, whatever runs.
	Model            string
	APIKey           string
	HTTPClient       *http.Client
	MaxSteps         int
	MaxTokens        int
	MaxQuestionBytes int
	Deadline         time.Duration
	ToolTimeout      time.Duration
	Log              *slog.Logger
}

// Result is the whole run, for callers that do not stream.
type Result struct {
	Answer    string   `json:"answer"`
	Stop      string   `json:"stop"`
	Steps     int      `json:"steps"`
	ToolsUsed []string `json:"tools_used"`
	Errors    int      `json:"errors"` // failed tool calls
	Events    []Event  `json:"events"`
	// Message is the stop event's text: why the loop stopped, in words
	// (for a stop without an answer, what the tools returned so far).
	Message string `json:"message"`
}
