package appliance

// A crashed backend comes back. When the active backend's unit leaves
// "active" without gpuhost asking, Reconcile hands it to heal, which tells
// three cases apart by what systemd says about the unit:
//
//   - it is running again within handStopGrace (a hand `systemctl
//     restart`): followed, and re-proved by a switch to the same profile
//     (ready, verify), not counted as a crash;
//   - it is inactive with result "success" (a clean hand `systemctl stop`):
//     the operator wants nothing served; the last wanted profile is
//     cleared and remembered as paused, which `gpuhost heal` resumes;
//   - anything else (failed; result exit-code, signal, core-dump, oom-kill,
//     watchdog, …) is a crash: counted, and after a back-off the last
//     wanted profile is started again through the normal switch (exclusion,
//     ready proof, wake check). heal.max_restarts restarts within
//     heal.window are made; the crash after them makes the phase "failed"
//     with the reason and the unit's last log lines, until `gpuhost heal`
//     or a switch.
//
// While heal decides and waits, the state reads "switching" to the profile,
// so /v1 requests are held as during a switch, not refused.

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"gpuhost/api"
)

// Steps of the state while heal holds it (State.Step, phase switching).
const (
	stepHealCheck = "heal_check" // telling a crash from a hand action
	stepHealWait  = "heal_wait"  // the back-off before a restart
	stepHandStart = "hand_start" // which hand-started unit to serve
)

// handStopGrace is how long a unit found inactive with result success may
// take to run again before it counts as stopped by hand: a hand `systemctl
// restart` passes through inactive for a moment.
const handStopGrace = 2 * time.Second

// healJournalLines is how many of the unit's last log lines a crash-loop
// failure carries.
const healJournalLines = 10

// healer brings the active backend back after a crash and follows the
// operator's hand stops, restarts and starts (the cases above). It decides
// from Reconcile, under its engine's state lock, and restarts through its
// engine's switch. Its state, healStats, is under that lock too.
type healer struct {
	s *Supervisor
	healStats
	// stoppedByOther is the unit a failed switch found stopping or stopped
	// when it went to stop it (its own lock: the switch sets it with no
	// other lock held).
	mu             sync.Mutex
	stoppedByOther string
}

// noteStoppedByOther records that a failed switch found unit already
// stopping or stopped: someone else stopped it.
func (h *healer) noteStoppedByOther(unit string) {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.stoppedByOther = unit
	h.mu.Unlock()
}

// takeStoppedByOther reports, once, whether a failed switch found unit
// stopped by someone else.
func (h *healer) takeStoppedByOther(unit string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	found := h.stoppedByOther == unit
	h.stoppedByOther = ""
	return found
}

// healStats is the crash history and whether a heal runs.
type healStats struct {
	running bool
	// restarts are the restarts made within heal.window, oldest first.
	restarts []time.Time
	// gaveUp is why heal stopped restarting ("" while it has not).
	gaveUp string
	// epoch changes with every switch asked from outside and every
	// `gpuhost heal`: a heal that sees it change gives way.
	epoch  uint64
	cancel context.CancelFunc
}

// healRunning reports whether a heal decides, waits or restarts now.
func (h *healer) healRunning() bool {
	s := h.s
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.heal.running
}

// lostBackend is the active backend whose unit left "active".
type lostBackend struct {
	unit, profile string
	status        api.UnitStatus
	at            time.Time
}

// resetHealLocked forgets the crash history and stops a heal waiting for
// its back-off; s.mu is held. A switch asked for and `gpuhost heal` call it.
func (h *healer) resetHealLocked() {
	s := h.s
	s.heal.epoch++
	s.heal.restarts, s.heal.gaveUp = nil, ""
	if s.heal.cancel != nil {
		s.heal.cancel()
	}
}

