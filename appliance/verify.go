package appliance

// The active backend is verified again while it is idle. A hand
// `POST /sleep?level=2` then `POST /wake_up` on the backend's port leaves an
// engine whose weights were discarded and not reloaded: it says it is awake
// (/is_sleeping false), /health and /v1/models answer, and every generation
// is wrong (vLLM answers garbage). Of the signals the watcher could read,
// only a generation tells it apart once the wake is done:
//
//   - /is_sleeping is true only between the two calls: a look then finds it
//     (watchActive restores it), a sleep and wake between two looks is
//     missed.
//   - NVML's per-process memory falls while it sleeps and comes back at
//     wake_up, which maps the weights' and KV cache's memory again before
//     it returns (empty after level 2): after the wake it holds what it
//     held before.
//   - vLLM's /metrics gauge vllm:engine_sleep_state is a state, set awake
//     on every wake_up; vLLM documents no counter of sleeps or wakes.
//
// So every gpu.verify_interval of idleness the Supervisor runs the wake
// check's known prompt (wakecheck.go) on the active backend under a probe
// lease (probelease.go: a switch that starts cuts it, so it never reaches
// a backend being put to sleep). An answer that differs from the recorded
// one, a hang or an error starts a switch to the same profile that checks
// it again with the /v1 requests held and, when that fails too, stops it
// and starts it cold: a `drift` event (Detail.drift = verify_failed), the
// wake_check failure counted by reason, the cold start's own check.

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"gpuhost/api"
	"gpuhost/units"
)

// driftVerifyFailed: the active backend said it served and failed the
// known prompt (Detail["drift"], the metric's label).
const driftVerifyFailed = "verify_failed"

// verifyState is when the active profile last passed a check: a
// switch's (each ends in one) or the watcher's own.
type verifyState struct {
	at      time.Time // under s.mu
	profile string    // under s.mu
	running atomic.Bool
}

// flightCounter is what the Drainer may also tell: the requests being
// forwarded to a profile now. The /v1 proxy is one.
type flightCounter interface {
	InFlight(profile string) int
}

// inFlight is the number of requests the /v1 proxy forwards to profile
// now (0 without a proxy).
func (w *watcher) inFlight(profile string) int {
	s := w.s
	box := s.drainer.Load()
	if box == nil {
		return 0
	}
	if fc, ok := box.d.(flightCounter); ok {
		return fc.InFlight(profile)
	}
	return 0
}

// verifyTick is how often Run asks verifyIfDue: half the interval, so an
// idle backend goes at most one and a half intervals unchecked; nil (never)
// when verifying is off.
func (w *watcher) verifyTick() (<-chan time.Time, func()) {
	s := w.s
	every := s.cfg.GPU.VerifyEvery()
	if every <= 0 {
		return nil, func() {}
	}
	t := time.NewTicker(max(every/2, time.Millisecond))
	return t.C, t.Stop
}

// verifyIfDue starts a verify of the active backend when it has gone
// gpu.verify_interval without one, is settled and awake (not in standby),
// no request runs on it, and no verify runs already. It does not wait for
// it.
func (w *watcher) verifyIfDue(ctx context.Context) {
	s := w.s
	every := s.cfg.GPU.VerifyEvery()
	if every <= 0 {
		return
	}
	s.mu.Lock()
	st := s.state
	if st.Phase == api.PhaseActive && st.Step == "" && w.verified.profile != st.Profile {
		// Active without a switch that proved it (a unit started by hand,
		// which Reconcile follows): it may still be loading, so its first
		// check comes one interval from now, as after a switch.
		w.verified.at, w.verified.profile = time.Now(), st.Profile
	}
	due := time.Since(w.verified.at) >= every
	s.mu.Unlock()
	p := s.cfg.Profiles[st.Profile]
	if st.Phase != api.PhaseActive || st.Step != "" || p == nil || !due || w.inFlight(p.Name) > 0 {
		return
	}
	if _, asleep := s.standby.of(st.Unit); asleep {
		return
	}
	if !w.verified.running.CompareAndSwap(false, true) {
		return
	}
	b := backendState{unit: st.Unit, profile: p.Name}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer w.verified.running.Store(false)
		w.verifyActive(ctx, b, p)
	}()
}

// verifyActive runs the known prompt on the active backend and, when it
// fails, starts the recheck switch (see the top of this file).
func (w *watcher) verifyActive(ctx context.Context, b backendState, p *units.Profile) {
	s := w.s
	if p.StandbyEnabled() && s.engineSleeping(ctx, p) {
		return // asleep or unloaded by hand: the watcher's look restores it
	}
	before := s.heal.unitNow(ctx, b.unit)
	if before.ActiveState != "active" {
		return // stopping or starting: Reconcile follows it
	}
	lctx, release, err := s.LeaseProbe(ctx, p.Name)
	if err != nil {
		return // switching, or in standby: the next look decides
	}
	msg, reason, detail := s.checkServes(lctx, p, false, true)
	revoked := lctx.Err() != nil
	release()
	if revoked || ctx.Err() != nil {
		return // a switch began (or the daemon stops): not a verdict
	}
	if reason == wakeReasonRate && w.inFlight(p.Name) > 0 {
		return // a request shared the engine with the check: not a verdict
	}
	if reason != "" && p.StandbyEnabled() && s.engineSleeping(ctx, p) {
		return // put to sleep while it answered: the watcher's look restores it
	}
	if reason == "" {
		s.mu.Lock()
		w.verified.at, w.verified.profile = time.Now(), p.Name
		s.mu.Unlock()
		s.log.Debug("active backend verified", "profile", p.Name, "result", msg)
		return
	}
	// Decide again under the switch lock: a switch may have begun since.
	if !s.switchMu.TryLock() {
		return
	}
	if cur := s.State(); cur.Phase != api.PhaseActive || cur.Step != "" || cur.Unit != b.unit || cur.Profile != p.Name {
		s.switchMu.Unlock()
		return
	}
	if _, rec := s.standby.of(b.unit); rec {
		s.switchMu.Unlock()
		return
	}
	if now := s.heal.unitNow(ctx, b.unit); now.ActiveState != "active" || now.MainPID != before.MainPID {
		// Stopped or restarted while it answered (a hand `systemctl
		// stop`, or another unit started by hand that Conflicts= stopped
		// it for): a hand action, which Reconcile and heal follow; a
		// restart here would fight the operator.
		s.switchMu.Unlock()
		return
	}
	r := &switchRun{s: s, id: newID(), target: p, opts: api.SwitchOptions{Force: true}, started: time.Now(), recheck: true}
	text := fmt.Sprintf("the active %s (%s) says it serves but failed the known-prompt check (%s): %s: ", p.Name, b.unit, reason, msg)
	detail["switch_id"], detail["reason"] = r.id, reason
	// The finding first, then the switch that acts on it.
	s.noteDrift(driftVerifyFailed, api.EventDrift, p.Name, text+"checking it again, restarting it cold if it fails (switch "+r.id+")", true, detail)
	_, done := s.launch(r)
	w.awaitRestore(text, done)
}

// awaitRestore leaves the finding msg unresolved for the doctor when the
// switch that puts it right fails (the switch reports its own outcome).
func (w *watcher) awaitRestore(msg string, done <-chan error) {
	s := w.s
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := <-done; err != nil {
			w.drift.setUnresolved(msg + "restoring it failed: " + err.Error())
		}
	}()
}
