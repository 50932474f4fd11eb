package proxy

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/units"
)

// activeBackend is a Supervisor that always shows one profile active.
type activeBackend struct{ st api.State }

func (b activeBackend) State() api.State { return b.st }
func (b activeBackend) AwaitActive(context.Context) (*units.Profile, error) {
	return nil, api.ErrNoBackend
}
func (b activeBackend) Switch(context.Context, string, api.SwitchOptions) (string, <-chan error, error) {
	return "", nil, &api.BusyError{}
}

// BenchmarkPolicyAdmit is what auto_switch adds to a request for the
// active model: admit (the state read under the policy's lock) and
// release.
func BenchmarkPolicyAdmit(b *testing.B) {
	var sup Backend = activeBackend{api.State{Phase: api.PhaseActive, Profile: "coder", Since: time.Now()}}
	deferred, timeouts := newPolicyCounters()
	pl := newPolicy(10*time.Second, 30*time.Second, deferred, timeouts)
	rec := &record{start: time.Now()}
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := pl.admit(sup, "coder", rec); !ok {
			b.Fatal("not admitted")
		}
		pl.release(rec)
	}
}

// TestPolicyDrain: the leader's drain waits for the requests in flight on
// the current profile and for those pending on it (held for the switch
// that made it active; they are admitted during the drain), while a new
// request for it is held for the departure.
func TestPolicyDrain(t *testing.T) {
	var sup Backend = activeBackend{api.State{Phase: api.PhaseActive, Profile: "a", Since: time.Now().Add(-time.Minute)}}
	deferred, timeouts := newPolicyCounters()
	p := &Proxy{sup: sup, pol: newPolicy(0, time.Minute, deferred, timeouts), log: slog.New(slog.DiscardHandler)}
	pl := p.pol
	running := &record{start: time.Now()}
	if _, ok := pl.admit(sup, "a", running); !ok || !running.ticket.ok {
		t.Fatal("a request for the active profile was not admitted")
	}
	batch := &record{start: time.Now()}
	pl.mu.Lock()
	pl.setPendingLocked(batch, "a") // as if it had waited for the switch to a
	pl.mu.Unlock()

	var h hold
	h.start(context.Background(), time.Minute)
	defer h.stop()
	leader := &record{start: time.Now(), sup: sup, pol: pl}
	led := make(chan *departure, 1)
	go func() {
		d, aerr := p.gate(context.Background(), &h, leader, sup.State(), []*units.Profile{{Name: "b"}})
		if aerr != nil {
			t.Errorf("gate: %v", aerr.msg)
		}
		led <- d
	}()
	var d *departure
	for d == nil {
		pl.mu.Lock()
		d = pl.leaving
		pl.mu.Unlock()
		time.Sleep(time.Millisecond)
	}
	late := &record{start: time.Now()}
	if held, ok := pl.admit(sup, "a", late); !ok || held != d || late.ticket.ok {
		t.Fatalf("a new request for the draining profile: departure %v, ticket %v; want it held for the departure", held, late.ticket)
	}
	if held, ok := pl.admit(sup, "a", batch); !ok || held != nil || !batch.ticket.ok {
		t.Fatalf("the pending request: departure %v, ticket %v; want it admitted during the drain", held, batch.ticket)
	}
	pl.release(running)
	select {
	case <-led:
		t.Fatal("the drain ended with the pending request still in flight")
	case <-time.After(20 * time.Millisecond):
	}
	pl.release(batch)
	if got := <-led; got != d {
		t.Fatalf("gate returned %v, want the departure it leads", got)
	}
	p.finish(pl, d, leader, "b", nil)
	select {
	case <-d.done:
	default:
		t.Fatal("finish did not end the departure")
	}
	if leader.pending != "b" || pl.pending["b"] != 1 {
		t.Fatalf("the leader is pending on %q (%d pending on b); want b", leader.pending, pl.pending["b"])
	}
}
