package proxy_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/appliance/appliancetest"
	"gpuhost/config"
	"gpuhost/internal/sse"
	"gpuhost/internal/testkit"
	"gpuhost/units"
)

// clientEvent is one SSE event as the client read it.
type clientEvent struct {
	Type, Data string
}

func (e clientEvent) String() string {
	if e.Type == "" {
		return "data: " + e.Data
	}
	return "event: " + e.Type + " / data: " + e.Data
}

// readEvents reads an SSE answer to its end as a client does: every event,
// and the error the body ended with (nil: a clean end). onFirst, if set,
// runs after the first event, before the rest is read.
func readEvents(resp *http.Response, onFirst func()) ([]clientEvent, error) {
	defer resp.Body.Close()
	rd := sse.NewReader(resp.Body, 1<<20)
	var evs []clientEvent
	for {
		e, err := rd.Next()
		if errors.Is(err, io.EOF) {
			return evs, nil
		}
		if err != nil {
			return evs, err
		}
		evs = append(evs, clientEvent{Type: e.Type, Data: string(e.Data)})
		if len(evs) == 1 && onFirst != nil {
			onFirst()
		}
	}
}

// terminated reports whether evs hold api's end marker, which says the
// answer is whole.
func terminated(api string, evs []clientEvent) bool {
	for _, e := range evs {
		switch {
		case api == "chat" && e.Data == "[DONE]",
			api == "messages" && e.Type == "message_stop",
			api == "responses" && (e.Type == "response.completed" || e.Type == "response.incomplete"):
			return true
		}
	}
	return false
}

// errorEvent checks that last is api's error event with code (gpuhost's
// reason) and, for Messages, Anthropic's errType; it returns the message.
func errorEvent(t *testing.T, api string, last clientEvent, code, anthType string) string {
	t.Helper()
	var doc struct {
		Type  string `json:"type"`
		Error struct {
			Type, Code, Message string
		} `json:"error"`
		Sequence *int `json:"sequence_number"`
		Response struct {
			ID, Object, Status string
			Error              struct{ Code, Message string }
		} `json:"response"`
	}
	if err := json.Unmarshal([]byte(last.Data), &doc); err != nil {
		t.Fatalf("%s: the last event is not JSON: %v: %s", api, err, last)
	}
	ok := false
	msg := doc.Error.Message
	switch api {
	case "chat":
		ok = last.Type == "" && doc.Error.Code == code && doc.Error.Message != ""
	case "messages":
		ok = last.Type == "error" && doc.Type == "error" && doc.Error.Type == anthType && doc.Error.Code == code && doc.Error.Message != ""
	case "responses":
		msg = doc.Response.Error.Message
		ok = last.Type == "response.failed" && doc.Type == "response.failed" && doc.Sequence != nil && doc.Response.Object == "response" &&
			doc.Response.Status == "failed" && doc.Response.Error.Code == "server_error" && msg != ""
	}
	if !ok {
		t.Fatalf("%s: the last event is not the API's error event (code %s): %s", api, code, last)
	}
	return msg
}

// upstreamEvents are the first events of a stream of each API, as a
// backend sends them.
var upstreamEvents = map[string][]sse.Event{
	"chat": {{Data: []byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}`)}},
	"messages": {
		{Type: "message_start", Data: []byte(`{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"usage":{"input_tokens":3,"output_tokens":0}}}`)},
		{Type: "content_block_delta", Data: []byte(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"}}`)},
	},
	"responses": {
		{Type: "response.created", Data: []byte(`{"type":"response.created","sequence_number":0,"response":{"id":"resp_up1","object":"response","created_at":1700000000,"status":"in_progress","model":"served","output":[]}}`)},
		{Type: "response.output_text.delta", Data: []byte(`{"type":"response.output_text.delta","sequence_number":1,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"a"}`)},
	},
}

