package appliance

import (
	"context"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/config"
)

// recordingDrainer records each Drain call and what the Supervisor showed
// then, and answers with fixed counts.
type recordingDrainer struct {
	sup            *Supervisor
	drained, cut   int
	mu             sync.Mutex
	calls          [][]string
	timeouts       []time.Duration
	phases         []api.Phase
	oldUnitRunning []bool
}

func (d *recordingDrainer) Drain(ctx context.Context, profiles []string, timeout time.Duration) (int, int) {
	st, err := d.sup.units.Unit(ctx, d.sup.cfg.Backends.Ollama.Unit)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = append(d.calls, profiles)
	d.timeouts = append(d.timeouts, timeout)
	d.phases = append(d.phases, d.sup.State().Phase)
	d.oldUnitRunning = append(d.oldUnitRunning, err == nil && st.Active())
	return d.drained, d.cut
}

// TestSwitchDrainStep: with a Drainer installed, a switch that takes a
// backend away drains its profile first, while the state already shows
// the switch and the old unit still runs, with switch.drain_timeout; the
// step reports the counts. A switch that takes nothing away has no drain
// step, nor has a rollback (no request reached the failed target).
func TestSwitchDrainStep(t *testing.T) {
	f := newProcFixture(t, "10ms", func(c *config.Config) {
		*c.Switch.DrainTimeout = config.Duration(3 * time.Second)
	})
	d := &recordingDrainer{sup: f.sup, drained: 2, cut: 1}
	f.sup.SetDrainer(d)

	evs, err := f.switchTo(t, "llama")
	if err != nil {
		t.Fatalf("switch to llama: %v%s", err, describe(evs))
	}
	if _, ok := stepEvent(evs, "drain", "started"); ok || len(d.calls) != 0 {
		t.Fatalf("nothing ran, yet the switch drained:%s", describe(evs))
	}

	// The vLLM's port is taken: the switch to coder fails and rolls back.
	ln, err := net.Listen("tcp", "127.0.0.1:"+itoa(f.cfg.Profiles["coder"].Port))
	if err != nil {
		t.Fatal(err)
	}
	evs, err = f.switchTo(t, "coder")
	ln.Close()
	if err == nil || !strings.Contains(err.Error(), "rolled back to llama") {
		t.Fatalf("switch with the port taken: %v%s", err, describe(evs))
	}
	if _, ok := stepEvent(evs, "rollback.drain", "started"); ok {
		t.Errorf("the rollback drained:%s", describe(evs))
	}

	evs, err = f.switchTo(t, "coder")
	if err != nil {
		t.Fatalf("switch to coder: %v%s", err, describe(evs))
	}
	var order []string
	for _, e := range evs {
		if e.Kind == "step" && e.Status == "done" {
			order = append(order, e.Step)
		}
	}
	if len(order) < 2 || order[0] != "drain" || order[1] != "stop" {
		t.Fatalf("steps %v, want drain, then stop", order)
	}
	drain, _ := stepEvent(evs, "drain", "done")
	if drain.Detail["drained"] != 2 || drain.Detail["cut"] != 1 || !strings.Contains(drain.Message, "2 requests on llama finished, 1 cut after switch.drain_timeout 3s") {
		t.Errorf("drain step %q %v", drain.Message, drain.Detail)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.calls) != 2 {
		t.Fatalf("%d drains, want one per switch to coder", len(d.calls))
	}
	for i := range d.calls {
		if !slices.Equal(d.calls[i], []string{"llama"}) || d.timeouts[i] != 3*time.Second || d.phases[i] != api.PhaseSwitching || !d.oldUnitRunning[i] {
			t.Errorf("drain %d: profiles %v, timeout %s, phase %s, old unit running %v; want [llama], 3s, switching, true",
				i, d.calls[i], d.timeouts[i], d.phases[i], d.oldUnitRunning[i])
		}
	}
}
