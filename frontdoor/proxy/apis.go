package proxy

import (
	"net/http"
	"strings"
)

// apiKind is which of the /v1 APIs a request speaks. It decides how the
// usage tap reads the answer's token counts and end of stream, and in which
// shape gpuhost writes the errors it answers itself: an Anthropic client
// (Claude Code) reads only Anthropic's error shape, an OpenAI SDK only
// OpenAI's. The kind comes from the path alone, so a request is classified
// before its body is read.
type apiKind uint8

const (
	apiOther       apiKind = iota // any other /v1 path: read like chat
	apiChat                       // /v1/chat/completions
	apiCompletions                // /v1/completions
	apiEmbeddings                 // /v1/embeddings
	apiMessages                   // Anthropic /v1/messages
	apiCountTokens                // Anthropic /v1/messages/count_tokens
	apiResponses                  // OpenAI /v1/responses (and /v1/responses/…)
)

var apiNames = [...]string{apiOther: "", apiChat: "chat", apiCompletions: "completions", apiEmbeddings: "embeddings",
	apiMessages: "messages", apiCountTokens: "count_tokens", apiResponses: "responses"}

// String is the API's name as the request log and the Activity page show it
// ("" for other paths).
func (k apiKind) String() string {
	if int(k) < len(apiNames) {
		return apiNames[k]
	}
	return ""
}

// anthropic reports whether errors go out in Anthropic's shape.
func (k apiKind) anthropic() bool { return k == apiMessages || k == apiCountTokens }

// apiFor classifies a cleaned request path.
func apiFor(path string) apiKind {
	p := strings.TrimSuffix(path, "/")
	switch p {
	case "/v1/chat/completions":
		return apiChat
	case "/v1/completions":
		return apiCompletions
	case "/v1/embeddings":
		return apiEmbeddings
	case "/v1/messages":
		return apiMessages
	case "/v1/messages/count_tokens":
		return apiCountTokens
	case "/v1/responses":
		return apiResponses
	}
	if strings.HasPrefix(p, "/v1/responses/") {
		return apiResponses
	}
	return apiOther
}

// anthropicErrorType maps an HTTP status to the error "type" Anthropic's
// API documents for it, which Anthropic SDKs switch on (overloaded_error
// and rate_limit_error are retried).
func anthropicErrorType(status int) string {
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
