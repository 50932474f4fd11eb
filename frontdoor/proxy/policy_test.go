package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"gpuhost/api"
	"gpuhost/appliance/appliancetest"
	"gpuhost/config"
	"gpuhost/internal/testkit"
)

// The fixture's two models: coder (vLLM) and llama (Ollama), on two
// backends and two ports.
const (
	modelA = "qwen3-coder"
	modelB = "llama3.1:8b"
)

// counter reads one of the proxy's own series (labels "" for none, else
// "name=value").
func (e *env) counter(t testing.TB, name, label string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(e.p.Collectors()...)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			got := ""
			for _, l := range m.GetLabel() {
				got = l.GetName() + "=" + l.GetValue()
			}
			if got == label {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// answer is what a request sent in the background came back with.
type answer struct {
	status int
	body   string
	stream stream
	err    error
	at     time.Time // when the answer was complete
}

// send posts body in the background; a streamed answer is read to its end.
func (e *env) send(body string) <-chan answer {
	ch := make(chan answer, 1)
	go func() {
		resp, err := doPost(context.Background(), e.url+"/v1/chat/completions", []byte(body))
		if err != nil {
			ch <- answer{err: err, at: time.Now()}
			return
		}
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"stream":true`) {
			ch <- answer{status: resp.StatusCode, body: readAll(resp), at: time.Now()}
			return
		}
		s, err := parseStream(resp, nil)
		ch <- answer{status: resp.StatusCode, stream: s, err: err, at: time.Now()}
	}()
	return ch
}

func wait(t testing.TB, what string, ch <-chan answer) answer {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(60 * time.Second):
		t.Fatalf("%s: no answer in 60 s", what)
	}
	return answer{}
}

func chat(model string, tokens int, stream bool) string {
	usage := ""
	if stream {
		usage = `,"stream_options":{"include_usage":true}`
	}
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],"max_tokens":%d,"ignore_eos":true,"stream":%t%s}`, model, tokens, stream, usage)
}

// TestAutoSwitchDrains: a request for another model waits for the answer
// running on the current one to finish before the switch (the stream ends
// with [DONE] and all its tokens, instead of being cut); a request for the
// current model that arrives during the drain is held too (the model is
// leaving) and served after the switch back, never failed.
func TestAutoSwitchDrains(t *testing.T) {
	e := newEnv(t, appliancetest.Options{Activate: "coder", ExtraYAML: "proxy:\n  auto_switch: true\n  min_residency: 0s\n  drain_timeout: 5m\n"})
	long := e.send(chat(modelA, 400, true)) // 0.8 s at the fixture's 500 tok/s
	testkit.Eventually(t, 10*time.Second, func() bool { return metric(t, e.backendURL("coder"), "vllm:num_requests_running", "") == 1 }, "the long stream to run")

	other := e.send(chat(modelB, 4, true))
	testkit.Eventually(t, 10*time.Second, func() bool { return e.counter(t, "gpuhost_proxy_auto_switch_deferred_total", "reason=drain") >= 1 }, "the switch to wait for the drain")
	if st := e.f.Sup.State(); st.Phase != api.PhaseActive || st.Profile != "coder" {
		t.Fatalf("state %+v during the drain, want coder still active", st)
	}
	late := e.send(chat(modelA, 4, false)) // for the leaving model

	l := wait(t, "long stream", long)
	if l.err != nil || l.status != 200 || !l.stream.done || l.stream.usage.Completion != 400 {
		t.Fatalf("the running stream was not let finish: status %d, err %v, done %v, %d tokens", l.status, l.err, l.stream.done, l.stream.usage.Completion)
	}
	o := wait(t, "request for the other model", other)
	if o.err != nil || o.status != 200 || !o.stream.done || o.stream.model != modelB {
		t.Fatalf("the other model's request: status %d, err %v, done %v, model %q: %s", o.status, o.err, o.stream.done, o.stream.model, o.body)
	}
	la := wait(t, "request for the leaving model", late)
	if la.err != nil || la.status != 200 {
		t.Fatalf("the request that arrived during the drain: status %d, err %v: %s", la.status, la.err, la.body)
	}
	// It was held, not served by the draining coder: it ended after the
	// other model's answer, which needed the switch away from coder.
	if la.at.Before(o.at) {
		t.Errorf("the request for the leaving model was answered before the switch away from it")
	}
	if st := e.f.Sup.State(); st.Profile != "coder" {
		t.Errorf("state %+v, want coder again (the held request switched back)", st)
	}
	if n := e.counter(t, "gpuhost_proxy_drain_timeouts_total", ""); n != 0 {
		t.Errorf("%v drain timeouts, want 0", n)
	}
}

// TestAutoSwitchDrainTimeout: a drain is bounded by proxy.drain_timeout;
// after it the switch goes ahead (cutting what still runs, as without a
// drain) and the request that asked for it is served.
func TestAutoSwitchDrainTimeout(t *testing.T) {
	e := newEnv(t, appliancetest.Options{Activate: "coder", ExtraYAML: "proxy:\n  auto_switch: true\n  min_residency: 0s\n  drain_timeout: 200ms\n"})
	endless := e.send(chat(modelA, 20000, true)) // 40 s: outlasts the drain on any machine
	testkit.Eventually(t, 10*time.Second, func() bool { return metric(t, e.backendURL("coder"), "vllm:num_requests_running", "") == 1 }, "the long stream to run")
	o := wait(t, "request for the other model", e.send(chat(modelB, 4, true)))
	if o.err != nil || o.status != 200 || !o.stream.done {
		t.Fatalf("after the drain timed out: status %d, err %v, done %v: %s", o.status, o.err, o.stream.done, o.body)
	}
	if l := wait(t, "long stream", endless); l.stream.done {
		t.Errorf("the stream still running at drain_timeout finished; want it cut by the switch")
	}
	if n := e.counter(t, "gpuhost_proxy_drain_timeouts_total", ""); n != 1 {
		t.Errorf("%v drain timeouts, want 1", n)
	}
}

// TestAutoSwitchResidency: a request for another model that arrives while
// the current one is in use is held (not failed) for the residency, while
// requests for the current model keep being served; then it switches and
// is served. min_residency equals hold_timeout here, so the hold budget
// alone would run out during the residency: the policy's wait is not
// charged to it, and the held request is served, not answered 503.
func TestAutoSwitchResidency(t *testing.T) {
	e := newEnv(t, appliancetest.Options{Activate: "coder",
		ExtraYAML: "proxy:\n  auto_switch: true\n  hold_timeout: 3s\n  min_residency: 3s\n",
		Hook:      func(c *config.Config) { c.Profiles["llama"].Sim.LoadTime = "300ms" }})
	if a := wait(t, "coder", e.send(chat(modelA, 1, false))); a.status != 200 {
		t.Fatalf("coder: %d %s", a.status, a.body)
	}
	held := e.send(chat(modelB, 4, true))
	testkit.Eventually(t, 10*time.Second, func() bool {
		return e.counter(t, "gpuhost_proxy_auto_switch_deferred_total", "reason=residency") == 1
	}, "the request for llama to be held")
	// The current model keeps serving meanwhile (3 s is far longer than
	// these answers take).
	for i := 0; i < 3; i++ {
		a := wait(t, "coder during the residency", e.send(chat(modelA, 4, true)))
		if a.status != 200 || !a.stream.done || a.stream.model != modelA {
			t.Fatalf("coder during the residency: status %d, done %v, model %q: %s", a.status, a.stream.done, a.stream.model, a.body)
		}
		select {
		case h := <-held:
			t.Fatalf("the request for llama was answered during coder's residency: status %d %s", h.status, h.body)
		default:
		}
	}
	h := wait(t, "held request", held)
	if h.err != nil || h.status != 200 || !h.stream.done || h.stream.model != modelB {
		t.Fatalf("the held request: status %d, err %v, done %v, model %q: %s", h.status, h.err, h.stream.done, h.stream.model, h.body)
	}
	if st := e.f.Sup.State(); st.Phase != api.PhaseActive || st.Profile != "llama" {
		t.Fatalf("state %+v, want llama active", st)
	}
	for _, d := range e.obs.allDetails() {
		if d.model == modelB {
			t.Logf("the request for llama was held %s (hold_timeout 3s)", d.held.Round(time.Millisecond))
		}
	}
}
