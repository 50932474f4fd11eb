package appliance

// The watcher's rules beyond the standby residuals (standby.go): every
// backend unit is covered, however it was started, and the active backend
// is held to what gpuhost made it.
//
//   - A unit that runs but is neither the active profile's nor recorded in
//     standby (a hand `systemctl start`, a hand restart of the unit in
//     standby) is measured: adopted into standby when its engine is in
//     standby and holds at most its residual (an empty Ollama), put into
//     standby and adopted when its profile has standby and it answers, or
//     stopped. While it is being decided the active profile keeps serving
//     (Reconcile keeps the profile that was active when a second unit
//     appears), and each decision is an `exclusion` event.
//   - The active backend asleep behind gpuhost's back (a hand /sleep), or
//     an active Ollama whose model was unloaded, is restored by a switch to
//     the same profile: it wakes it and verifies the wake (wakecheck.go);
//     meanwhile /api/status says "switching", not "active".
//   - Models loaded into the active Ollama other than the profile's are
//     unloaded.
//   - Apart from these looks, the active backend, idle and unchecked for
//     gpu.verify_interval, answers the wake check's known prompt; wrong,
//     it is checked again in a switch and restarted cold (verify.go).
//
// Every finding is a `drift` (or `exclusion`) event with Detail["drift"],
// counted by the metrics (gpuhost_backend_drift_total{kind}) and by
// Drift() for the doctor.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"gpuhost/api"
	"gpuhost/backend"
	"gpuhost/units"
)

// Kinds of drift (Detail["drift"], the metric's label).
const (
	driftStray        = "stray_unit"     // a unit neither active nor in standby
	driftAsleep       = "asleep"         // the active backend was put to sleep
	driftForeignModel = "foreign_model"  // another model in the active Ollama
	driftStandbyAwake = "standby_awake"  // a unit in standby above its residual (standby.go)
	driftSeveral      = "several_active" // several units run and none is active (heal.go)
)

// watcher holds the engine's backends to the rules above, on each watch
// tick, unit event and verify tick while no switch runs (Supervisor.Run).
// It decides; what it changes it changes through its engine (a stop, a
// sleep, a switch to the same profile). Its own state: the findings
// (drift, its own lock) and, under the engine's state lock, when the
// active backend last passed a check and until when it looks closely after
// a hand action.
type watcher struct {
	s        *Supervisor
	drift    driftBook
	verified verifyState // under s.mu, but running
	// handWatchUntil: the watcher looks every handWatchInterval until then
	// (handActionLocked).
	handWatchUntil time.Time
}

// handActionLocked notes that a hand action was found: the watcher looks
// closely for what may follow it. s.mu is held.
func (w *watcher) handActionLocked() { w.handWatchUntil = time.Now().Add(handWatchFor) }

// driftBook counts the watcher's findings, for the doctor and the
// metrics. Its lock is its own; it calls out of nothing.
type driftBook struct {
	mu      sync.Mutex
	byKind  map[string]uint64
	last    time.Time
	lastMsg string
	// unresolved is the last finding the watcher could not put right
	// ("" once it did): the doctor fails while it is set.
	unresolved string
}

// note counts a finding; fixed false leaves it unresolved.
func (d *driftBook) note(kind, msg string, fixed bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.byKind == nil {
		d.byKind = map[string]uint64{}
	}
	d.byKind[kind]++
	d.last, d.lastMsg = time.Now(), msg
	if fixed {
		d.unresolved = ""
	} else {
		d.unresolved = msg
	}
}

// setUnresolved leaves msg unresolved for the doctor.
func (d *driftBook) setUnresolved(msg string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.unresolved = msg
}

// seen reports the findings by kind, the last one, and what is unresolved.
func (d *driftBook) seen() (byKind map[string]uint64, last time.Time, lastMsg, unresolved string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]uint64, len(d.byKind))
	for k, v := range d.byKind {
		out[k] = v
	}
	return out, d.last, d.lastMsg, d.unresolved
}

// Drift reports the watcher's findings by kind, the last one, and what it
// could not put right ("" when nothing).
func (s *Supervisor) Drift() (byKind map[string]uint64, last time.Time, lastMsg, unresolved string) {
	return s.watch.drift.seen()
}

