package backend

import (
	"context"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync"
)

// AgentAPIs are the /v1 APIs beside chat completions that coding agents
// speak: Anthropic Messages (and its count_tokens) and OpenAI Responses.
// gpuhost passes them through untranslated, so which a backend serves
// depends on its version (Ollama: Messages since 0.14, Responses since
// 0.13.3, count_tokens not in 0.17.4; vLLM: both in current releases).
var AgentAPIs = []struct{ Name, Path string }{
	{"messages", "/v1/messages"},
	{"count_tokens", "/v1/messages/count_tokens"},
	{"responses", "/v1/responses"},
}

// ServedAPIs asks a backend at base which of the APIs it serves: "chat"
// always (verify has proved it), then each agent API whose path its
// router knows. The probe is an empty JSON object, which a server that
// has the route refuses with a validation error and one that has not
// answers with its router's 404, so nothing is generated; an error while
// asking leaves the API out.
func ServedAPIs(ctx context.Context, client *http.Client, base string) []string {
	// The probes are independent: asked side by side, they cost one round
	// trip instead of one per API.
	served := make([]bool, len(AgentAPIs))
	var wg sync.WaitGroup
	for i, a := range AgentAPIs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			served[i] = routeKnown(ctx, client, base+a.Path)
		}()
	}
	wg.Wait()
	out := []string{"chat"}
	for i, a := range AgentAPIs {
		if served[i] {
			out = append(out, a.Name)
		}
	}
	return out
}

// routeKnown posts an empty JSON object to url: true when the answer is
// not the router's "no such path"; false on any error.
func routeKnown(ctx context.Context, client *http.Client, url string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader("{}"))
	if err != nil {
		return false
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	return !RouterNotFound(resp.StatusCode, resp.Header.Get("Content-Type"), body)
}

// RouterNotFound tells a router's "no such path" (a plain-text 404 or 405,
// FastAPI's {"detail":"Not Found"}) from an API's own error answer.
func RouterNotFound(status int, contentType string, body []byte) bool {
	if status != http.StatusNotFound && status != http.StatusMethodNotAllowed {
		return false
	}
	if mt, _, _ := mime.ParseMediaType(contentType); mt != "application/json" {
		return true
	}
	var v struct {
		Detail any `json:"detail"`
		Error  any `json:"error"`
	}
	if json.Unmarshal(body, &v) != nil {
		return false
	}
	d, _ := v.Detail.(string)
	return v.Error == nil && (d == "Not Found" || d == "Method Not Allowed")
}
