package apishape

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

func TestOf(t *testing.T) {
	tests := map[string]Kind{
		"/v1/chat/completions": Chat, "/v1/completions": Completions, "/v1/embeddings": Embeddings,
		"/v1/messages": Messages, "/v1/messages/": Messages, "/v1/messages/count_tokens": CountTokens,
		"/v1/responses": Responses, "/v1/responses/resp_1": Responses, "/v1/models": Other, "/v1/messagesx": Other,
	}
	for path, want := range tests {
		if got := Of(path); got != want {
			t.Errorf("Of(%q) = %v, want %v", path, got, want)
		}
	}
}

// TestNames: the access log's names, and the metric label's, one each; an
// unknown kind is "other" (never an empty or invalid label value).
func TestNames(t *testing.T) {
	tests := []struct {
		k           Kind
		name, label string
	}{
		{Other, "", "other"}, {Chat, "chat", "chat"}, {Completions, "completions", "completions"},
		{Embeddings, "embeddings", "embeddings"}, {Messages, "messages", "messages"},
		{CountTokens, "count_tokens", "count_tokens"}, {Responses, "responses", "responses"}, {Kind(200), "", "other"},
	}
	for _, tc := range tests {
		if tc.k.String() != tc.name || tc.k.Label() != tc.label {
			t.Errorf("kind %d: String %q Label %q, want %q %q", tc.k, tc.k.String(), tc.k.Label(), tc.name, tc.label)
		}
	}
}

// TestRefuseShapes: per path and status, the shape and the types the
// caller's SDK reads: Anthropic's on Messages and count_tokens (also
// written unclean), OpenAI's elsewhere on /v1.
func TestRefuseShapes(t *testing.T) {
	tests := []struct {
		path     string
		status   int
		wantType string
		anth     bool
	}{
		{"/v1/messages", 401, "authentication_error", true},
		{"/v1/messages", 403, "permission_error", true},
		{"/v1/messages", 404, "not_found_error", true},
		{"/v1/messages", 413, "request_too_large", true},
		{"/v1/messages", 415, "invalid_request_error", true},
		{"/v1/messages", 421, "invalid_request_error", true},
		{"/v1/messages", 429, "rate_limit_error", true},
		{"/v1/messages", 500, "api_error", true},
		{"/v1/messages", 503, "overloaded_error", true},
		{"/v1/messages", 529, "overloaded_error", true},
		{"/v1/messages/count_tokens", 401, "authentication_error", true},
		{"/v1//messages/", 429, "rate_limit_error", true},
		{"/v1/chat/completions", 401, "invalid_request_error", false},
		{"/v1/chat/completions", 429, "rate_limit_error", false},
		{"/v1/responses", 403, "invalid_request_error", false},
		{"/v1/responses", 503, "service_unavailable", false},
		{"/v1/embeddings", 500, "server_error", false},
		{"/v1/models", 404, "invalid_request_error", false},
	}
	for _, tc := range tests {
		w := httptest.NewRecorder()
		Refuse(w, tc.path, tc.status, "some_code", "why it was refused")
		if w.Code != tc.status || w.Header().Get("Content-Type") != "application/json" {
			t.Errorf("%s %d: status %d, Content-Type %q", tc.path, tc.status, w.Code, w.Header().Get("Content-Type"))
		}
		var doc struct {
			Type  *string `json:"type"`
			Error struct {
				Type, Message, Code string
				Param               *string
			} `json:"error"`
		}
		var raw struct{ Error map[string]any }
		if err := json.Unmarshal(w.Body.Bytes(), &doc); err != nil || json.Unmarshal(w.Body.Bytes(), &raw) != nil {
			t.Fatalf("%s %d: not JSON: %v %s", tc.path, tc.status, err, w.Body)
		}
		_, hasParam := raw.Error["param"]
		if doc.Error.Type != tc.wantType || doc.Error.Message != "why it was refused" || doc.Error.Code != "some_code" {
			t.Errorf("%s %d: error %+v, want type %s", tc.path, tc.status, doc.Error, tc.wantType)
		}
		if tc.anth && (doc.Type == nil || *doc.Type != "error" || hasParam) {
			t.Errorf("%s %d: not Anthropic's shape: %s", tc.path, tc.status, w.Body)
		}
		if !tc.anth && (doc.Type != nil || !hasParam || doc.Error.Param != nil) {
			t.Errorf("%s %d: not OpenAI's shape: %s", tc.path, tc.status, w.Body)
		}
	}
}

// TestWriteKeepsCallerHeadersAndExtras: headers set before Write go out;
// extras and param sit beside the message; Content-Length is exact.
func TestWriteKeepsCallerHeadersAndExtras(t *testing.T) {
	w := httptest.NewRecorder()
	w.Header().Set("Retry-After", "5")
	Write(w, Chat, &Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "model_not_found", Param: "model",
		Message: "no model x", Extra: map[string]any{"models": []string{"a"}}})
	var doc struct {
		Error struct {
			Type, Code, Param, Message string
			Models                     []string
		}
	}
	if err := json.Unmarshal(w.Body.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if w.Header().Get("Retry-After") != "5" || w.Header().Get("Content-Length") != strconv.Itoa(w.Body.Len()) ||
		doc.Error.Param != "model" || len(doc.Error.Models) != 1 || doc.Error.Code != "model_not_found" {
		t.Errorf("headers %v body %s", w.Header(), w.Body)
	}
}

// TestStreamError: the event that ends a stream, per API, in the shape its
// SDKs read mid-stream: OpenAI's data-only {"error":…}, Anthropic's
// "event: error" with the type for the status, Responses' response.failed
// repeating the stream's response.
func TestStreamError(t *testing.T) {
	e := &Error{Status: 503, Type: "service_unavailable", Code: "switch_cut", Message: "cut"}
	s := Stream{ResponseID: "resp_1", Model: "m", Sequence: 7, Created: 1700000000}
	tests := []struct {
		k         Kind
		status    int
		wantEvent string
		want      string
	}{
		{Chat, 503, "", `{"error":{"code":"switch_cut","message":"cut","param":null,"type":"service_unavailable"}}`},
		{Completions, 503, "", `{"error":{"code":"switch_cut","message":"cut","param":null,"type":"service_unavailable"}}`},
		{Messages, 503, "error", `{"error":{"code":"switch_cut","message":"cut","type":"overloaded_error"},"type":"error"}`},
		{Messages, 502, "error", `{"error":{"code":"switch_cut","message":"cut","type":"api_error"},"type":"error"}`},
		{Responses, 503, "response.failed", `{"response":{"created_at":1700000000,"error":{"code":"server_error","message":"cut"},"id":"resp_1","incomplete_details":null,"model":"m","object":"response","output":[],"status":"failed"},"sequence_number":7,"type":"response.failed"}`},
	}
	for _, tc := range tests {
		e.Status = tc.status
		ev, data := StreamError(tc.k, e, s)
		if ev != tc.wantEvent || string(data) != tc.want {
			t.Errorf("%s %d: event %q data %s\nwant event %q data %s", tc.k, tc.status, ev, data, tc.wantEvent, tc.want)
		}
	}
	// Without a response.created seen, the failed event still names a response.
	_, data := StreamError(Responses, e, Stream{Created: 1700000000})
	var d struct{ Response struct{ ID string } }
	if err := json.Unmarshal(data, &d); err != nil || !strings.HasPrefix(d.Response.ID, "resp_") {
		t.Errorf("response.failed without a known response: %s", data)
	}
}