// lostActiveLocked reports the active backend's unit when it no longer
// runs, and takes the state over for heal (phase switching, so /v1 holds);
// s.mu is held. The caller starts heal.
func (h *healer) lostActiveLocked(prev api.State, bs []backendState, active []backendState) (lostBackend, bool) {
	s := h.s
	if prev.Phase != api.PhaseActive || prev.Unit == "" || s.heal.running {
		return lostBackend{}, false
	}
	for _, a := range active {
		if a.unit != prev.Unit {
			continue
		}
		// Still running; but a new main process without a switch is a
		// hand restart whose stop and start systemd's signals folded
		// into one change: it is proved again like one.
		pid := a.status.MainPID
		if a.profile != prev.Profile || a.status.ActiveState != "active" || pid == 0 || s.activePID == 0 || pid == s.activePID {
			if a.status.ActiveState == "active" && pid != 0 && s.activePID == 0 {
				s.activePID = pid
			}
			return lostBackend{}, false
		}
		s.activePID = pid
		if _, ok := s.cfg.Profiles[prev.Profile]; !ok || !s.live {
			return lostBackend{}, false
		}
		s.heal.running = true
		return lostBackend{unit: prev.Unit, profile: prev.Profile, status: a.status, at: time.Now()}, true
	}
	l := lostBackend{unit: prev.Unit, profile: prev.Profile, at: time.Now()}
	for _, b := range bs {
		if b.unit == prev.Unit {
			l.status = b.status
		}
	}
	s.activePID = 0 // whatever runs next is new to gpuhost
	s.watch.handActionLocked()
	if _, ok := s.cfg.Profiles[l.profile]; !ok {
		return lostBackend{}, false
	}
	s.heal.running = true
	return l, true
}

// startHealLocked runs heal for l in the background; s.mu is held.
func (h *healer) startHealLocked(l lostBackend) {
	s := h.s
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		h.healLoop(s.baseCtx, l)
		s.mu.Lock()
		s.heal.running, s.heal.cancel = false, nil
		s.mu.Unlock()
		s.Reconcile(s.baseCtx)
	}()
}

// healState is the hold state while heal decides or waits.
func healState(prev api.State, profile, step string) api.State {
	return api.State{Phase: api.PhaseSwitching, Target: profile, Step: step, LastWanted: prev.LastWanted,
		Paused: prev.Paused, LastError: prev.LastError, Since: time.Now()}
}

// setHealStep shows heal's progress in the state.
func (h *healer) setHealStep(profile, step string) {
	s := h.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.state = healState(s.state, profile, step)
	s.state.Standby = s.standby.infos()
}

// healLoop decides what the loss of l was and acts on it, restarting the
// profile until it serves, a switch takes over, or it gives up.
func (h *healer) healLoop(ctx context.Context, l lostBackend) {
	s := h.s
	s.mu.Lock()
	epoch := s.heal.epoch
	s.mu.Unlock()
	switch h.classifyLoss(ctx, &l) {
	case lossHandRestart:
		s.bus.publish(api.Event{Kind: api.EventHand, Profile: l.profile, Status: api.StatusInfo,
			Message: fmt.Sprintf("%s was restarted by hand; gpuhost follows it and proves it again (ready, verify)", l.unit),
			Detail:  map[string]any{api.DetailUnit: l.unit, "action": "restart"}})
		h.takeStoppedByOther(l.unit) // only what this switch finds counts
		if err := h.healSwitch(ctx, l.profile, epoch, true); err == nil || err == errHealGaveWay {
			return
		}
		l.status = h.unitNow(ctx, l.unit)
		byOther := h.takeStoppedByOther(l.unit)
		switch h.classifyLoss(ctx, &l) {
		case lossHandStop:
			if byOther {
				// Stopped by hand while it was being proved again: the
				// operator's stop, not a crash.
				h.pause(l)
				return
			}
		case lossReplaced:
			// Another unit started by hand meanwhile: the operator
			// moved on, and gpuhost follows.
			h.followReplacement(ctx, l)
			return
		}
	case lossHandStop:
		h.pause(l)
		return
	case lossReplaced:
		h.followReplacement(ctx, l)
		return
	}
	for {
		reason := crashReason(l.status)
		restarts, giveUp := h.noteCrash(l, reason)
		if giveUp {
			h.giveUp(ctx, l, reason)
			return
		}
		if !*s.cfg.Heal.Enabled {
			return // heal.enabled false: idle (the doctor fails) until heal or a switch
		}
		wait := healBackoff(s.cfg.Heal.Backoff.D(), s.cfg.Heal.MaxBackoff.D(), restarts)
		h.setHealStep(l.profile, stepHealWait)
		if !h.healWait(ctx, wait, epoch) {
			return
		}
		err := h.healSwitch(ctx, l.profile, epoch, false)
		if err == nil {
			s.bus.publish(api.Event{Kind: api.EventHeal, Profile: l.profile, Status: api.StatusDone,
				DurationMS: float64(time.Since(l.at).Microseconds()) / 1000,
				Message:    fmt.Sprintf("%s serves again after its crash (%s)", l.profile, time.Since(l.at).Round(time.Millisecond)),
				Detail:     map[string]any{api.DetailUnit: l.unit, "restarts_in_window": restarts + 1}})
			return
		}
		if err == errHealGaveWay {
			return
		}
		// The restart failed: the unit died while starting (or the switch
		// could not get there); that is the next crash.
		l.status, l.at = h.unitNow(ctx, l.unit), time.Now()
		if crashReason(l.status) == "stopped" {
			l.status.Result = "start-failed"
		}
	}
}

