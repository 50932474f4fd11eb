package appliance

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"gpuhost/api"
	"gpuhost/backend"
	"gpuhost/config"
	"gpuhost/units"
)

// The endpoint checks ask the active backend, and only it: a backend in
// standby answers nothing (an unloaded Ollama lists no model) and a probe
// would wake it; during a switch there is nothing settled to ask.

// endpointHealthTimeout bounds endpoint.health's requests.
const endpointHealthTimeout = 10 * time.Second

// endpointChecks is endpoint.health and, when the active backend serves,
// the checks of what an agent needs (doctor_agent.go), all under one
// probe lease.
func (d *Doctor) endpointChecks(ctx context.Context, bs []backendState, sf standbyFile) []api.DoctorCheck {
	c := api.DoctorCheck{ID: "endpoint.health", Severity: units.SeverityOK}
	act, sev, note := d.activeBackend(bs, sf)
	if act == nil {
		c.Severity, c.Message = sev, note
		return []api.DoctorCheck{c}
	}
	p, ok := d.Cfg.Profiles[act.profile]
	if !ok {
		c.Severity = units.SeverityWarn
		c.Message = fmt.Sprintf("%s is active with unknown profile %q", act.unit, act.profile)
		return []api.DoctorCheck{c}
	}
	c.Profile = p.Name
	pctx, release, err := d.lease(ctx, p.Name)
	if err != nil {
		c.Severity, c.Message = units.SeverityWarn, "not probed: "+err.Error()
		var ref *ProbeRefused
		if errors.As(err, &ref) && ref.Switching {
			c.Severity, c.Message = units.SeverityOK, ref.Reason+": the endpoint checks run once it is active"
		}
		return []api.DoctorCheck{c}
	}
	defer release()
	sup := &Supervisor{cfg: d.Cfg, gpu: d.GPU, units: d.Units, client: backendClient(d.Cfg), engines: backend.Engines(), log: discardLog}
	hctx, cancel := context.WithTimeout(pctx, endpointHealthTimeout)
	msg, _, verr := sup.verify(hctx, p)
	cancel()
	if verr != nil {
		if d.interrupted(pctx, ctx) {
			return []api.DoctorCheck{d.interruptedCheck(c)}
		}
		c.Severity = units.SeverityFail
		c.Message = fmt.Sprintf("%s (profile %s) is not serving correctly: %v", act.unit, p.Name, verr)
		c.Fix = logHint(d.Cfg, act.unit) + "; " + restartHint(d.Cfg, act.unit, false)
		return []api.DoctorCheck{c}
	}
	c.Message = msg
	out := append(append([]api.DoctorCheck{c}, d.agentChecks(pctx, *act, p)...), d.apisCheck(pctx, *act, p))
	if d.interrupted(pctx, ctx) {
		for i := range out {
			if out[i].Severity != units.SeverityOK {
				out[i] = d.interruptedCheck(out[i])
			}
		}
	}
	return out
}

// wantedCheck is state.last_wanted; while a switch runs the units are
// between two states, so it names the switch instead.
func (d *Doctor) wantedCheck(bs []backendState, asleep map[string]standbyEntry) api.DoctorCheck {
	if d.Gate != nil {
		st := d.Gate.State()
		switch {
		case st.NotServing != "":
			return notServingCheck(st.LastWanted, st.NotServing)
		case st.Phase == api.PhaseSwitching:
			return api.DoctorCheck{ID: "state.last_wanted", Severity: units.SeverityOK, Value: st.LastWanted,
				Message: SwitchingMessage(st) + ": the last wanted profile is " + st.LastWanted}
		case st.Paused != "" && st.LastWanted == "":
			return pausedCheck(st.Paused)
		}
	}
	return wantedCheck(d.Cfg, bs, asleep)
}

