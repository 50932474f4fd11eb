// Package apishape knows the /v1 agent APIs gpuhost serves (OpenAI chat
// and text completions, embeddings and Responses; Anthropic Messages and
// count_tokens) by their path, and writes an error in the shape each API's
// clients read. An Anthropic SDK (Claude Code) reads only Anthropic's
// {"type":"error","error":{…}}, an OpenAI SDK (Codex, opencode) only
// OpenAI's {"error":{…}}: anything else shows the user a bare status. The
// /v1 proxy, and the guard and bearer check in front of it, write their
// errors through Write and Refuse, so a refusal before the proxy reads like
// one from it.
//
// It is a leaf (standard library only) because the guard in
// internal/frontdoor, the HTTP API and the proxy all need it, and the
// guard may not link the proxy.
package apishape

import (
	"encoding/json"
	"net/http"
	"path"
	"strconv"
	"strings"
)

// Kind is which of the /v1 APIs a request speaks. It decides how the
// proxy's usage tap reads an answer's token counts and end of stream, the
// api label of the metrics, and the shape of the errors gpuhost writes
// itself. It comes from the path alone, so a request is classified before
// its body is read.
type Kind uint8

// The kinds. Other is any other /v1 path; the proxy reads it like chat.
const (
	Other       Kind = iota
	Chat             // /v1/chat/completions
	Completions      // /v1/completions
	Embeddings       // /v1/embeddings
	Messages         // Anthropic /v1/messages
	CountTokens      // Anthropic /v1/messages/count_tokens
	Responses        // OpenAI /v1/responses (and /v1/responses/…)
)

var names = [...]string{Other: "", Chat: "chat", Completions: "completions", Embeddings: "embeddings",
	Messages: "messages", CountTokens: "count_tokens", Responses: "responses"}

// String is the API's name as the request log and the Activity page show
// it ("" for other paths, which the log leaves out).
func (k Kind) String() string {
	if int(k) < len(names) {
		return names[k]
	}
	return ""
}

// Label is the API's name as a metric label value: String, with "other"
// for other paths (an empty label value would drop the label).
func (k Kind) Label() string {
	if s := k.String(); s != "" {
		return s
	}
	return "other"
}

// Anthropic reports whether errors go out in Anthropic's shape.
func (k Kind) Anthropic() bool { return k == Messages || k == CountTokens }

// Of classifies a cleaned request path.
func Of(p string) Kind {
	p = strings.TrimSuffix(p, "/")
	switch p {
	case "/v1/chat/completions":
		return Chat
	case "/v1/completions":
		return Completions
	case "/v1/embeddings":
		return Embeddings
	case "/v1/messages":
		return Messages
	case "/v1/messages/count_tokens":
		return CountTokens
	case "/v1/responses":
		return Responses
	}
	if strings.HasPrefix(p, "/v1/responses/") {
		return Responses
	}
	return Other
}

// IsV1 reports whether a request path is one of the agent APIs' (/v1 and
// below), whose errors go out in an API's shape rather than gpuhost's own.
func IsV1(p string) bool { return p == "/v1" || strings.HasPrefix(p, "/v1/") }

// AnthropicErrorType maps an HTTP status to the error "type" Anthropic's
// API documents for it, which Anthropic SDKs switch on (overloaded_error
// and rate_limit_error are retried).
func AnthropicErrorType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	}
	if status >= 400 && status < 500 {
		return "invalid_request_error"
	}
	return "api_error"
}

// OpenAIErrorType is the OpenAI "type" of a refusal that has no more
// specific one: invalid_request_error for a 4xx (OpenAI's own answer to a
// wrong key says so too), rate_limit_error for 429, service_unavailable for
// 503 (as the proxy's own 503s), server_error for other 5xx. OpenAI SDKs
// choose their exception by the status; the type is for people reading it.
func OpenAIErrorType(status int) string {
	switch {
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status == http.StatusServiceUnavailable:
		return "service_unavailable"
	case status >= 500:
		return "server_error"
	}
	return "invalid_request_error"
}

// Error is an answer gpuhost gives itself on /v1.
type Error struct {
	Status  int
	Type    string // OpenAI "type"; Anthropic's follows Status (AnthropicErrorType)
	Code    string // machine-readable reason: model_not_found, frontdoor_host, …
	Param   string // OpenAI "param" ("" is null); Anthropic's shape has none
	Message string
	Extra   map[string]any // further fields beside message, type and code
}