var apiPaths = map[string]string{"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}

// TestStreamWithoutEndMarker: a stream the backend ends without its API's
// end marker (its body ends, or its connection breaks: it was put to sleep
// or died mid-answer) reaches the client as the API's error event, the
// body's last, and ends cleanly; no end marker is made up and the request
// counts as 502. A backend's own error event, or a stream that ends well,
// gets nothing added.
func TestStreamWithoutEndMarker(t *testing.T) {
	own := map[string]sse.Event{
		"chat":      {Data: []byte(`{"error":{"message":"engine dead","type":"InternalServerError","param":null,"code":500}}`)},
		"messages":  {Type: "error", Data: []byte(`{"type":"error","error":{"type":"api_error","message":"engine dead"}}`)},
		"responses": {Type: "error", Data: []byte(`{"type":"error","code":"server_error","message":"engine dead","sequence_number":2}`)},
	}
	end := map[string]sse.Event{
		"chat":      {Data: []byte("[DONE]")},
		"messages":  {Type: "message_stop", Data: []byte(`{"type":"message_stop"}`)},
		"responses": {Type: "response.completed", Data: []byte(`{"type":"response.completed","sequence_number":2,"response":{"id":"resp_up1","status":"completed","usage":{"input_tokens":3,"output_tokens":1}}}`)},
	}
	for _, apiName := range []string{"chat", "messages", "responses"} {
		for _, how := range []string{"body ends", "connection breaks", "partial event", "own error", "end marker"} {
			t.Run(apiName+"/"+how, func(t *testing.T) {
				url, obs, _, _ := wireEnv(t, func(w http.ResponseWriter, r *http.Request) {
					sw := sse.NewWriter(w)
					for _, e := range upstreamEvents[apiName] {
						_ = sw.Send(e)
					}
					switch how {
					case "own error":
						_ = sw.Send(own[apiName])
					case "end marker":
						_ = sw.Send(end[apiName])
					case "partial event":
						_, _ = io.WriteString(w, "data: {\"half")
						http.NewResponseController(w).Flush()
					case "connection breaks":
						if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
							conn.Close()
						}
					}
				})
				resp := post(t, t.Context(), url+apiPaths[apiName], []byte(`{"model":"served","stream":true}`))
				evs, err := readEvents(resp, nil)
				if err != nil {
					t.Fatalf("the client's body ended with %v, want a clean end after the events %v", err, evs)
				}
				up := len(upstreamEvents[apiName])
				wantStatus := http.StatusBadGateway
				switch how {
				case "own error", "end marker":
					wantStatus = http.StatusOK
					if len(evs) != up+1 {
						t.Fatalf("client got %d events, want the backend's %d: %v", len(evs), up+1, evs)
					}
				case "partial event":
					// The half event is ended (the client reads it
					// broken), then comes the error.
					if len(evs) != up+2 || !strings.HasPrefix(evs[up].Data, `{"half`) {
						t.Fatalf("client got %v, want the %d events, the broken one, the error", evs, up)
					}
				default:
					if len(evs) != up+1 {
						t.Fatalf("client got %d events, want the backend's %d and the error: %v", len(evs), up, evs)
					}
				}
				if wantStatus != http.StatusOK {
					errorEvent(t, apiName, evs[len(evs)-1], "stream_incomplete", "api_error")
					if terminated(apiName, evs) {
						t.Fatalf("an end marker reached the client after the error: %v", evs)
					}
				}
				if apiName == "responses" && wantStatus != http.StatusOK {
					var d struct {
						Seq      int `json:"sequence_number"`
						Response struct{ ID, Model string }
					}
					_ = json.Unmarshal([]byte(evs[len(evs)-1].Data), &d)
					if d.Response.ID != "resp_up1" || d.Response.Model != "served" || d.Seq != len(evs)-1 {
						t.Errorf("response.failed %+v, want the stream's response resp_up1 and sequence %d", d, len(evs)-1)
					}
				}
				if o := obs.waitFor(t, 1)[0]; o.status != wantStatus {
					t.Fatalf("observation %+v, want status %d", o, wantStatus)
				}
			})
		}
	}
}

// drainBody is a streamed request of api for maxTokens tokens.
func drainBody(api string, maxTokens int) []byte {
	req := map[string]any{"model": "qwen3-coder", "stream": true}
	switch api {
	case "messages":
		req["max_tokens"] = maxTokens
		req["messages"] = []any{map[string]any{"role": "user", "content": "write the program"}}
	case "responses":
		req["max_output_tokens"] = maxTokens
		req["input"] = "write the program"
	default:
		req["max_tokens"] = maxTokens
		req["messages"] = []any{map[string]any{"role": "user", "content": "write the program"}}
	}
	b, _ := json.Marshal(req)
	return b
}

