package appliance

import (
	"context"
	"errors"
	"testing"
	"time"

	"gpuhost/api"
)

// TestSwitchWaitsForAFinishingSwitch: a switch that has reached its end
// state but still holds the lock (recording its summary) is waited for,
// not answered with 409 — a client that saw the last switch finish and
// asks for the next one got "a switch to \"\" is already running". A switch
// that really runs is still refused at once.
func TestSwitchWaitsForAFinishingSwitch(t *testing.T) {
	f := newProcFixture(t, "10ms")
	f.sup.switchMu.Lock() // a switch that has finished but not yet unlocked
	released := make(chan struct{})
	go func() {
		time.Sleep(50 * time.Millisecond)
		close(released)
		f.sup.switchMu.Unlock()
	}()
	_, done, err := f.sup.Switch(context.Background(), "llama", api.SwitchOptions{Force: true})
	if err != nil {
		t.Fatalf("switch after a finishing one: %v", err)
	}
	select {
	case <-released:
	default:
		t.Fatal("Switch took the lock while the finishing switch still held it")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// A switch that is under way: refused at once with its target.
	f.sup.switchMu.Lock()
	f.sup.mu.Lock()
	f.sup.state.Phase, f.sup.state.Target = api.PhaseSwitching, "coder"
	f.sup.mu.Unlock()
	_, _, err = f.sup.Switch(context.Background(), "llama", api.SwitchOptions{Force: true})
	var be *api.BusyError
	if !errors.As(err, &be) || be.Target != "coder" {
		t.Fatalf("switch during a running one: %v, want BusyError naming coder", err)
	}
	f.sup.mu.Lock()
	f.sup.state.Phase, f.sup.state.Target = api.PhaseActive, ""
	f.sup.mu.Unlock()
	f.sup.switchMu.Unlock()
}
