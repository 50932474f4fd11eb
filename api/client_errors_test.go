package api

import (
	"net/http"
	"testing"
)

// TestRemoteErrorShapes: the client reads gpuhost's own errors, the /v1
// errors in OpenAI's and Anthropic's shapes (GET /v1/models beyond
// loopback without the token), and anything else as the body.
func TestRemoteErrorShapes(t *testing.T) {
	tests := []struct {
		name, body string
		want       string
	}{
		{"gpuhost's", `{"error":"unauthorized","detail":"missing or wrong bearer token"}`, "unauthorized (HTTP 401): missing or wrong bearer token"},
		{"OpenAI's", `{"error":{"message":"missing or wrong bearer token","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`,
			"unauthorized (HTTP 401): missing or wrong bearer token"},
		{"Anthropic's", `{"type":"error","error":{"type":"authentication_error","message":"missing or wrong bearer token","code":"invalid_api_key"}}`,
			"unauthorized (HTTP 401): missing or wrong bearer token"},
		{"not JSON", "no\n", "Unauthorized (HTTP 401): no"},
	}
	for _, tc := range tests {
		if got := remoteError(http.StatusUnauthorized, []byte(tc.body)).Error(); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