// Kinds of loss of the active backend.
const (
	lossCrash = iota
	lossHandRestart
	lossHandStop
	lossReplaced // another backend unit started by hand stopped it (Conflicts=)
)

// classifyLoss tells a crash from a hand stop and a hand restart (see the
// file comment); l.status is updated to the last reading.
func (h *healer) classifyLoss(ctx context.Context, l *lostBackend) int {
	st := l.status
	if st.Active() {
		return lossHandRestart
	}
	if st.ActiveState != "inactive" || (st.Result != "success" && st.Result != "") {
		return lossCrash
	}
	h.setHealStep(l.profile, stepHealCheck)
	deadline := time.Now().Add(handStopGrace)
	for time.Now().Before(deadline) {
		if st.Active() {
			l.status = st
			return lossHandRestart
		}
		if h.otherRunning(ctx, l.unit) != nil {
			l.status = st
			return lossReplaced
		}
		select {
		case <-ctx.Done():
			return lossHandStop
		case <-time.After(50 * time.Millisecond):
		}
		st = h.unitNow(ctx, l.unit)
	}
	l.status = st
	if st.Active() {
		return lossHandRestart
	}
	if st.ActiveState != "inactive" || (st.Result != "success" && st.Result != "") {
		return lossCrash
	}
	return lossHandStop
}

// unitNow reads a unit's state (the zero status with the error's text as
// Result when it cannot be read).
func (h *healer) unitNow(ctx context.Context, unit string) api.UnitStatus {
	s := h.s
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := s.units.Unit(cctx, unit)
	if err != nil {
		return api.UnitStatus{Name: unit, ActiveState: "unknown", Result: "unreadable"}
	}
	return st
}

// crashReason is the metric's and the event's reason: systemd's Result
// when it names one, else the state.
func crashReason(st api.UnitStatus) string {
	switch {
	case st.Result != "" && st.Result != "success":
		return st.Result
	case st.ActiveState == "failed":
		return "failed"
	}
	return "stopped"
}

// noteCrash counts a crash within heal.window and publishes it; giveUp
// when the restarts made in the window reached heal.max_restarts.
func (h *healer) noteCrash(l lostBackend, reason string) (restarts int, giveUp bool) {
	s := h.s
	now := time.Now()
	s.mu.Lock()
	keep := s.heal.restarts[:0]
	for _, t := range s.heal.restarts {
		if now.Sub(t) < s.cfg.Heal.Window.D() {
			keep = append(keep, t)
		}
	}
	s.heal.restarts = keep
	restarts = len(keep)
	giveUp = restarts >= s.cfg.Heal.MaxRestarts
	enabled := *s.cfg.Heal.Enabled
	s.mu.Unlock()
	what := fmt.Sprintf("restarting it (restart %d of %d within %s)", restarts+1, s.cfg.Heal.MaxRestarts, s.cfg.Heal.Window.D())
	switch {
	case !enabled:
		what = "not restarting it (heal.enabled is false); `gpuhost heal` starts it again"
	case giveUp:
		what = fmt.Sprintf("giving up: %d restarts within %s already", restarts, s.cfg.Heal.Window.D())
	}
	s.bus.publish(api.Event{Kind: api.EventCrash, Profile: l.profile, Status: api.StatusFailed,
		Message: fmt.Sprintf("the backend of %s (%s) crashed (%s, %s): %s", l.profile, l.unit, l.status.ActiveState, reason, what),
		Detail: map[string]any{api.DetailUnit: l.unit, api.DetailReason: reason, "active_state": l.status.ActiveState,
			"restarts_in_window": restarts, api.DetailLog: logHint(s.cfg, l.unit)}})
	return restarts, giveUp
}

