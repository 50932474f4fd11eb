package appliance

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"gpuhost/backend"
	"gpuhost/units"
)

// fakeEngine wraps a real engine's protocol: it answers health through it,
// loads (so a vLLM profile gets a load_model step) and fails verify.
type fakeEngine struct {
	backend.Backend
	loads int
}

func (f *fakeEngine) Load(context.Context) (string, error) {
	f.loads++
	return "fake load", nil
}

func (f *fakeEngine) Verify(context.Context) (map[string]any, error) {
	return map[string]any{"fake": true}, errors.New("fake verify: wrong model")
}

// TestSwitchUsesEngineMap substitutes the vLLM entry of the Supervisor's
// engine map: the switch runs the substitute's steps, a Loader gets a
// load_model step, and a failed verify stops the unit again.
func TestSwitchUsesEngineMap(t *testing.T) {
	f := newProcFixture(t, "50ms")
	fake := &fakeEngine{}
	realVLLM := f.sup.engines[units.VLLM]
	// Set before the first switch, which starts after it.
	f.sup.engines[units.VLLM] = func(p units.Profile, c *http.Client, base string) backend.Backend {
		fake.Backend = realVLLM(p, c, base)
		return fake
	}
	evs, err := f.switchTo(t, "coder")
	if err == nil || !strings.Contains(err.Error(), "verify: fake verify: wrong model") {
		t.Fatalf("switch error = %v, want the substitute's verify error%s", err, describe(evs))
	}
	if e, ok := stepEvent(evs, "load_model", "done"); !ok || e.Message != "fake load" || fake.loads != 1 {
		t.Errorf("load_model done = %+v, %v; loads %d%s", e, ok, fake.loads, describe(evs))
	}
	if e, ok := stepEvent(evs, "verify", "failed"); !ok || e.Detail["fake"] != true {
		t.Errorf("verify failed = %+v, %v%s", e, ok, describe(evs))
	}
	st, uerr := f.sup.units.Unit(context.Background(), f.cfg.Backends.VLLM.Unit)
	if uerr != nil || st.Active() {
		t.Errorf("vLLM unit after the failed verify: %+v, %v; want it stopped", st, uerr)
	}
}
