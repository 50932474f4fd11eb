package appliance

// Standby switching: instead of stopping the backend a switch leaves, put it
// to sleep (vLLM sleep mode) or unload its model (Ollama), keep its unit
// running, and wake it in seconds when a switch comes back. The invariant
// that replaces "one backend unit runs" is "at most one backend holds more
// GPU memory than its standby residual": each backend in standby is held at
// or below the residual NVML measured at its first sleep (persisted per
// profile), the switch waits for that before it starts or wakes the next,
// and a watcher puts back to sleep (or stops) a backend in standby that
// takes memory behind the Supervisor's back.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"gpuhost/api"
	"gpuhost/backend"
	"gpuhost/nvml"
	"gpuhost/systemd"
	"gpuhost/units"
)

// residualToleranceMiB is the measurement noise allowed above a backend's
// measured residual (allocator rounding between two sleeps). It is far
// below the release tolerance: a backend in standby must stay where it was
// measured, not "near the baseline".
const residualToleranceMiB = 64

// hostMarginMiB is what sleep level 1 leaves free in host RAM beyond the
// weights it offloads there (at least; 10 % of the weights when larger):
// level 1 with RAM too tight would push the box into swap or the OOM killer.
const hostMarginMiB = 2048

// standbyEntry is one backend unit in standby.
type standbyEntry struct {
	Profile string        `json:"profile"`
	Mode    units.Standby `json:"mode"` // sleep1, sleep2 or unload: never auto
	Since   time.Time     `json:"since"`
}

// level is the vLLM sleep level of a mode (0 for Ollama's unload).
func (e standbyEntry) level() int { return modeLevel(e.Mode) }

func modeLevel(m units.Standby) int {
	switch m {
	case units.StandbySleep1:
		return 1
	case units.StandbySleep2:
		return 2
	}
	return 0
}

// unitUsedMiB is the GPU memory held by the processes of one unit.
func unitUsedMiB(d nvml.Device, st api.UnitStatus) uint64 {
	var sum uint64
	for _, p := range d.Processes {
		if systemd.InUnits(p.PID, st) {
			sum += p.UsedMiB
		}
	}
	return sum
}

// unitUsedOn is what the unit's processes hold on all of devs together: a
// backend placed on GPU 1, or tensor parallel on several, holds its memory
// there, not on GPU 0.
func unitUsedOn(devs []nvml.Device, st api.UnitStatus) uint64 {
	var sum uint64
	for _, d := range devs {
		sum += unitUsedMiB(d, st)
	}
	return sum
}

// hostAvailableMiB is the host's MemAvailable: from the simulated GPU when
// it simulates host RAM too (the demo and the tests), else /proc/meminfo.
func (s *Supervisor) hostAvailableMiB(ctx context.Context) (uint64, error) {
	if h, ok := s.gpu.(interface {
		HostMemAvailableMiB(context.Context) (uint64, error)
	}); ok {
		return h.HostMemAvailableMiB(ctx)
	}
	return systemd.MemAvailableMiB()
}

// weightsMiB estimates what sleep level 1 moves to host RAM: the weights
// from the profile's model_params when given, else everything the backend
// holds beyond its residual (an upper bound: the KV cache is discarded, not
// moved, so the estimate errs towards level 2).
func (s *Supervisor) weightsMiB(p *units.Profile, heldMiB uint64) (mib uint64, exact bool) {
	if p.Params.TotalParamsB > 0 && p.Params.WeightBits > 0 {
		return uint64(p.Params.TotalParamsB * 1e9 * p.Params.WeightBits / 8 / (1 << 20)), true
	}
	res, _ := s.standby.residualOf(p.Name)
	if heldMiB > res {
		return heldMiB - res, false
	}
	return heldMiB, false
}

// chooseStandby picks the standby mode for p now, and says why. Ollama
// unloads. vLLM sleeps at level 2 when configured so; level 1 (configured,
// or auto) only when host RAM holds the weights with a margin, else level 2:
// level 1 is the faster wake but must never push the box into swap.
func (s *Supervisor) chooseStandby(ctx context.Context, p *units.Profile, heldMiB uint64) (units.Standby, string) {
	if p.Backend == units.Ollama {
		return units.StandbyUnload, fmt.Sprintf("unload %s: an Ollama server without a loaded model holds no GPU memory", p.Model)
	}
	if p.Standby == units.StandbySleep2 {
		return units.StandbySleep2, "sleep level 2 (configured): weights and KV cache discarded, weights reloaded on wake"
	}
	w, exact := s.weightsMiB(p, heldMiB)
	need := w + max(hostMarginMiB, w/10)
	of := "of weights"
	if !exact {
		of = "of weights at most (all it holds; model_params would tell exactly)"
	}
	avail, err := s.hostAvailableMiB(ctx)
	if err != nil {
		return units.StandbySleep2, fmt.Sprintf("sleep level 2: host memory unknown (%v), so the weights are not offloaded to it", err)
	}
	gib := func(m uint64) float64 { return float64(m) / 1024 }
	if avail >= need {
		return units.StandbySleep1, fmt.Sprintf("sleep level 1: %.1f GiB %s, %.1f GiB available", gib(w), of, gib(avail))
	}
	return units.StandbySleep2, fmt.Sprintf("sleep level 2: %.1f GiB %s (+%.1f GiB margin) do not fit in %.1f GiB available host memory",
		gib(w), of, gib(need-w), gib(avail))
}