// TestSwitchDrainsRequestsInFlight: a stream in flight when a switch
// begins, for each of chat, Messages and Responses, through the proxy to
// a real Supervisor whose vLLM profile goes into standby (sleep level 1).
// Short (it ends within switch.drain_timeout), the switch waits for it: it
// ends with its own end marker and the drain step counts it drained. Long,
// it is cut when the bound runs out: the client's last event is the API's
// error event (no end marker after it), the body ends cleanly, the request
// counts as 503 and the drain step counts it cut. Either way the backend
// was asleep only after the stream had ended: the simulator aborted
// nothing.
func TestSwitchDrainsRequestsInFlight(t *testing.T) {
	e := newEnv(t, appliancetest.Options{Activate: "coder", Hook: func(cfg *config.Config) {
		cfg.Profiles["coder"].Standby = "sleep1"
		cfg.Profiles["coder"].Sim.DecodeTPS = 40
	}})
	e.f.Sup.SetDrainer(e.p)
	for _, tc := range []struct {
		name      string
		maxTokens int
		drain     time.Duration
		cut       bool
	}{
		// 40 tokens at 40 tok/s: about a second, well within the bound.
		{"drained", 40, 2 * time.Minute, false},
		// The simulator's whole reply (64 tokens, its natural length) at
		// 40 tok/s: 1.6 s, far past the bound.
		{"cut", 4000, 50 * time.Millisecond, true},
	} {
		for _, apiName := range []string{"chat", "messages", "responses"} {
			t.Run(apiName+"/"+tc.name, func(t *testing.T) {
				*e.f.Cfg.Switch.DrainTimeout = config.Duration(tc.drain)
				ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
				defer cancel()
				resp := post(t, ctx, e.url+apiPaths[apiName], drainBody(apiName, tc.maxTokens))
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d", resp.StatusCode)
				}
				obs0 := len(e.obs.all())
				switched := make(chan []api.Event, 1)
				evs, err := readEvents(resp, func() {
					// The stream is in flight (the Supervisor's verify of an
					// idle backend waits for none): switch away under it.
					if n := e.p.InFlight("coder"); n != 1 {
						t.Errorf("InFlight(coder) = %d with one stream running", n)
					}
					go func() {
						evs, err := e.f.SwitchTo(t, "llama")
						if err != nil {
							t.Errorf("switch: %v%s", err, appliancetest.Describe(evs))
						}
						switched <- evs
					}()
				})
				if err != nil {
					t.Fatalf("the client's body ended with %v after %d events", err, len(evs))
				}
				steps := <-switched
				if n := e.p.InFlight("coder"); n != 0 {
					t.Errorf("InFlight(coder) = %d after the drain", n)
				}
				drain := stepDone(t, steps, "drain")
				wantDrained, wantCut, wantStatus := 1, 0, http.StatusOK
				if tc.cut {
					wantDrained, wantCut, wantStatus = 0, 1, http.StatusServiceUnavailable
					errorEvent(t, apiName, evs[len(evs)-1], "switch_cut", "overloaded_error")
					if terminated(apiName, evs) {
						t.Fatalf("an end marker reached the client of a cut stream: %v", evs)
					}
				} else if !terminated(apiName, evs) {
					t.Fatalf("the drained stream has no end marker; last event %v", evs[len(evs)-1])
				}
				if d, c := drain.Detail["drained"], drain.Detail["cut"]; d != wantDrained || c != wantCut {
					t.Fatalf("drain step: %s (drained %v, cut %v), want drained %d cut %d", drain.Message, d, c, wantDrained, wantCut)
				}
				if first := stepOrder(steps); !slices.Equal(first[:2], []string{"drain", "standby"}) {
					t.Fatalf("steps %v, want drain then standby first", first)
				}
				if o := e.obs.waitFor(t, obs0+1)[obs0]; o.status != wantStatus {
					t.Fatalf("observation %+v, want status %d", o, wantStatus)
				}
				if lines, _ := e.f.Journal(ctx, e.f.Cfg.BackendFor(units.VLLM).Unit, 200); slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, "aborted request") }) {
					t.Fatalf("the vLLM simulator aborted a request: it was put to sleep under one")
				}
				t.Logf("%d events; last: %s; drain step: %s", len(evs), evs[len(evs)-1], drain.Message)
				if _, err := e.f.SwitchTo(t, "coder"); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// stepDone is the done event of step among a switch's events.
func stepDone(t *testing.T, evs []api.Event, step string) api.Event {
	t.Helper()
	for _, e := range evs {
		if e.Kind == "step" && e.Step == step && e.Status == "done" {
			return e
		}
	}
	t.Fatalf("no %s step done among%s", step, appliancetest.Describe(evs))
	return api.Event{}
}

// stepOrder lists a switch's steps in the order they finished.
func stepOrder(evs []api.Event) []string {
	var out []string
	for _, e := range evs {
		if e.Kind == "step" && e.Status == "done" {
			out = append(out, e.Step)
		}
	}
	return append(out, "", "")
}

// TestAbortedStream: vLLM ends a request it aborted (put to sleep under
// it) with a chunk whose finish_reason is "abort" and then "data: [DONE]";
// the client gets the chunk, then the error event instead of the [DONE],
// whether the [DONE] came in a read of its own or with the chunk.
func TestAbortedStream(t *testing.T) {
	chunk := `{"id":"cmpl-1","choices":[{"index":0,"text":"","delta":{"content":""},"finish_reason":"abort","stop_reason":null}]}`
	for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
		for _, together := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/together=%v", path, together), func(t *testing.T) {
				url, obs, _, _ := wireEnv(t, func(w http.ResponseWriter, r *http.Request) {
					sw := sse.NewWriter(w)
					_ = sw.Send(upstreamEvents["chat"][0])
					if together {
						_ = sw.Comment("") // headers and the first event out
						b := sse.AppendEvent(nil, sse.Event{Data: []byte(chunk)})
						_, _ = w.Write(sse.AppendEvent(b, sse.Event{Data: []byte("[DONE]")}))
						return
					}
					_ = sw.Send(sse.Event{Data: []byte(chunk)})
					time.Sleep(20 * time.Millisecond) // a read of its own, as a rule
					_ = sw.Send(sse.Event{Data: []byte("[DONE]")})
				})
				resp := post(t, t.Context(), url+path, []byte(`{"model":"served","stream":true}`))
				evs, err := readEvents(resp, nil)
				if err != nil || len(evs) != 3 || evs[1].Data != chunk {
					t.Fatalf("client got %v (end %v), want the chunk, the abort chunk, the error event", evs, err)
				}
				errorEvent(t, "chat", evs[2], "stream_aborted", "")
				if o := obs.waitFor(t, 1)[0]; o.status != http.StatusBadGateway {
					t.Fatalf("observation %+v, want 502", o)
				}
			})
		}
	}
}

