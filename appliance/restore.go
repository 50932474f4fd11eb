package appliance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"gpuhost/api"
	"gpuhost/config"
	"gpuhost/units"
)

// Ready is closed once Run has derived the state from systemd and NVML and,
// when restore_on_boot has something to do, started the restore switch (so
// the state reads "switching", not a premature "idle"). serve sends
// READY=1 to systemd only then: a switch that arrives earlier would see no
// previous profile to roll back to.
func (s *Supervisor) Ready() <-chan struct{} { return s.ready }

// AwaitFirstActive blocks until a profile is active and settled (phase
// active, no step), or ctx ends. Unlike AwaitActive it does not give up
// while the box is idle or failed: it is for components that have nothing
// to do until a model runs, such as the triage worker at start-up.
func (s *Supervisor) AwaitFirstActive(ctx context.Context) error {
	ch, _, cancel := s.bus.subscribe(s.bus.lastSeq())
	defer cancel()
	for {
		if st := s.State(); st.Phase == api.PhaseActive && st.Step == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// restore decides what to do at start-up. systemd is the truth about what
// runs; the last wanted profile (state.json, written when a switch is
// accepted) is what the operator asked for last. A crash can leave them
// apart: killed while the old backend was still stopping (its unit
// "deactivating"), or after a switch was accepted but before its stop
// reached systemd (the old profile still running). In both cases the last
// wanted switch is completed. Units in transition need no wait here: the
// restore switch's stop step waits for a deactivating unit to finish (a stop
// job joins the running one), and the VRAM check waits for its memory.
func (s *Supervisor) restore(ctx context.Context, st api.State) {
	if !*s.cfg.Switch.RestoreOnBoot {
		if msg := WantedDrift(st); msg != "" {
			s.log.Warn("restore_on_boot is off; not completing the last wanted switch", "detail", msg)
		}
		return
	}
	if st.Paused != "" && st.LastWanted == "" {
		s.bus.publish(api.Event{Kind: api.EventReconcile, Profile: st.Paused, Message: st.Paused + " was stopped by hand: nothing is wanted; `gpuhost heal` resumes it"})
		return
	}
	explicit := st.LastWanted
	if explicit != "" {
		if _, ok := s.cfg.Profiles[explicit]; !ok {
			s.log.Warn("last wanted profile is no longer in the config; using default_profile", "profile", explicit, "default_profile", s.cfg.DefaultProfile)
			explicit = ""
		}
	}
	want := explicit
	if want == "" {
		want = s.cfg.DefaultProfile
	}
	if want == "" {
		return
	}
	var msg string
	switch {
	case st.Phase == api.PhaseIdle:
		msg = "no backend runs; restoring " + want
	case st.Phase == api.PhaseFailed:
		msg = "inconsistent backends at start-up (" + st.Error + "); converging on " + want
	case st.Step == "deactivating":
		msg = fmt.Sprintf("%s (%s) is still stopping; waiting for it, then restoring %s", st.Unit, st.Profile, want)
	case st.Profile == want:
		// Possibly started by us before a crash and not ready yet: the switch
		// sees the unit running with the right profile and only waits.
		msg = "backend of " + want + " already runs; checking readiness"
	case explicit != "":
		msg = fmt.Sprintf("%s runs but the last wanted profile is %s (a switch interrupted by a restart); completing it", describeRunning(st), want)
	default:
		// Something runs and nothing else was ever asked for: keep it.
		return
	}
	s.bus.publish(api.Event{Kind: api.EventReconcile, Profile: want, Message: msg})
	if _, _, err := s.Switch(ctx, want, api.SwitchOptions{Force: true}); err != nil {
		var be *api.BusyError
		if errors.As(err, &be) {
			s.log.Info("restore skipped: a switch requested meanwhile runs", "profile", want, "running_switch", be.Target)
			return
		}
		s.log.Error("restore last wanted profile", "profile", want, "err", err)
	}
}

func describeRunning(st api.State) string {
	if st.Profile == "" {
		return st.Unit + " (profile unknown)"
	}
	return fmt.Sprintf("%s (%s)", st.Profile, st.Unit)
}

// WantedDrift says, when no switch runs, how the last wanted profile
// differs from what runs ("" when they agree or nothing was ever wanted).
// With restore_on_boot the daemon completes such a switch at start; without
// it, `gpuhost status` and the doctor report it.
func WantedDrift(st api.State) string {
	if st.LastWanted == "" || st.Phase == api.PhaseSwitching {
		return ""
	}
	switch {
	case st.Phase == api.PhaseActive && st.Profile == st.LastWanted && st.Step != "deactivating":
		return ""
	case st.Phase == api.PhaseActive:
		return fmt.Sprintf("last wanted profile %s does not run; %s does", st.LastWanted, describeRunning(st))
	case st.Phase == api.PhaseFailed:
		return fmt.Sprintf("last wanted profile %s does not run (failed: %s)", st.LastWanted, st.Error)
	default:
		return fmt.Sprintf("last wanted profile %s does not run; no backend runs", st.LastWanted)
	}
}

// wantedCheck is the doctor's view of WantedDrift, from the state file and
// the units as systemd reports them.
// A backend in standby (asleep) is not running for this check, as for
// units.exclusive: both count the same servingBackends.
func wantedCheck(cfg *config.Config, bs []backendState, asleep map[string]standbyEntry) api.DoctorCheck {
	s := &Supervisor{cfg: cfg, log: slog.Default()}
	lw := s.readStateFile()
	st := api.State{Phase: api.PhaseIdle, LastWanted: lw.Profile}
	if lw.Profile == "" && lw.Paused != "" {
		return pausedCheck(lw.Paused)
	}
	c := api.DoctorCheck{ID: "state.last_wanted", Severity: units.SeverityOK, Value: st.LastWanted}
	active, _ := servingBackends(bs, asleep)
	switch len(active) {
	case 0:
	case 1:
		st.Phase, st.Profile, st.Unit = api.PhaseActive, active[0].profile, active[0].unit
		if active[0].status.ActiveState != "active" {
			st.Step = active[0].status.ActiveState
		}
	default:
		st.Phase, st.Error = api.PhaseFailed, "more than one backend active"
	}
	msg := WantedDrift(st)
	switch {
	case st.LastWanted == "":
		c.Message = "no switch was asked for yet (state file " + s.statePath() + ")"
	case msg == "":
		c.Message = "the last wanted profile " + st.LastWanted + " runs"
	case *cfg.Switch.RestoreOnBoot:
		c = notServingCheck(st.LastWanted, msg)
		c.Fix = "the daemon completes the last wanted switch when it starts (`systemctl start gpuhost`); if it runs, `gpuhost heal`"
	default:
		c = notServingCheck(st.LastWanted, msg+" (switch.restore_on_boot is off)")
		c.Fix = "`gpuhost heal` (or `gpuhost switch " + st.LastWanted + "`) completes it; switching to the running profile makes that the wanted one"
	}
	return c
}

// notServingCheck fails the doctor while the last wanted profile does not
// serve: the box answers /v1 with errors, whatever else is fine.
func notServingCheck(wanted, why string) api.DoctorCheck {
	return api.DoctorCheck{ID: "state.last_wanted", Severity: units.SeverityFail, Value: wanted,
		Message: "not serving: " + why,
		Fix:     "find the cause in the backend's log (the message says where), then `gpuhost heal` starts " + wanted + " again (or `gpuhost switch PROFILE`)"}
}

// pausedCheck warns that nothing is served because the operator stopped
// the active backend by hand.
func pausedCheck(paused string) api.DoctorCheck {
	return api.DoctorCheck{ID: "state.last_wanted", Severity: units.SeverityWarn, Value: "",
		Message: paused + " was stopped by hand (systemctl stop): nothing is wanted, /v1 serves nothing",
		Fix:     "`gpuhost heal` resumes " + paused + "; `gpuhost switch PROFILE` serves another"}
}