// healBackoff is the wait before restart number restarts+1 within the
// window: base, doubled for each restart already made, capped.
func healBackoff(base, ceiling time.Duration, restarts int) time.Duration {
	d := base
	for i := 0; i < restarts && d < ceiling; i++ {
		d *= 2
	}
	return min(d, ceiling)
}

// healWait waits d unless a switch asked for meanwhile (or Close) ends the
// heal; false then.
func (h *healer) healWait(ctx context.Context, d time.Duration, epoch uint64) bool {
	s := h.s
	wctx, cancel := context.WithCancel(ctx)
	s.mu.Lock()
	if s.heal.epoch != epoch {
		s.mu.Unlock()
		cancel()
		return false
	}
	s.heal.cancel = cancel
	s.mu.Unlock()
	defer cancel()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-wctx.Done():
		return false
	}
}

// errHealGaveWay: a switch asked for meanwhile decides instead of heal.
var errHealGaveWay = fmt.Errorf("a switch asked for meanwhile decides")

// healSwitch restarts profile through the normal switch and waits for it.
func (h *healer) healSwitch(ctx context.Context, profile string, epoch uint64, follow bool) error {
	s := h.s
	p := s.cfg.Profiles[profile]
	if !s.switchMu.TryLock() {
		return errHealGaveWay
	}
	s.mu.Lock()
	if s.heal.epoch != epoch {
		s.mu.Unlock()
		s.switchMu.Unlock()
		return errHealGaveWay
	}
	s.heal.restarts = append(s.heal.restarts, time.Now())
	s.mu.Unlock()
	_, done := s.launch(&switchRun{s: s, id: newID(), target: p, opts: api.SwitchOptions{Force: true}, started: time.Now(), follow: follow})
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// giveUp ends the retries: phase failed with the reason and the unit's
// last log lines, until `gpuhost heal` or a switch.
func (h *healer) giveUp(ctx context.Context, l lostBackend, reason string) {
	s := h.s
	jctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	lines, err := s.journal(jctx, l.unit, healJournalLines)
	cancel()
	if err != nil {
		lines = []string{"(journal unavailable: " + err.Error() + ")"}
	}
	msg := fmt.Sprintf("%s crashed %d times within %s (last: %s); gpuhost stopped restarting it: see %s, then `gpuhost heal`",
		l.profile, s.cfg.Heal.MaxRestarts+1, s.cfg.Heal.Window.D(), reason, strings.TrimSpace(logHint(s.cfg, l.unit)))
	s.mu.Lock()
	s.heal.gaveUp = msg
	s.state = api.State{Phase: api.PhaseFailed, Error: msg, LastError: msg, Since: time.Now(),
		LastWanted: s.state.LastWanted, Standby: s.standby.infos()}
	s.mu.Unlock()
	s.bus.publish(api.Event{Kind: api.EventHeal, Profile: l.profile, Status: api.StatusFailed, Message: msg, Journal: lines,
		Detail: map[string]any{api.DetailUnit: l.unit, api.DetailReason: reason}})
}

// pause records a clean hand stop of the active backend: nothing is wanted
// until `gpuhost heal` (which resumes l.profile) or a switch.
func (h *healer) pause(l lostBackend) {
	s := h.s
	if err := s.writePaused(l.profile); err != nil {
		s.log.Error("persist the paused profile", "err", err)
	}
	s.mu.Lock()
	s.state = api.State{Phase: api.PhaseIdle, Paused: l.profile, Since: time.Now(), Standby: s.standby.infos()}
	s.mu.Unlock()
	s.bus.publish(api.Event{Kind: api.EventPaused, Profile: l.profile, Status: api.StatusInfo,
		Message: fmt.Sprintf("%s (%s) was stopped by hand: nothing is served until `gpuhost heal` (resumes %s) or `gpuhost switch PROFILE`", l.unit, l.profile, l.profile),
		Detail:  map[string]any{api.DetailUnit: l.unit, "action": "stop"}})
}

// HealTarget is the profile `gpuhost heal` starts: the last wanted one, or
// the one stopped by hand; "" when nothing was ever wanted.
func HealTarget(st api.State) string {
	if st.LastWanted != "" {
		return st.LastWanted
	}
	return st.Paused
}

// Heal forgets the crash history, resumes a paused profile, and starts the
// wanted profile again through the normal switch (also when it serves: the
// switch then proves it once more).
func (s *Supervisor) Heal(ctx context.Context) (string, string, <-chan error, error) {
	profile := HealTarget(s.State())
	if profile == "" {
		return "", "", nil, fmt.Errorf("%w: nothing to heal: no profile was wanted yet (gpuhost switch PROFILE)", api.ErrUnknownProfile)
	}
	id, done, err := s.Switch(ctx, profile, api.SwitchOptions{Force: true})
	return profile, id, done, err
}

// NotServing says why the last wanted profile does not serve, from the
// state ("" while it serves, while a switch runs, or when nothing is
// wanted).
func NotServing(st api.State) string {
	if st.LastWanted == "" {
		return ""
	}
	switch st.Phase {
	case api.PhaseSwitching:
		if st.Step == stepHealWait {
			return fmt.Sprintf("%s crashed; gpuhost restarts it", st.Target)
		}
		return ""
	case api.PhaseActive:
		if st.Profile == st.LastWanted && st.Step != "deactivating" {
			return ""
		}
	}
	return WantedDrift(st)
}

// publishStandbyLostLocked says that a unit in standby was dropped from it:
// it died (a crash, counted like the active one's) or was stopped or
// restarted by hand; the next switch to its profile starts it cold. s.mu
// is held (the bus never takes it).
func (h *healer) publishStandbyLostLocked(b backendState, e standbyEntry) {
	s := h.s
	s.watch.handActionLocked()
	detail := map[string]any{api.DetailUnit: b.unit, "active_state": b.status.ActiveState, "standby": true}
	reason := crashReason(b.status)
	switch {
	case !b.status.Active() && reason != "stopped":
		detail[api.DetailReason], detail[api.DetailLog] = reason, logHint(s.cfg, b.unit)
		s.bus.publish(api.Event{Kind: api.EventCrash, Profile: e.Profile, Status: api.StatusFailed, Detail: detail,
			Message: fmt.Sprintf("the backend of %s in standby (%s) crashed (%s, %s): dropped from standby; the next switch to %s starts it cold",
				e.Profile, b.unit, b.status.ActiveState, reason, e.Profile)})
	case !b.status.Active():
		s.bus.publish(api.Event{Kind: api.EventStandby, Profile: e.Profile, Status: api.StatusInfo, Detail: detail,
			Message: fmt.Sprintf("%s in standby (%s) was stopped behind gpuhost's back: dropped from standby; the next switch to %s starts it cold", e.Profile, b.unit, e.Profile)})
	default:
		s.bus.publish(api.Event{Kind: api.EventStandby, Profile: e.Profile, Status: api.StatusInfo, Detail: detail,
			Message: fmt.Sprintf("%s in standby (%s) was restarted behind gpuhost's back (now %s): dropped from standby; the watcher decides on it", e.Profile, b.unit, orDash(b.profile))})
	}
}

// pickServingLocked chooses, when several backend units run and none was
// active (all started by hand), the one to serve: the wanted profile's
// (last wanted, else the one stopped by hand, else default_profile), else
// any running a known profile. The watcher then puts the others into
// standby or stops them. s.mu is held.
func (h *healer) pickServingLocked(prev api.State, active []backendState) (backendState, bool) {
	s := h.s
	want := HealTarget(prev)
	if want == "" {
		want = s.cfg.DefaultProfile
	}
	best, found := backendState{}, false
	score := func(b backendState) int {
		n := 0
		if b.profile == want {
			n += 2
		}
		if b.status.ActiveState == "active" {
			n++
		}
		return n
	}
	for _, a := range active {
		if _, ok := s.cfg.Profiles[a.profile]; !ok || a.status.ActiveState == "deactivating" {
			continue
		}
		if !found || score(a) > score(best) {
			best, found = a, true
		}
	}
	if !found {
		return backendState{}, false
	}
	s.watch.handActionLocked()
	var names []string
	for _, a := range active {
		names = append(names, fmt.Sprintf("%s (%s, %s)", a.unit, orDash(a.profile), a.status.ActiveState))
	}
	s.bus.publish(api.Event{Kind: api.EventExclusion, Profile: best.profile, Status: api.StatusDone,
		Message: fmt.Sprintf("%d backends run and none is active (%s): %s serves from %s; the watcher puts the others into standby or stops them",
			len(active), strings.Join(names, ", "), best.profile, best.unit),
		Detail: map[string]any{api.DetailDrift: driftSeveral, api.DetailUnit: best.unit}})
	return best, true
}

// resumeOnHandStartLocked: a backend started by hand while nothing is
// wanted (its profile stopped by hand) makes a profile wanted again. Hand
// starts come in bursts (`systemctl start A B` brings A up before B), so
// the decision waits handStopGrace, holding requests, and then takes the
// paused profile when its unit runs it, else the first unit running a
// known profile. Only the running daemon does this. s.mu is held; true
// when it took the state over.
func (h *healer) resumeOnHandStartLocked(prev api.State, active []backendState) (api.State, bool) {
	s := h.s
	if prev.Paused == "" || prev.LastWanted != "" || !s.live || s.heal.running || len(active) == 0 {
		return api.State{}, false
	}
	s.heal.running = true
	s.watch.handActionLocked()
	next := healState(prev, prev.Paused, stepHandStart)
	next.Standby = s.standby.infos()
	s.state = next
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		h.resumeAfterHandStart(s.baseCtx, prev.Paused)
		s.mu.Lock()
		s.heal.running = false
		s.mu.Unlock()
		s.Reconcile(s.baseCtx)
	}()
	return next, true
}