// standbyOld puts the backends in l.toStandby into standby. One that cannot
// be put there (the engine refuses, or its memory does not come down to its
// residual) is stopped instead by the stop step: standby is an
// optimisation, never a reason for a second holder on the card.
func (l *leg) standbyOld(ctx context.Context) (string, map[string]any, error) {
	var msgs []string
	detail := map[string]any{}
	for _, b := range l.toStandby {
		msg, mode, err := l.r.s.sendToStandby(ctx, l.r, b)
		if err != nil {
			if errors.Is(err, errResidualHigh) {
				l.r.s.wakeFailed(l.r, l.r.s.cfg.Profiles[b.profile], wakeReasonResidual, err.Error(), false)
			}
			l.toStop = append(l.toStop, b)
			msgs = append(msgs, fmt.Sprintf("%s not in standby (%v); it will be stopped", b.unit, err))
			continue
		}
		detail[b.unit] = string(mode)
		msgs = append(msgs, msg)
	}
	return strings.Join(msgs, "; "), detail, nil
}

// sendToStandby puts one backend to sleep and waits until NVML shows it at
// its residual.
func (s *Supervisor) sendToStandby(ctx context.Context, r *switchRun, b backendState) (string, units.Standby, error) {
	p := s.cfg.Profiles[b.profile]
	held := s.unitHeldMiB(ctx, b.status)
	mode, why := s.chooseStandby(ctx, p, held)
	r.event(api.Event{Kind: api.EventStep, Step: api.StepStandby, Status: api.StatusInfo, Profile: p.Name, Message: why,
		Detail: map[string]any{"mode": string(mode), "held_mib": held}})
	be, err := s.engineOf(p)
	if err != nil {
		return "", mode, err
	}
	sl, ok := be.(backend.Sleeper)
	if !ok {
		return "", mode, fmt.Errorf("the %s engine has no standby", p.Backend)
	}
	sctx, cancel := context.WithTimeout(ctx, s.cfg.GPU.ReleaseTimeout.D())
	defer cancel()
	// A backend already asleep before its first measured sleep (a crash
	// during that sleep, or a hand /sleep) will not come down from what it
	// holds now: its first steady reading is the residual.
	from := held
	if _, known := s.standby.residualOf(p.Name); !known && s.engineSleeping(sctx, p) {
		from = 0
	}
	if _, err := sl.Sleep(sctx, modeLevel(mode)); err != nil {
		return "", mode, err
	}
	used, measured, err := s.waitResidual(sctx, p, b.status, from)
	if err != nil {
		return "", mode, err
	}
	s.standby.set(b.unit, standbyEntry{Profile: p.Name, Mode: mode, Since: time.Now()})
	msg := fmt.Sprintf("%s in standby (%s): %d MiB held, was %d", p.Name, mode, used, held)
	if measured {
		msg += " (residual measured now)"
	}
	return msg, mode, nil
}

// unitHeldMiB is what the unit holds now; 0 when NVML cannot tell.
func (s *Supervisor) unitHeldMiB(ctx context.Context, st api.UnitStatus) uint64 {
	snap, err := s.snapshot(ctx)
	if err != nil {
		return 0
	}
	return unitUsedOn(snap.Devices, st)
}

// errResidualHigh: a backend in standby holds more than its measured
// residual.
var errResidualHigh = errors.New("residual above the recorded one")

// A standby reading that has not changed for residualSettledReadings polls
// and residualSettledFor since the sleep returned is where the backend
// stays: above its residual, it fails at once instead of at the release
// timeout.
const (
	residualSettledReadings = 5
	residualSettledFor      = 2 * time.Second
)