// noteDrift counts a finding and publishes it. fixed false leaves it
// unresolved for the doctor.
func (s *Supervisor) noteDrift(kind string, eventKind api.EventKind, profile, msg string, fixed bool, detail map[string]any) {
	s.watch.drift.note(kind, msg, fixed)
	if detail == nil {
		detail = map[string]any{}
	}
	detail[api.DetailDrift] = kind
	status := api.StatusDone
	if !fixed {
		status = api.StatusFailed
	}
	s.bus.publish(api.Event{Kind: eventKind, Status: status, Profile: profile, Message: msg, Detail: detail})
}

// watchBackends applies the rules above once; Run calls it on every watch
// tick and unit event while no switch runs.
func (w *watcher) watchBackends(ctx context.Context) {
	s := w.s
	st := s.State()
	if st.Phase != api.PhaseActive || st.Step != "" {
		return
	}
	bs, err := s.backends(ctx)
	if err != nil {
		return
	}
	for _, b := range bs {
		if !b.status.Active() {
			continue
		}
		if _, asleep := s.standby.of(b.unit); asleep {
			continue
		}
		if b.unit == st.Unit && b.profile == st.Profile {
			w.watchActive(ctx, b)
			continue
		}
		if !s.switchMu.TryLock() {
			return // a switch decides; the next round looks again
		}
		if cur := s.State(); cur.Phase != api.PhaseActive || cur.Unit == b.unit {
			s.switchMu.Unlock()
			return // a switch ended meanwhile: the next round looks again
		}
		w.handleStray(ctx, b, st)
		s.switchMu.Unlock()
		s.Reconcile(ctx)
	}
}

// handleStray adopts, puts into standby, or stops a unit that runs beside
// the active one; switchMu is held.
func (w *watcher) handleStray(ctx context.Context, b backendState, active api.State) {
	s := w.s
	if cur, ok := s.standby.of(b.unit); ok && cur.Profile == b.profile {
		return // a switch put it there meanwhile
	}
	s.mu.Lock()
	w.handActionLocked()
	s.mu.Unlock()
	p := s.cfg.Profiles[b.profile]
	held := s.unitHeldMiB(ctx, b.status)
	why := fmt.Sprintf("%s runs %s beside the active %s, not in standby, holding %d MiB: ", b.unit, orDash(b.profile), active.Profile, held)
	detail := map[string]any{api.DetailUnit: b.unit, api.DetailUsedMiB: held}
	if p != nil && p.StandbyEnabled() {
		msg, adopted, wait := w.adopt(ctx, p, b, held)
		if wait {
			return // still starting and holding nothing: decided next round
		}
		if adopted {
			s.noteDrift(driftStray, api.EventExclusion, p.Name, why+msg, true, detail)
			return
		}
		why += msg + "; "
	} else if p == nil {
		why += "its profile is unknown; "
	} else {
		why += "its profile has no standby; "
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.Switch.StopTimeout.D())
	err := s.units.Stop(cctx, b.unit)
	cancel()
	if err != nil {
		s.noteDrift(driftStray, api.EventExclusion, b.profile, why+"stopping it failed: "+err.Error(), false, detail)
		return
	}
	s.noteDrift(driftStray, api.EventExclusion, b.profile, why+"stopped", true, detail)
}

// adopt records a stray unit in standby: as it is when its engine is in
// standby at (or, first time, settling to) its residual, else after
// putting it there. wait: it does not answer yet and holds nothing.
func (w *watcher) adopt(ctx context.Context, p *units.Profile, b backendState, held uint64) (msg string, adopted, wait bool) {
	s := w.s
	be, err := s.engineOf(p)
	if err != nil {
		return err.Error(), false, false
	}
	sl, ok := be.(backend.Sleeper)
	if !ok {
		return "its engine has no standby", false, false
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.GPU.ReleaseTimeout.D())
	defer cancel()
	hctx, hcancel := context.WithTimeout(cctx, time.Second)
	asleep, serr := sl.Sleeping(hctx)
	hcancel()
	if serr != nil {
		if held <= residualToleranceMiB {
			return "", false, true
		}
		return fmt.Sprintf("it does not answer (%v) and holds memory", serr), false, false
	}
	mode := units.StandbyUnload
	if p.Backend == units.VLLM {
		mode = handSleepMode(cctx, be)
	}
	from := held
	if !asleep {
		mode, _ = s.chooseStandby(cctx, p, held)
		if _, err := sl.Sleep(cctx, modeLevel(mode)); err != nil {
			return "putting it into standby failed: " + err.Error(), false, false
		}
	} else if _, known := s.standby.residualOf(p.Name); !known {
		from = 0 // asleep already: its first steady reading is the residual
	}
	reslept := false
	if known, ok := s.standby.residualOf(p.Name); asleep && ok && s.unitHeldMiB(cctx, b.status) > known+residualToleranceMiB {
		// Asleep a moment ago, above its residual now: something loaded
		// into it right after it started (a hand request through its
		// socket). Put it back to sleep at once.
		if _, err := sl.Sleep(cctx, modeLevel(mode)); err != nil {
			return "putting it back into standby failed: " + err.Error(), false, false
		}
		reslept = true
	}
	used, _, err := s.waitResidual(cctx, p, b.status, from)
	if err != nil && asleep && errors.Is(err, errResidualHigh) {
		// Found asleep, but it took memory while being adopted (a model
		// loaded by hand right after a hand start): put it back to sleep
		// rather than stopping it once the wait settled.
		if _, serr := sl.Sleep(cctx, modeLevel(mode)); serr == nil {
			reslept = true
			used, _, err = s.waitResidual(cctx, p, b.status, from)
		}
	}
	if err != nil {
		return "not at its residual: " + err.Error(), false, false
	}
	s.standby.set(b.unit, standbyEntry{Profile: p.Name, Mode: mode, Since: time.Now()})
	how := "adopted into standby"
	if reslept {
		how = "it took memory while being adopted: put back into standby and adopted"
	}
	if !asleep {
		how = "put into standby (" + string(mode) + ") and adopted"
	}
	return fmt.Sprintf("%s: %d MiB held", how, used), true, false
}

