package proxy_test

import (
	"bytes"
	"log/slog"
	"net"
	"net/http/httptest"
	"strconv"

	"github.com/labstack/echo/v4"

	"encoding/json"
	"errors"
	"fmt"
	"gpuhost/bench/ollamatest"
	"gpuhost/config"
	"gpuhost/frontdoor/proxy"
	"gpuhost/units"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"gpuhost/appliance/appliancetest"
	"gpuhost/internal/activity"
	"gpuhost/internal/sse"
	"gpuhost/internal/testkit"
)

// backendUsage reads the usage an answer of api reports itself, the way a
// client of that API reads it (not the proxy's code): whole bodies'
// "usage", Messages' message_start and message_delta, Responses'
// response.completed, chat's usage chunk.
func backendUsage(t *testing.T, api string, stream bool, body []byte) (prompt, completion int) {
	t.Helper()
	type usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		InputTokens      int `json:"input_tokens"`
		OutputTokens     int `json:"output_tokens"`
	}
	var doc struct {
		Type     string `json:"type"`
		Usage    *usage `json:"usage"`
		Message  struct{ Usage *usage }
		Response struct{ Usage *usage }
	}
	if !stream {
		if err := json.Unmarshal(body, &doc); err != nil || doc.Usage == nil {
			t.Fatalf("%s answer without usage: %s", api, body)
		}
		return doc.Usage.PromptTokens + doc.Usage.InputTokens, doc.Usage.CompletionTokens + doc.Usage.OutputTokens
	}
	r := sse.NewReader(bytes.NewReader(body), 0)
	ended := false
	for {
		e, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if string(e.Data) == "[DONE]" {
			ended = api == "chat"
			continue
		}
		doc.Usage, doc.Message.Usage, doc.Response.Usage = nil, nil, nil
		if err := json.Unmarshal(e.Data, &doc); err != nil {
			t.Fatalf("%s event %s: %v", api, e.Data, err)
		}
		switch {
		case api == "messages" && doc.Type == "message_start":
			prompt, completion = doc.Message.Usage.InputTokens, doc.Message.Usage.OutputTokens
		case api == "messages" && doc.Type == "message_delta":
			// Cumulative, as Anthropic documents; Ollama's message_start
			// input_tokens is an estimate its message_delta corrects.
			completion = doc.Usage.OutputTokens
			if doc.Usage.InputTokens > 0 {
				prompt = doc.Usage.InputTokens
			}
		case api == "messages" && doc.Type == "message_stop":
			ended = true
		case api == "responses" && (doc.Type == "response.completed" || doc.Type == "response.incomplete"):
			prompt, completion, ended = doc.Response.Usage.InputTokens, doc.Response.Usage.OutputTokens, true
		case api == "chat" && doc.Usage != nil:
			prompt, completion = doc.Usage.PromptTokens, doc.Usage.CompletionTokens
		}
	}
	if !ended {
		t.Fatalf("%s stream without its end event", api)
	}
	return prompt, completion
}

