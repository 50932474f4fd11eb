package proxy_test

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// TestUsageSanityOnTheWire: through the proxy, a backend's absurd usage
// (2^63-1 output tokens, a negative prompt, usage after message_stop, more
// than the request's max_tokens) never reaches the observer behind
// gpuhost_proxy_tokens_total and the Activity page; a sane report does.
func TestUsageSanityOnTheWire(t *testing.T) {
	var answer atomic.Pointer[string]
	url, obs, _, _ := wireEnv(t, func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/messages") {
			w.Header().Set("Content-Type", "text/event-stream")
		} else {
			w.Header().Set("Content-Type", "application/json")
		}
		_, _ = io.WriteString(w, *answer.Load())
	})
	tests := []struct {
		name, path, body, answer string
		prompt, completion       int
	}{
		{"sane", "/v1/chat/completions", `{"model":"served","max_tokens":16}`, `{"usage":{"prompt_tokens":12,"completion_tokens":3}}`, 12, 3},
		{"int64 max", "/v1/chat/completions", `{"model":"served"}`, `{"usage":{"prompt_tokens":1,"completion_tokens":9223372036854775807}}`, 0, 0},
		{"negative", "/v1/chat/completions", `{"model":"served"}`, `{"usage":{"prompt_tokens":-2,"completion_tokens":3}}`, 0, 0},
		{"over max_tokens", "/v1/chat/completions", `{"model":"served","max_tokens":16}`, `{"usage":{"prompt_tokens":5,"completion_tokens":5000}}`, 0, 0},
		{"after message_stop", "/v1/messages", `{"model":"served","max_tokens":100}`,
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":4}}\n\n" +
				"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":90}}\n\n", 10, 4},
	}
	for i, tc := range tests {
		answer.Store(&tc.answer)
		req, _ := http.NewRequest(http.MethodPost, url+tc.path, strings.NewReader(tc.body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		o := obs.waitFor(t, i+1)[i]
		if o.prompt != tc.prompt || o.completion != tc.completion {
			t.Errorf("%s: observed %d/%d tokens, want %d/%d", tc.name, o.prompt, o.completion, tc.prompt, tc.completion)
		}
	}
}
