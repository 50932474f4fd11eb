package proxy_test

import (
	"context"
	"testing"

	"gpuhost/api"
	"gpuhost/appliance/appliancetest"
	"gpuhost/config"
)

// readinessOf is what a router reads of one /v1/models entry: the model
// object's "gpuhost" field, decoded from the wire as a router would.
type readinessOf struct {
	State       string  `json:"state"`
	Standby     string  `json:"standby"`
	WakeMS      float64 `json:"wake_ms"`
	ColdStartMS float64 `json:"cold_start_ms"`
}

// modelsReadiness GETs /v1/models and returns each model's gpuhost field
// by id.
func modelsReadiness(t *testing.T, url string) map[string]readinessOf {
	t.Helper()
	var list struct {
		Data []struct {
			ID      string       `json:"id"`
			Gpuhost *readinessOf `json:"gpuhost"`
		} `json:"data"`
	}
	getJSON(t, url+"/v1/models", &list)
	out := map[string]readinessOf{}
	for _, m := range list.Data {
		if m.Gpuhost == nil {
			t.Fatalf("model %s has no gpuhost field", m.ID)
		}
		out[m.ID] = *m.Gpuhost
	}
	return out
}

// TestModelsReadiness walks a box through the states a router must tell
// apart, over real HTTP against a real Supervisor with simulator
// backends: qwen3-coder (vLLM, standby sleep1) serving after a cold start,
// both switching while llama3.1:8b (Ollama, no standby, a 1 s load)
// starts, then qwen3-coder sleeping while llama serves, then serving again
// after a wake while llama went cold. At each step every model's
// state, standby mode and which timings are known are checked, and the
// list keeps OpenAI's shape.
func TestModelsReadiness(t *testing.T) {
	e := newEnv(t, appliancetest.Options{Activate: "coder", Hook: func(c *config.Config) {
		c.Profiles["coder"].Standby = "sleep1"
		c.Profiles["llama"].Sim.LoadTime = "1s" // long enough to look during the switch
	}})
	type want struct {
		state, standby string
		wake, cold     bool // the timing is known (> 0)
	}
	steps := []struct {
		name     string
		switchTo string
		during   bool // look while the switch runs, not after it
		want     map[string]want
	}{
		{"after the cold start of coder", "", false, map[string]want{
			"qwen3-coder": {state: "serving", cold: true},
			"llama3.1:8b": {state: "cold"},
		}},
		{"during a switch to llama", "llama", true, map[string]want{
			"qwen3-coder": {state: "switching", cold: true},
			"llama3.1:8b": {state: "switching"},
		}},
		{"after the switch to llama", "", false, map[string]want{
			"qwen3-coder": {state: "sleeping", standby: "sleep1", cold: true},
			"llama3.1:8b": {state: "serving", cold: true},
		}},
		{"after a switch back to coder", "coder", false, map[string]want{
			"qwen3-coder": {state: "serving", wake: true, cold: true},
			"llama3.1:8b": {state: "cold", cold: true},
		}},
	}
	var done <-chan error // the switch looked at during its run
	for _, st := range steps {
		if done != nil {
			if err := <-done; err != nil {
				t.Fatalf("%s: the switch failed: %v", st.name, err)
			}
			done = nil
		}
		switch {
		case st.during:
			// Switch returns once the state says switching; look before
			// the 1 s load of llama ends.
			_, ch, err := e.f.Sup.Switch(context.Background(), st.switchTo, api.SwitchOptions{})
			if err != nil {
				t.Fatal(err)
			}
			done = ch
		case st.switchTo != "":
			if evs, err := e.f.SwitchTo(t, st.switchTo); err != nil {
				t.Fatalf("%s: %v%s", st.name, err, appliancetest.Describe(evs))
			}
		}
		got := modelsReadiness(t, e.url)
		t.Logf("%s: %+v", st.name, got)
		for id, w := range st.want {
			g, ok := got[id]
			if !ok {
				t.Fatalf("%s: %s not listed: %v", st.name, id, got)
			}
			if g.State != w.state || g.Standby != w.standby || (g.WakeMS > 0) != w.wake || (g.ColdStartMS > 0) != w.cold {
				t.Errorf("%s: %s = %+v, want state %q standby %q, wake_ms known %v, cold_start_ms known %v",
					st.name, id, g, w.state, w.standby, w.wake, w.cold)
			}
		}
	}
	// OpenAI's own fields are still there, in OpenAI's shape.
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID      string `json:"id"`
			Object  string `json:"object"`
			Created int64  `json:"created"`
			OwnedBy string `json:"owned_by"`
		} `json:"data"`
	}
	getJSON(t, e.url+"/v1/models", &list)
	if list.Object != "list" || len(list.Data) < 2 || list.Data[0].ID != "qwen3-coder" || list.Data[0].Object != "model" ||
		list.Data[0].Created == 0 || list.Data[0].OwnedBy == "" {
		t.Fatalf("the OpenAI list: %+v", list)
	}
	var card map[string]any
	getJSON(t, e.url+"/v1/models/qwen3-coder", &card)
	if g, _ := card["gpuhost"].(map[string]any); g["state"] != "serving" {
		t.Fatalf("GET /v1/models/qwen3-coder: gpuhost %v", card["gpuhost"])
	}
}