// agentBody is request i of api for model: prompts and caps vary, so the
// counts do.
func agentBody(api, model string, stream bool, i int) (string, []byte) {
	q := fmt.Sprintf("Question %d: %s", i, strings.Repeat("why ", i%13))
	maxTok := 1 + i%9
	var path string
	var req map[string]any
	switch api {
	case "messages":
		path = "/v1/messages"
		req = map[string]any{"model": model, "max_tokens": maxTok, "system": "Be brief.",
			"messages": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": q}}}}}
	case "responses":
		path = "/v1/responses"
		req = map[string]any{"model": model, "max_output_tokens": maxTok, "instructions": "Be brief.", "input": q}
	default:
		path = "/v1/chat/completions"
		req = map[string]any{"model": model, "max_tokens": maxTok, "messages": []any{map[string]any{"role": "user", "content": q}}}
		if stream {
			req["stream_options"] = map[string]any{"include_usage": true}
		}
	}
	req["stream"] = stream
	b, _ := json.Marshal(req)
	return path, b
}

// usageMatches sends perCase requests per API (Messages, Responses, chat),
// streamed and whole, through the proxy at url, and compares the tokens
// the request log (log) and the metrics observer (obs, which has seen
// obsBefore requests already) record with the usage the backend's answer
// reports: they must be equal for every request, and each log entry and
// observation names its API. It returns the number of requests compared.
func usageMatches(t *testing.T, url, model string, log *activity.Log, obs *observer, perCase int) int {
	t.Helper()
	total := 0
	for _, api := range []string{"messages", "responses", "chat"} {
		for _, stream := range []bool{false, true} {
			var want [][2]int
			seq0, obs0 := log.LastSeq(), len(obs.all())
			for i := 0; i < perCase; i++ {
				path, body := agentBody(api, model, stream, i)
				resp := post(t, t.Context(), url+path, body)
				data, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK {
					t.Fatalf("%s stream=%v #%d: %d %v %s", api, stream, i, resp.StatusCode, err, data)
				}
				p, c := backendUsage(t, api, stream, data)
				if c <= 0 || c > 1+i%9 || p <= 0 {
					t.Fatalf("%s stream=%v #%d: the backend reports %d/%d tokens", api, stream, i, p, c)
				}
				want = append(want, [2]int{p, c})
			}
			var got []activity.Request
			if !testkit.Poll(10*time.Second, func() bool {
				got = log.Recent(activity.Filter{}, perCase)
				return log.LastSeq() == seq0+uint64(perCase) && len(got) == perCase && len(obs.all()) == obs0+perCase
			}) {
				t.Fatalf("%s: %d log entries, %d observations", api, log.LastSeq()-seq0, len(obs.all())-obs0)
			}
			slices.Reverse(got)
			seen := obs.all()[obs0:]
			match := 0
			for i, r := range got {
				if r.PromptTokens == want[i][0] && r.CompletionTokens == want[i][1] && r.API == api && r.Stream == stream &&
					seen[i].api.Label() == api && seen[i].prompt == want[i][0] && seen[i].completion == want[i][1] {
					match++
				} else {
					t.Errorf("%s stream=%v #%d: logged %d/%d (api %q stream %v), metrics %d/%d (api %q), backend %d/%d", api, stream, i,
						r.PromptTokens, r.CompletionTokens, r.API, r.Stream, seen[i].prompt, seen[i].completion, seen[i].api.Label(), want[i][0], want[i][1])
				}
			}
			total += perCase
			t.Logf("%s stream=%v: %d/%d requests' usage (log and metrics) matched the backend's", api, stream, match, perCase)
		}
	}
	return total
}

// TestAgentAPIsUsageMatchesBackend: 100 requests per API, streamed and
// whole, through the proxy to the simulated vLLM (a real Supervisor and
// unit): gpuhost's counts equal the backend's own, and the access log says
// each stream reached its API's end event.
func TestAgentAPIsUsageMatchesBackend(t *testing.T) {
	e := newEnv(t, appliancetest.Options{Activate: "coder"})
	log := activity.NewLog(100)
	e.p.SetRecorder(log)
	n := usageMatches(t, e.url, "qwen3-coder", log, e.obs, 100)
	for _, l := range e.logs.waitRequests(t, n) {
		if l["stream"] == true && l["done"] != true {
			t.Errorf("a complete stream logged done=false: %v", l)
		}
	}
}

// TestAgentAPIsUsageRealOllama: the same against a real Ollama 0.17.4
// (built from the Go module proxy, tiny generated model), which serves
// /v1/messages and /v1/responses itself: gpuhost's counts equal Ollama's.
func TestAgentAPIsUsageRealOllama(t *testing.T) {
	base, model := ollamatest.Start(t)
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(base, "http://"))
	n, _ := strconv.Atoi(port)
	prof := &units.Profile{Name: "tiny", Backend: units.Ollama, Model: model, Port: n}
	p := proxy.New(appliancetest.Fixed{Profile: prof}, config.ProxyConfig{}, func() map[string]*units.Profile {
		return map[string]*units.Profile{prof.Name: prof}
	}, slog.New(slog.DiscardHandler))
	obs := &observer{}
	p.SetObserver(obs)
	log := activity.NewLog(100)
	p.SetRecorder(log)
	e := echo.New()
	p.Register(e)
	srv := httptest.NewServer(e)
	t.Cleanup(func() { srv.Close(); p.Close() })
	// Ollama 0.17.4 has no count_tokens: a clear error in Anthropic's shape.
	resp := post(t, t.Context(), srv.URL+"/v1/messages/count_tokens", []byte(`{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`))
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(data), `"type":"error"`) || !strings.Contains(string(data), "ollama "+ollamatest.Version) ||
		!strings.Contains(string(data), "/v1/messages/count_tokens") {
		t.Errorf("count_tokens on Ollama %s: %d %s", ollamatest.Version, resp.StatusCode, data)
	}
	usageMatches(t, srv.URL, model, log, obs, 100)
}