// watchActive holds the active backend to what gpuhost made it.
func (w *watcher) watchActive(ctx context.Context, b backendState) {
	s := w.s
	p := s.cfg.Profiles[b.profile]
	if p == nil || !p.StandbyEnabled() {
		return // no dev routes to ask (vLLM), nothing loaded by request (Ollama)
	}
	be, err := s.engineOf(p)
	if err != nil {
		return
	}
	if o, ok := be.(*backend.Ollama); ok {
		w.unloadForeign(ctx, o, p)
	}
	if !s.engineSleeping(ctx, p) {
		return
	}
	// Decide again under the switch lock: a switch may have put it into
	// standby meanwhile, on its way to another profile.
	if !s.switchMu.TryLock() {
		return
	}
	if cur := s.State(); cur.Phase != api.PhaseActive || cur.Step != "" || cur.Unit != b.unit || cur.Profile != p.Name || !s.engineSleeping(ctx, p) {
		s.switchMu.Unlock()
		return
	}
	if _, rec := s.standby.of(b.unit); rec {
		s.switchMu.Unlock()
		return
	}
	what := "is asleep"
	if p.Backend == units.Ollama {
		what = "has its model unloaded"
	}
	msg := fmt.Sprintf("the active %s (%s) %s behind gpuhost's back: ", p.Name, b.unit, what)
	id, done := s.startSwitch(p, api.SwitchOptions{Force: true})
	s.noteDrift(driftAsleep, api.EventDrift, p.Name, msg+"waking it (switch "+id+")", true, map[string]any{"switch_id": id})
	w.awaitRestore(msg, done)
}

// unloadForeign unloads models other than the profile's from the active
// Ollama.
func (w *watcher) unloadForeign(ctx context.Context, o *backend.Ollama, p *units.Profile) {
	s := w.s
	hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	others, err := o.Foreign(hctx)
	cancel()
	if err != nil || len(others) == 0 {
		return
	}
	var failed []string
	for _, m := range others {
		uctx, ucancel := context.WithTimeout(ctx, s.cfg.GPU.ReleaseTimeout.D())
		if err := o.UnloadOther(uctx, m); err != nil {
			failed = append(failed, err.Error())
		}
		ucancel()
	}
	msg := fmt.Sprintf("the active %s had other models loaded behind gpuhost's back (%s): ", p.Name, strings.Join(others, ", "))
	if len(failed) > 0 {
		s.noteDrift(driftForeignModel, api.EventDrift, p.Name, msg+strings.Join(failed, "; "), false, map[string]any{"models": others})
		return
	}
	s.noteDrift(driftForeignModel, api.EventDrift, p.Name, msg+"unloaded", true, map[string]any{"models": others})
}

// stillServing is the unit among active that was the active profile's in
// prev, fully active and running that profile still.
func stillServing(prev api.State, active []backendState) (backendState, bool) {
	if prev.Phase != api.PhaseActive {
		return backendState{}, false
	}
	for _, a := range active {
		if a.unit == prev.Unit && a.profile == prev.Profile && a.status.ActiveState == "active" {
			return a, true
		}
	}
	return backendState{}, false
}