// resumeAfterHandStart decides, after the grace, which profile a hand start
// made wanted (see resumeOnHandStartLocked).
func (h *healer) resumeAfterHandStart(ctx context.Context, paused string) {
	s := h.s
	select {
	case <-time.After(handStopGrace):
	case <-ctx.Done():
		return
	}
	bs, err := s.backends(ctx)
	if err != nil {
		return
	}
	want, unit := "", ""
	for _, b := range bs {
		if _, ok := s.cfg.Profiles[b.profile]; !ok || !b.status.Active() {
			continue
		}
		if _, asleep := s.standby.of(b.unit); asleep {
			continue
		}
		if want == "" || b.profile == paused {
			want, unit = b.profile, b.unit
		}
	}
	if want == "" {
		return // stopped again meanwhile: still paused
	}
	if err := s.writeLastWanted(want); err != nil {
		s.log.Error("persist last wanted profile", "err", err)
	}
	s.mu.Lock()
	s.state.LastWanted, s.state.Paused = want, ""
	s.mu.Unlock()
	s.bus.publish(api.Event{Kind: api.EventHand, Profile: want, Status: api.StatusInfo, Detail: map[string]any{api.DetailUnit: unit, "action": "start"},
		Message: fmt.Sprintf("%s was started by hand while nothing was wanted: %s is the wanted profile again", unit, want)})
}

