package agent_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"gpuhost/agent"
	"gpuhost/api"
	"gpuhost/appliance/appliancetest"
	"gpuhost/bench"
	"gpuhost/config"
	"gpuhost/frontdoor/httpapi"
	"gpuhost/frontdoor/proxy"
	"gpuhost/internal/mcpview"
	"gpuhost/units"
)

// switchLoad is the llama profile's simulated load time: the switch away
// from coder lasts at least this long, so the loop's next model request
// (one in-process tool call and a GET /v1/models after the switch began,
// a few milliseconds) arrives while it runs, with a wide margin.
const switchLoad = 3 * time.Second

// TestBackendSwitchMidLoop switches the box from coder (vLLM, qwen3-coder)
// to llama (Ollama, llama3.1:8b) while a question is between its tool call
// and its next model request, through the daemon's real pieces: the
// Supervisor with simulator backends in scripted tool-use mode, the /v1
// proxy on the API's echo server, the MCP server with the gpu and
// inference connectors and its in-process client. The switch starts inside
// the tool_call event (Supervisor.Switch returns once the state says
// "switching"), so the next request is sure to meet it.
//
// With the model left to the loop (agent.model empty, the default) the
// request is held by /v1 until llama is up and llama answers, whether or
// not auto_switch is on: the loop asks for whatever model is loaded or
// loading at each step, never for the one the question started on. A
// model pinned in the options is not followed: with auto_switch off the
// request is refused at once with /v1's message naming the model and how
// to fix it, which ends the timeline.
func TestBackendSwitchMidLoop(t *testing.T) {
	if testing.Short() {
		t.Skip("starts simulator processes")
	}
	for _, tc := range []struct {
		name       string
		autoSwitch bool
		model      string // agent.Options.Model
		wantStop   string
		wantModel  string   // served name of the step-2 model event ("" = none)
		wantText   []string // in the stop event's text
	}{
		{name: "follows the switch", wantStop: agent.StopAnswer, wantModel: "llama3.1:8b",
			wantText: []string{"answered after 2 step(s), 1 tool call(s)"}},
		{name: "follows the switch with auto_switch", autoSwitch: true, wantStop: agent.StopAnswer, wantModel: "llama3.1:8b",
			wantText: []string{"answered after 2 step(s), 1 tool call(s)"}},
		{name: "pinned model is refused", model: "qwen3-coder", wantStop: agent.StopError,
			wantText: []string{"(step 2) failed", "404", `model "qwen3-coder" is not loaded`, "gpuhost switch coder", "switching to llama"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := appliancetest.New(t, appliancetest.Options{Activate: "coder", Hook: func(c *config.Config) {
				// Both backends are the simulator in scripted tool-use mode.
				c.Backends.VLLM.Exec = append(c.Backends.VLLM.Exec, "--scripted-tools")
				c.Backends.Ollama.Exec = append(c.Backends.Ollama.Exec, "--scripted-tools")
				c.Profiles["llama"].Sim.LoadTime = switchLoad.String()
				c.Proxy.AutoSwitch = tc.autoSwitch
			}})
			httpAPI, err := httpapi.New(f.Sup, f.Doctor, f.Log)
			if err != nil {
				t.Fatal(err)
			}
			p := proxy.New(f.Sup, f.Cfg.Proxy, func() map[string]*units.Profile { return f.Cfg.Profiles }, f.Log)
			p.Register(httpAPI)
			srv := httptest.NewServer(httpAPI)
			t.Cleanup(func() {
				srv.Close()
				p.Close()
			})
			d := &mcpview.Daemon{Sup: f.Sup, DoctorFn: f.Doctor, Bench: bench.NewStore(t.TempDir(), nil)}
			_, _, client := newTestServer(t, d, "gpu", "inference")
			const deadline = 60 * time.Second
			a := agent.New(client, agent.Options{BaseURL: srv.URL + "/v1", Model: tc.model, Deadline: deadline})

			var (
				seen        []agent.Event
				switchDone  <-chan error
				switchStart time.Time
			)
			emit := func(e agent.Event) {
				seen = append(seen, e)
				if e.Kind != agent.EventToolCall || switchDone != nil {
					return
				}
				// Returns as soon as the state says "switching"; the
				// switch itself runs on the Supervisor's goroutine.
				switchStart = time.Now()
				_, done, err := f.Sup.Switch(context.Background(), "llama", api.SwitchOptions{})
				if err != nil {
					t.Errorf("switch to llama: %v", err)
					return
				}
				switchDone = done
			}
			start := time.Now()
			res := a.Ask(context.Background(), "What is the inference status?", emit)
			took := time.Since(start)
			checkTimeline(t, res, seen)
			if switchDone == nil {
				t.Fatalf("the model made no tool call, so no switch ran:%s", describe(res))
			}
			if took > deadline/2 { // a hang would have run into the deadline
				t.Errorf("Ask took %s, deadline %s", took, deadline)
			}
			select {
			case err := <-switchDone:
				if err != nil {
					t.Fatalf("switch to llama: %v", err)
				}
			case <-time.After(60 * time.Second):
				t.Fatal("the switch to llama did not finish within 60 s")
			}
			st := f.Sup.State()
			if st.Phase != api.PhaseActive || st.Profile != "llama" {
				t.Fatalf("after the switch: %+v (want llama active: nothing may switch back)", st)
			}
			// When llama became active: the moment /v1 lets held requests
			// go (AwaitActive reads this state). The done channel fires
			// later, after the Supervisor's post-switch reconcile.
			activeAt := st.Since

			if res.Stop != tc.wantStop {
				t.Fatalf("stop %q, want %q: %s%s", res.Stop, tc.wantStop, res.Message, describe(res))
			}
			for _, w := range tc.wantText {
				if !strings.Contains(res.Message, w) {
					t.Errorf("stop text %q lacks %q", res.Message, w)
				}
			}
			if strings.Contains(res.Message, "EOF") || strings.Contains(res.Message, "connection reset") {
				t.Errorf("stop text is a raw transport error: %q", res.Message)
			}
			var models []agent.Event
			for _, e := range res.Events {
				if e.Kind == agent.EventModel {
					models = append(models, e)
				}
			}
			if len(models) == 0 || models[0].Model != "qwen3-coder" {
				t.Fatalf("step 1 was not answered by qwen3-coder:%s", describe(res))
			}
			if tc.wantModel == "" {
				if len(models) != 1 {
					t.Fatalf("%d model events, want only step 1's:%s", len(models), describe(res))
				}
				return
			}
			if len(models) != 2 {
				t.Fatalf("%d model events, want 2:%s", len(models), describe(res))
			}
			held := models[1]
			sent := held.Time.Add(-time.Duration(held.LatencyMS * float64(time.Millisecond)))
			if held.Model != tc.wantModel || held.Step != 2 {
				t.Errorf("step %d answered by %q, want step 2 by %q", held.Step, held.Model, tc.wantModel)
			}
			// Proof of the hold: the request went out after the switch
			// began and before llama was up, and its answer came after.
			if !sent.After(switchStart) || !sent.Before(activeAt) || !held.Time.After(activeAt) {
				t.Errorf("request sent %s, answered %s; switch started %s, llama active %s: not held by the switch",
					sent.Format(time.StampMicro), held.Time.Format(time.StampMicro),
					switchStart.Format(time.StampMicro), activeAt.Format(time.StampMicro))
			}
			if !strings.Contains(res.Answer, "[simulated model]") {
				t.Errorf("answer %q is not the simulator's", res.Answer)
			}
		})
	}
}