// activeBackend is the backend the endpoint checks ask: the daemon's
// active profile (with a Gate), else the one running unit not recorded in
// standby. Without one it says why, with the severity of that.
func (d *Doctor) activeBackend(bs []backendState, sf standbyFile) (*backendState, units.Severity, string) {
	if d.Gate != nil {
		st := d.Gate.State()
		switch st.Phase {
		case api.PhaseSwitching:
			return nil, units.SeverityOK, SwitchingMessage(st) + ": the endpoint checks run once it is active"
		case api.PhaseActive:
			for i := range bs {
				if bs[i].unit == st.Unit && bs[i].status.Active() {
					b := bs[i]
					if b.profile == "" {
						b.profile = st.Profile
					}
					return &b, "", ""
				}
			}
		}
	}
	active, _ := servingBackends(bs, sf.Units)
	switch {
	case len(active) == 0:
		return nil, units.SeverityOK, "no backend active; nothing to check"
	case len(active) > 1:
		return nil, units.SeverityWarn, "more than one backend serves (see units.exclusive); none probed"
	case active[0].status.ActiveState != "active":
		return nil, units.SeverityOK, fmt.Sprintf("%s is %s; the endpoint checks run once it is active", active[0].unit, active[0].status.ActiveState)
	}
	return &active[0], "", ""
}

// lease takes the probe lease of the daemon's Supervisor; without one (the
// CLI's local doctor: no daemon, so no switch) the probe runs on ctx.
func (d *Doctor) lease(ctx context.Context, profile string) (context.Context, func(), error) {
	if d.Gate == nil {
		return ctx, func() {}, nil
	}
	return d.Gate.LeaseProbe(ctx, profile)
}

// interrupted: the lease was revoked (a switch started) while the caller's
// own context still runs.
func (d *Doctor) interrupted(pctx, ctx context.Context) bool {
	return pctx.Err() != nil && ctx.Err() == nil
}

// interruptedCheck replaces a check that a starting switch cut short.
func (d *Doctor) interruptedCheck(c api.DoctorCheck) api.DoctorCheck {
	st := api.State{Phase: api.PhaseSwitching}
	if d.Gate != nil {
		st = d.Gate.State()
	}
	msg := "a switch started"
	if st.Phase == api.PhaseSwitching {
		msg = SwitchingMessage(st)
	}
	return api.DoctorCheck{ID: c.ID, Profile: c.Profile, Severity: units.SeverityOK,
		Message: "not checked: " + msg + " began during the probe, which was cut so it could not wake a backend going to standby"}
}

// logHint says where the unit's log is for the runner in use: the journal
// under systemd, the process runner's log file in the demo.
func logHint(cfg *config.Config, unit string) string {
	if cfg.Systemd.Runner == "process" {
		return "its log: " + processLogPath(cfg, unit) + " (the demo's process runner; no journal)"
	}
	return "its log: `journalctl -u " + unit + "`"
}

// restartHint says how to restart a backend with its profile's settings.
// A switch to the profile it already runs restarts nothing (it only checks
// it), and a switch away and back only puts it to sleep and wakes it, so
// neither is the advice. One in standby is stopped, so the next switch to
// it starts it cold.
func restartHint(cfg *config.Config, unit string, inStandby bool) string {
	switch {
	case cfg.Systemd.Runner == "process" && inStandby:
		return "restart `gpuhost demo`: its process runner starts the backends afresh"
	case cfg.Systemd.Runner == "process":
		return "restart `gpuhost demo` to start it afresh (a switch to the profile it runs only checks it)"
	case inStandby:
		return "`systemctl stop " + unit + "`: the next switch to its profile starts it cold"
	}
	return "`systemctl restart " + unit + "` restarts it (the daemon follows; a switch to the profile it runs only checks it)"
}

// ignoredDriftText names what gpuhost adds to a vLLM profile itself, which
// units.drift does not count.
func ignoredDriftText(p *units.Profile) string {
	added := units.AddedVLLMArgs(*p)
	if len(added) == 0 {
		return ""
	}
	return fmt.Sprintf(" (not counted, gpuhost adds them for standby: %s, and %s=1 in the environment)", strings.Join(added, " "), units.EnvVLLMDevMode)
}