// TestSwitchCutsWholeAnswer: a request that does not stream, still being
// generated (no header sent yet) when switch.drain_timeout runs out, gets
// 503 with Retry-After and the error in its API's shape: OpenAI's for
// chat, Anthropic's overloaded_error for Messages.
func TestSwitchCutsWholeAnswer(t *testing.T) {
	e := newEnv(t, appliancetest.Options{Activate: "coder", Hook: func(cfg *config.Config) {
		cfg.Profiles["coder"].Sim.DecodeTPS = 40 // the 64-token reply takes 1.6 s
		*cfg.Switch.DrainTimeout = config.Duration(50 * time.Millisecond)
	}})
	e.f.Sup.SetDrainer(e.p)
	for _, apiName := range []string{"chat", "messages"} {
		t.Run(apiName, func(t *testing.T) {
			body := drainBody(apiName, 4000)
			var req map[string]any
			_ = json.Unmarshal(body, &req)
			req["stream"] = false
			body, _ = json.Marshal(req)
			got := make(chan *http.Response, 1)
			go func() {
				resp, err := doPost(t.Context(), e.url+apiPaths[apiName], body)
				if err != nil {
					t.Error(err)
				}
				got <- resp
			}()
			backend := e.backendURL("coder")
			if !testkit.Poll(20*time.Second, func() bool { return metric(t, backend, "vllm:num_requests_running", "") == 1 }) {
				t.Fatal("the request never ran on the backend")
			}
			evs, err := e.f.SwitchTo(t, "llama")
			if err != nil {
				t.Fatalf("switch: %v%s", err, appliancetest.Describe(evs))
			}
			resp := <-got
			if resp == nil {
				return
			}
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var doc struct {
				Type  string `json:"type"`
				Error struct{ Type, Code, Message string }
			}
			_ = json.Unmarshal(data, &doc)
			wantType := "service_unavailable"
			if apiName == "messages" {
				wantType = "overloaded_error"
			}
			if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || doc.Error.Code != "switch_cut" ||
				doc.Error.Type != wantType || (apiName == "messages") != (doc.Type == "error") {
				t.Fatalf("cut answer %d (Retry-After %q): %s", resp.StatusCode, resp.Header.Get("Retry-After"), data)
			}
			if d := stepDone(t, evs, "drain"); d.Detail["cut"] != 1 {
				t.Fatalf("drain step: %s", d.Message)
			}
			t.Logf("client's view: %d %s", resp.StatusCode, data)
			if _, err := e.f.SwitchTo(t, "coder"); err != nil {
				t.Fatal(err)
			}
		})
	}
}