// waitResidual waits until the unit's processes hold at most the profile's
// measured residual. The first time there is none: it waits until the
// memory has come down from heldMiB (0: from anything) and stays put for
// three readings, and stores that as the residual.
func (s *Supervisor) waitResidual(ctx context.Context, p *units.Profile, st api.UnitStatus, heldMiB uint64) (used uint64, measured bool, err error) {
	known, ok := s.standby.residualOf(p.Name)
	pl := newPoller(releasePollCap)
	var prev uint64
	stable := 0
	t0 := time.Now()
	for {
		snap, serr := s.snapshot(ctx)
		if serr != nil && errors.Is(serr, nvml.ErrUnavailable) {
			return 0, false, fmt.Errorf("cannot verify the standby residual: %w", serr)
		}
		if serr == nil {
			if len(snap.Devices) == 0 {
				return 0, false, errors.New("no GPU device reported: cannot verify the standby residual")
			}
			used = unitUsedOn(snap.Devices, st)
			if used == prev {
				stable++
			} else {
				stable = 0
			}
			switch {
			case ok && used <= known+residualToleranceMiB:
				return used, false, nil
			case ok && stable >= residualSettledReadings && time.Since(t0) >= residualSettledFor:
				// Settled above the residual: waiting out the release
				// timeout would only hold the switch (a residual that grew
				// with an engine release, or a sleep that kept more).
				return used, false, fmt.Errorf("%w: %s holds %d MiB in standby, settled above its measured residual %d MiB (+%d)",
					errResidualHigh, st.Name, used, known, residualToleranceMiB)
			case !ok && (used < heldMiB || heldMiB == 0):
				if stable >= 2 {
					s.standby.setResidual(p.Name, used)
					return used, true, nil
				}
			}
			prev = used
		}
		if werr := pl.wait(ctx); werr != nil {
			if ok {
				return used, false, fmt.Errorf("%w: %s holds %d MiB in standby, above its measured residual %d MiB (+%d)", errResidualHigh, st.Name, used, known, residualToleranceMiB)
			}
			return used, false, fmt.Errorf("%s did not settle in standby: %d MiB held, was %d", st.Name, used, heldMiB)
		}
	}
}

// wakeTarget wakes the target's backend from standby.
func (l *leg) wakeTarget(ctx context.Context) (string, map[string]any, error) {
	s := l.r.s
	e, recorded := s.standby.of(l.unit)
	level := e.level()
	if !recorded && l.p.Backend == units.VLLM {
		// Put to sleep behind gpuhost's back: at the level vLLM's gauge
		// says, else level 2, whose wake (weights reloaded) is right after
		// either.
		e.Mode = handSleepMode(ctx, l.be)
		level = e.level()
	}
	sl, ok := l.be.(backend.Sleeper)
	if !ok {
		return "", nil, fmt.Errorf("the %s engine has no standby", l.p.Backend)
	}
	wctx, cancel := context.WithTimeout(ctx, s.cfg.Switch.ReadyTimeout.D())
	defer cancel()
	msg, err := sl.Wake(wctx, level)
	if err != nil {
		return "", map[string]any{"mode": string(e.Mode)}, err
	}
	l.wokeLevel = level
	s.standby.clear(l.unit)
	return msg, map[string]any{"mode": string(e.Mode)}, nil
}

// checkStandbyAtStart keeps only the persisted standby entries whose unit
// runs that profile and whose engine says it is in standby; the others
// are forgotten (the unit was stopped, restarted or woken meanwhile), and
// Reconcile then sees the unit as what it is.
func (s *Supervisor) checkStandbyAtStart(ctx context.Context) {
	bs, err := s.backends(ctx)
	if err != nil {
		return
	}
	for _, b := range bs {
		e, ok := s.standby.of(b.unit)
		if !ok {
			continue
		}
		keep := b.status.Active() && b.profile == e.Profile
		if keep {
			keep = s.engineSleeping(ctx, s.cfg.Profiles[e.Profile])
		}
		if !keep {
			s.log.Info("forgetting standby of a backend that is no longer asleep", "unit", b.unit, "profile", e.Profile)
			s.standby.clear(b.unit)
		}
	}
}