// TestUnservedAPI: a backend whose router does not know the API (an older
// vLLM's FastAPI 404) gets an error in the client's shape naming backend
// and version; the backend's own 404s (an unknown model) pass unchanged.
func TestUnservedAPI(t *testing.T) {
	url, _, _, _ := wireEnv(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/version":
			_, _ = io.WriteString(w, `{"version":"0.6.1"}`)
		case "/v1/embeddings":
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"error":{"message":"The model does not exist.","type":"NotFoundError","code":404}}`)
		default:
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"detail":"Not Found"}`)
		}
	})
	for _, tc := range []struct {
		path, want string
	}{
		{"/v1/messages", `"type":"error"`},
		{"/v1/responses", `"code":"api_not_served"`},
		{"/v1/embeddings", `The model does not exist.`},
	} {
		resp := post(t, t.Context(), url+tc.path, []byte(`{"model":"served","input":"x"}`))
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(data), tc.want) {
			t.Errorf("%s: %d %s", tc.path, resp.StatusCode, data)
		}
		if tc.path != "/v1/embeddings" && !strings.Contains(string(data), "vllm 0.6.1") {
			t.Errorf("%s: the error does not name the backend and version: %s", tc.path, data)
		}
	}
}

// TestAgentAPIErrorShapes: what gpuhost answers itself on /v1/messages is
// in Anthropic's shape, on /v1/responses in OpenAI's.
func TestAgentAPIErrorShapes(t *testing.T) {
	e := newEnv(t, appliancetest.Options{Activate: "coder"})
	for _, tc := range []struct {
		path, body string
		status     int
		anthType   string // "" = OpenAI shape
	}{
		{"/v1/messages", `{"model":"claude-sonnet-4-5","max_tokens":5,"messages":[]}`, http.StatusNotFound, "not_found_error"},
		{"/v1/messages/count_tokens", `{"model":"nope","messages":[]}`, http.StatusNotFound, "not_found_error"},
		{"/v1/messages", `{"model":`, http.StatusBadRequest, "invalid_request_error"},
		{"/v1/responses", `{"model":"nope","input":"x"}`, http.StatusNotFound, ""},
		{"/v1/chat/completions", `{"model":"nope","messages":[]}`, http.StatusNotFound, ""},
	} {
		resp := post(t, t.Context(), e.url+tc.path, []byte(tc.body))
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var doc struct {
			Type  *string
			Error struct{ Type, Message, Code string }
		}
		if err := json.Unmarshal(data, &doc); err != nil || resp.StatusCode != tc.status || doc.Error.Message == "" {
			t.Errorf("%s %s: %d %s", tc.path, tc.body, resp.StatusCode, data)
			continue
		}
		if tc.anthType != "" && (doc.Type == nil || *doc.Type != "error" || doc.Error.Type != tc.anthType) {
			t.Errorf("%s: not Anthropic's shape: %s", tc.path, data)
		}
		if tc.anthType == "" && (doc.Type != nil || doc.Error.Type != "invalid_request_error" || doc.Error.Code == "") {
			t.Errorf("%s: not OpenAI's shape: %s", tc.path, data)
		}
	}
}

// TestClientModelsRoute: Claude Code's own model ids reach the profile
// proxy.client_models maps them to (the body rewritten to the backend's
// name, the log keeping what the client asked for); other names still 404.
func TestClientModelsRoute(t *testing.T) {
	e := newEnv(t, appliancetest.Options{Activate: "coder",
		ExtraYAML: "proxy:\n  client_models:\n    - {match: 'claude-*', profile: coder}\n"})
	body := `{"model":"claude-sonnet-4-5-20250929","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`
	resp := post(t, t.Context(), e.url+"/v1/messages", []byte(body))
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var msg struct{ Model string }
	if err := json.Unmarshal(data, &msg); err != nil || resp.StatusCode != http.StatusOK || msg.Model != "qwen3-coder" {
		t.Fatalf("mapped claude id: %d %s", resp.StatusCode, data)
	}
	l := e.logs.waitRequests(t, 1)[0]
	if l["model"] != "qwen3-coder" || l["requested"] != "claude-sonnet-4-5-20250929" || l["api"] != "messages" {
		t.Errorf("log line %v", l)
	}
	resp = post(t, t.Context(), e.url+"/v1/messages", []byte(strings.Replace(body, "claude-sonnet-4-5-20250929", "gpt-5", 1)))
	data, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(data), `"not_found_error"`) {
		t.Errorf("unmapped name: %d %s", resp.StatusCode, data)
	}
}