// otherRunning is a backend unit other than unit that runs and is not in
// standby (nil when none).
func (h *healer) otherRunning(ctx context.Context, unit string) *backendState {
	s := h.s
	bs, err := s.backends(ctx)
	if err != nil {
		return nil
	}
	for _, b := range bs {
		if b.unit == unit || !b.status.Active() {
			continue
		}
		if _, asleep := s.standby.of(b.unit); asleep {
			continue
		}
		if _, ok := s.cfg.Profiles[b.profile]; ok {
			return &b
		}
	}
	return nil
}

// followReplacement: the active unit stopped cleanly because another
// backend unit was started by hand (with Conflicts= systemd stops the one
// to start the other): a switch by hand. gpuhost follows it and its
// profile becomes the wanted one.
func (h *healer) followReplacement(ctx context.Context, l lostBackend) {
	s := h.s
	b := h.otherRunning(ctx, l.unit)
	if b == nil {
		return // gone again: Reconcile reads what is left
	}
	if err := s.writeLastWanted(b.profile); err != nil {
		s.log.Error("persist last wanted profile", "err", err)
	}
	s.mu.Lock()
	s.state.LastWanted, s.state.Paused = b.profile, ""
	s.mu.Unlock()
	s.bus.publish(api.Event{Kind: api.EventHand, Profile: b.profile, Status: api.StatusInfo, Detail: map[string]any{api.DetailUnit: b.unit, "action": "start"},
		Message: fmt.Sprintf("%s was started by hand and %s (%s) stopped for it: gpuhost follows; %s is the wanted profile", b.unit, l.unit, l.profile, b.profile)})
}