// engineSleeping asks p's server whether it is in standby (false when it
// cannot tell).
func (s *Supervisor) engineSleeping(ctx context.Context, p *units.Profile) bool {
	be, err := s.engineOf(p)
	if err != nil {
		return false
	}
	sl, ok := be.(backend.Sleeper)
	if !ok {
		return false
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	asleep, err := sl.Sleeping(cctx)
	return err == nil && asleep
}

// enforceStandby checks every backend in standby against its residual and
// puts one that holds more back into standby, or stops it when that fails:
// only the active backend may hold more than its residual. vLLM's own
// start-time check of free memory is the last line behind this one.
func (w *watcher) enforceStandby(ctx context.Context) {
	s := w.s
	ws := s.standby.watched()
	if len(ws) == 0 {
		return
	}
	snap, err := s.snapshot(ctx)
	if err != nil {
		return
	}
	if len(snap.Devices) == 0 {
		return
	}
	for _, sw := range ws {
		if !sw.known {
			continue
		}
		st, err := s.units.Unit(ctx, sw.unit)
		if err != nil || !st.Active() {
			continue
		}
		used := unitUsedOn(snap.Devices, st)
		if used <= sw.residual+residualToleranceMiB {
			continue
		}
		// Acting takes the switch lock, so no switch wakes or stops the
		// unit meanwhile; with a switch under way, the next round decides.
		if !s.switchMu.TryLock() {
			return
		}
		// The readings above were taken without the lock: a switch may
		// have woken this unit (above its residual, still listed) and
		// finished since, so that it now serves. Decide again under the
		// lock, on the standby entry and fresh readings.
		if st, used, ok := w.stillAboveResidual(ctx, sw.unit, sw.e, sw.residual); ok {
			w.standbyViolation(ctx, sw.unit, sw.e, st, used, sw.residual)
		}
		s.switchMu.Unlock()
	}
}

// stillAboveResidual reports whether unit is still in standby as e and
// holds more than its residual now; switchMu is held.
func (w *watcher) stillAboveResidual(ctx context.Context, unit string, e standbyEntry, residual uint64) (api.UnitStatus, uint64, bool) {
	s := w.s
	cur, ok := s.standby.of(unit)
	if !ok || cur.Profile != e.Profile || cur.Mode != e.Mode || !cur.Since.Equal(e.Since) {
		return api.UnitStatus{}, 0, false
	}
	st, err := s.units.Unit(ctx, unit)
	if err != nil || !st.Active() {
		return api.UnitStatus{}, 0, false
	}
	snap, err := s.snapshot(ctx)
	if err != nil {
		return api.UnitStatus{}, 0, false
	}
	if len(snap.Devices) == 0 {
		return api.UnitStatus{}, 0, false
	}
	used := unitUsedOn(snap.Devices, st)
	return st, used, used > residual+residualToleranceMiB
}

// standbyViolation records and ends one backend above its residual.
func (w *watcher) standbyViolation(ctx context.Context, unit string, e standbyEntry, st api.UnitStatus, used, residual uint64) {
	s := w.s
	msg := fmt.Sprintf("%s is in standby (%s) but holds %d MiB, above its residual %d MiB: ", unit, e.Profile, used, residual)
	p := s.cfg.Profiles[e.Profile]
	fixed := false
	if be, err := s.engineOf(p); err == nil {
		if sl, ok := be.(backend.Sleeper); ok {
			cctx, cancel := context.WithTimeout(ctx, s.cfg.GPU.ReleaseTimeout.D())
			if _, err := sl.Sleep(cctx, e.level()); err == nil {
				_, _, err = s.waitResidual(cctx, p, st, used)
				fixed = err == nil
			}
			cancel()
		}
	}
	if fixed {
		msg += "put back into standby"
	} else {
		cctx, cancel := context.WithTimeout(ctx, s.cfg.Switch.StopTimeout.D())
		if err := s.units.Stop(cctx, unit); err != nil {
			msg += "could not be put back into standby, and stopping it failed: " + err.Error()
		} else {
			msg += "could not be put back into standby; stopped"
		}
		cancel()
		s.standby.clear(unit)
	}
	s.standby.violation(msg)
	// The bus logs the event (once, with its detail).
	s.bus.publish(api.Event{Kind: api.EventExclusion, Status: api.StatusFailed, Profile: e.Profile, Message: msg,
		Detail: map[string]any{api.DetailUnit: unit, api.DetailUsedMiB: used, "residual_mib": residual, api.DetailDrift: "standby_awake"}})
	if !fixed {
		s.Reconcile(ctx)
	}
}

// Exclusion reports how often a backend in standby was found above its
// residual, and the last time, for the doctor.
func (s *Supervisor) Exclusion() (violations uint64, last time.Time, lastMsg string) {
	return s.standby.exclusionSeen()
}

// handSleepMode is the standby mode of a vLLM put to sleep behind
// gpuhost's back: level 1 when its vllm:engine_sleep_state says so, else
// level 2 (right to wake from after either).
func handSleepMode(ctx context.Context, be backend.Backend) units.Standby {
	v, ok := be.(*backend.VLLM)
	if !ok {
		return units.StandbySleep2
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if lvl, err := v.SleepLevel(cctx); err == nil && lvl == 1 {
		return units.StandbySleep1
	}
	return units.StandbySleep2
}
