package agent_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"gpuhost/agent"
	"gpuhost/internal/sse"
)

// TestModelGoneBetweenLookupAndRequest: a switch that starts after the
// step's /v1/models lookup makes the daemon refuse the old name with 404.
// With no model configured the loop looks the served model up once more
// and asks it, instead of failing the question. The window is too narrow
// to hit reliably with the real Supervisor (TestBackendSwitchMidLoop covers
// the held request), so a scripted endpoint in the daemon's /v1 shapes
// plays it: the first lookup lists the old model, every later one the new.
func TestModelGoneBetweenLookupAndRequest(t *testing.T) {
	var mu sync.Mutex
	lookups := 0
	var asked []string
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		lookups++
		id := "new-model"
		if lookups == 1 {
			id = "old-model"
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","owned_by":"gpuhost"}]}`, id)
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Model string `json:"model"`
		}
		body, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(body, &req)
		mu.Lock()
		asked = append(asked, req.Model)
		mu.Unlock()
		if req.Model != "new-model" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = fmt.Fprintf(w, `{"error":{"message":"model %q is not loaded and proxy.auto_switch is off","type":"invalid_request_error","code":"model_not_loaded","param":null}}`, req.Model)
			return
		}
		sw := sse.NewWriter(w)
		for _, p := range sseText("the new model answers") {
			_ = sw.Send(sse.Event{Data: []byte(p)})
		}
		_ = sw.Send(sse.Event{Data: []byte("[DONE]")})
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	a := agent.New(newMemTools(), agent.Options{BaseURL: srv.URL + "/v1"})
	res := ask(t, a, "what is the GPU status?")
	if res.Stop != agent.StopAnswer || res.Answer != "the new model answers" {
		t.Fatalf("stop %q answer %q, want an answer from the new model: %s", res.Stop, res.Answer, describe(res))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 2 || asked[0] != "old-model" || asked[1] != "new-model" {
		t.Errorf("models asked %q, want old-model (refused) then new-model", asked)
	}

	// A model the operator configured is used as given: no second guess.
	asked, lookups = nil, 1
	mu.Unlock()
	pinned := agent.New(newMemTools(), agent.Options{BaseURL: srv.URL + "/v1", Model: "old-model"})
	res = ask(t, pinned, "what is the GPU status?")
	mu.Lock()
	if res.Stop != agent.StopError || len(asked) != 1 {
		t.Errorf("pinned model: stop %q after %d requests, want one refused request and an error stop", res.Stop, len(asked))
	}
}