// Write writes e in the shape of API k: OpenAI's
// {"error":{"message","type","param","code",…extra}} for chat, Responses
// and the rest; Anthropic's {"type":"error","error":{"type","message",…}}
// for Messages and count_tokens, with the type Anthropic documents for the
// status and gpuhost's code and extras beside it. It sets Content-Type and
// Content-Length; other headers (Retry-After, Connection) are the caller's,
// set before.
func Write(w http.ResponseWriter, k Kind, e *Error) {
	body := make(map[string]any, len(e.Extra)+4)
	for key, v := range e.Extra {
		body[key] = v
	}
	body["message"] = e.Message
	body["type"] = e.Type
	body["code"] = e.Code
	if e.Param != "" {
		body["param"] = e.Param
	} else {
		body["param"] = nil
	}
	doc := map[string]any{"error": body}
	if k.Anthropic() {
		body["type"] = AnthropicErrorType(e.Status)
		delete(body, "param")
		doc["type"] = "error"
	}
	data, err := json.Marshal(doc)
	if err != nil {
		// Only our own values get here; a failure is a bug, not input.
		data = []byte(`{"error":{"message":"internal error encoding an error","type":"internal_error","param":null,"code":"internal"}}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(e.Status)
	_, _ = w.Write(data)
}

// Refuse writes a refusal of a request to urlPath (one IsV1 accepts) in its
// API's shape: the middleware in front of the proxy (the guard, the bearer
// check) calls it, so that Claude Code sees an Anthropic error and Codex an
// OpenAI one. code names the reason (frontdoor_host, invalid_api_key, …).
func Refuse(w http.ResponseWriter, urlPath string, status int, code, message string) {
	Write(w, Of(path.Clean(urlPath)), &Error{Status: status, Type: OpenAIErrorType(status), Code: code, Message: message})
}

// Stream is what an error event needs of the stream it ends: the
// Responses API's failed event repeats the response's id and model and
// numbers itself after the events before it.
type Stream struct {
	ResponseID string // from response.created; a new one when unknown
	Model      string
	Sequence   int // the event's sequence_number: the events sent before it
	Created    int64
}

// StreamError is the last event of a stream of API k that cannot finish
// (a switch cut it, the backend broke off): its SSE event type ("" for
// none) and data, in the shape that API's clients read in the middle of a
// stream, so that the SDK raises an error instead of taking the answer so
// far as whole.
//
//   - OpenAI chat, completions and the rest: a data-only event
//     {"error":{"message","type","param","code"}}, the shape OpenAI sends
//     and openai-python raises on; no "data: [DONE]" follows (vLLM sends
//     one after its error event, which a client that skips the error
//     would take for a finished answer).
//   - Anthropic Messages: "event: error" with
//     {"type":"error","error":{"type","message"}}, the type from e.Status
//     (overloaded_error for 503, which Anthropic SDKs retry; api_error for
//     502); no message_stop follows.
//   - OpenAI Responses: "response.failed" with the response, status
//     "failed" and error {"code":"server_error","message"}; no
//     response.completed follows.
func StreamError(k Kind, e *Error, s Stream) (event string, data []byte) {
	var doc any
	switch {
	case k.Anthropic():
		event = "error"
		doc = map[string]any{"type": "error", "error": map[string]any{
			"type": AnthropicErrorType(e.Status), "message": e.Message, "code": e.Code}}
	case k == Responses:
		event = "response.failed"
		id := s.ResponseID
		if id == "" {
			id = "resp_gpuhost_" + strconv.FormatInt(s.Created, 36)
		}
		doc = map[string]any{"type": "response.failed", "sequence_number": s.Sequence, "response": map[string]any{
			"id": id, "object": "response", "created_at": s.Created, "status": "failed", "model": s.Model,
			"output": []any{}, "incomplete_details": nil,
			"error": map[string]any{"code": "server_error", "message": e.Message}}}
	default:
		doc = map[string]any{"error": map[string]any{"message": e.Message, "type": e.Type, "param": nil, "code": e.Code}}
	}
	data, err := json.Marshal(doc)
	if err != nil {
		// Only our own values get here; a failure is a bug, not input.
		data = []byte(`{"error":{"message":"internal error encoding an error","type":"internal_error","param":null,"code":"internal"}}`)
	}
	return event, data
}
