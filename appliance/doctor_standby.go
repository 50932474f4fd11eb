package appliance

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"gpuhost/api"
	"gpuhost/backend"
	"gpuhost/config"
	"gpuhost/nvml"
	"gpuhost/units"
)

var discardLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// exclusionWindow is how long a standby backend found above its residual
// keeps the doctor's standby.exclusion check failing.
const exclusionWindow = time.Hour

// reservedMiB is what p cannot have on the card while the other backend is
// in standby: the largest measured residual among the other backend's
// profiles with standby (0 when none is known or none uses standby).
func reservedMiB(cfg *config.Config, residuals map[string]uint64, p *units.Profile) uint64 {
	var out uint64
	for name, op := range cfg.Profiles {
		if op == nil || op.Backend == p.Backend || !op.StandbyEnabled() {
			continue
		}
		out = max(out, residuals[name])
	}
	return out
}

// hostRAMCheck says whether sleep level 1 can hold p's weights in host RAM
// now (vLLM profiles with standby sleep1 or auto and known model_params).
func (d *Doctor) hostRAMCheck(ctx context.Context, p *units.Profile) []api.DoctorCheck {
	if p.Backend != units.VLLM || (p.Standby != units.StandbySleep1 && p.Standby != units.StandbyAuto) ||
		p.Params.TotalParamsB == 0 || p.Params.WeightBits == 0 {
		return nil
	}
	s := &Supervisor{cfg: d.Cfg, gpu: d.GPU, log: discardLog}
	w, _ := s.weightsMiB(p, 0)
	need := w + max(hostMarginMiB, w/10)
	c := api.DoctorCheck{ID: "standby.host_ram", Profile: p.Name}
	avail, err := s.hostAvailableMiB(ctx)
	switch {
	case err != nil:
		c.Severity, c.Message = units.SeverityWarn, "host memory unknown: "+err.Error()+"; standby sleeps at level 2"
	case avail >= need:
		c.Severity = units.SeverityOK
		c.Message = fmt.Sprintf("sleep level 1 fits: %.1f GiB of weights (+%.1f GiB margin), %.1f GiB available", float64(w)/1024, float64(need-w)/1024, float64(avail)/1024)
	case p.Standby == units.StandbySleep1:
		c.Severity = units.SeverityWarn
		c.Message = fmt.Sprintf("sleep level 1 needs %.1f GiB of host RAM, %.1f GiB available: the switch sleeps at level 2 instead", float64(need)/1024, float64(avail)/1024)
		c.Fix = "free host memory, or set standby: sleep2 (or auto) to say so"
	default:
		c.Severity = units.SeverityOK
		c.Message = fmt.Sprintf("auto sleeps at level 2 now: %.1f GiB needed for level 1, %.1f GiB available", float64(need)/1024, float64(avail)/1024)
	}
	c.Value = fmt.Sprintf("%d/%d MiB", need, avail)
	return []api.DoctorCheck{c}
}

// servingBackends splits the running backend units into those that serve
// (or start) and those in standby as recorded (the same profile still runs
// in the unit). units.exclusive, state.last_wanted and the endpoint checks
// all count with it, so they agree.
func servingBackends(bs []backendState, asleep map[string]standbyEntry) (serving, inStandby []backendState) {
	for _, b := range bs {
		if !b.status.Active() {
			continue
		}
		if e, ok := asleep[b.unit]; ok && b.profile == e.Profile {
			inStandby = append(inStandby, b)
			continue
		}
		serving = append(serving, b)
	}
	return serving, inStandby
}

// standbyChecks gives every backend in standby its own checks (asleep as
// recorded, at or below its residual, the residual plausible) and, in the
// daemon, says whether the watcher found one above its residual lately.
// During a switch a backend may be on its way into or out of standby, so
// the per-backend checks wait for its end.
func (d *Doctor) standbyChecks(ctx context.Context, bs []backendState, sf standbyFile, snap nvml.Snapshot, haveGPU bool) []api.DoctorCheck {
	dev, _ := snap.Device0()
	var out []api.DoctorCheck
	_, asleep := servingBackends(bs, sf.Units)
	var st api.State
	if d.Gate != nil {
		st = d.Gate.State()
	}
	for _, b := range asleep {
		e := sf.Units[b.unit]
		if d.Profile != "" && e.Profile != d.Profile {
			continue
		}
		if st.Phase == api.PhaseSwitching {
			out = append(out, api.DoctorCheck{ID: "standby.asleep", Profile: e.Profile, Severity: units.SeverityOK,
				Message: SwitchingMessage(st) + ": " + b.unit + "'s standby is checked once it ends"})
			continue
		}
		out = append(out, d.asleepCheck(ctx, b, e))
		res, known := sf.ResidualMiB[e.Profile]
		if haveGPU {
			out = append(out, residualCheck(d.Cfg, b, e, unitUsedOn(snap.Devices, b.status), res, known))
		}
		out = append(out, d.plausibleCheck(b, e, res, known, dev, haveGPU))
	}
	if d.Exclusion != nil {
		n, last, msg := d.Exclusion()
		c := api.DoctorCheck{ID: "standby.exclusion", Value: fmt.Sprint(n), Severity: units.SeverityOK,
			Message: "no backend in standby has held more than its residual"}
		if n > 0 && time.Since(last) < exclusionWindow {
			c.Severity = units.SeverityFail
			c.Message = fmt.Sprintf("%d time(s) a backend in standby held more than its residual; last %s ago: %s", n, time.Since(last).Round(time.Second), msg)
			c.Fix = "something woke a sleeping backend behind gpuhost (a hand `wake_up`, a client talking to the backend's port): find it"
		} else if n > 0 {
			c.Message = fmt.Sprintf("%d time(s) since start, the last over an hour ago: %s", n, msg)
		}
		out = append(out, c)
	}
	return out
}

// asleepCheck asks the engine whether the backend is in standby as
// recorded: vLLM's /is_sleeping, Ollama's /api/ps without the model. Both
// only read; neither wakes it.
func (d *Doctor) asleepCheck(ctx context.Context, b backendState, e standbyEntry) api.DoctorCheck {
	c := api.DoctorCheck{ID: "standby.asleep", Profile: e.Profile, Value: string(e.Mode)}
	p := d.Cfg.Profiles[e.Profile]
	sup := &Supervisor{cfg: d.Cfg, client: backendClient(d.Cfg), engines: backend.Engines(), log: discardLog}
	be, err := sup.engineOf(p)
	sl, ok := be.(backend.Sleeper)
	if err != nil || !ok {
		c.Severity, c.Message = units.SeverityWarn, fmt.Sprintf("%s is recorded in standby (%s) but its engine has no standby to ask", b.unit, e.Mode)
		return c
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	what := "asleep"
	if e.Mode == units.StandbyUnload {
		what = "unloaded"
	}
	since := ""
	if !e.Since.IsZero() {
		since = fmt.Sprintf(" since %s", e.Since.UTC().Format(time.RFC3339))
	}
	switch sleeping, err := sl.Sleeping(cctx); {
	case err != nil:
		c.Severity = units.SeverityWarn
		c.Message = fmt.Sprintf("%s (%s) is recorded in standby (%s) but does not say whether it is %s: %v", b.unit, e.Profile, e.Mode, what, err)
		c.Fix = logHint(d.Cfg, b.unit)
	case !sleeping:
		c.Severity = units.SeverityFail
		c.Message = fmt.Sprintf("%s (%s) is recorded in standby (%s) but is not %s: something woke it behind gpuhost", b.unit, e.Profile, e.Mode, what)
		c.Fix = "the daemon puts it back into standby within gpu.standby_watch_interval; if this persists, find who talks to its port, or " + restartHint(d.Cfg, b.unit, true)
	default:
		c.Severity = units.SeverityOK
		c.Message = fmt.Sprintf("%s (%s) is %s as recorded (%s%s)", b.unit, e.Profile, what, e.Mode, since)
	}
	return c
}

// residualCheck: the backend holds at most its measured residual (+ the
// measurement tolerance).
func residualCheck(cfg *config.Config, b backendState, e standbyEntry, used, res uint64, known bool) api.DoctorCheck {
	c := api.DoctorCheck{ID: "standby.residual", Profile: e.Profile, Value: fmt.Sprint(used), Severity: units.SeverityOK}
	switch {
	case !known:
		c.Severity = units.SeverityWarn
		c.Message = fmt.Sprintf("%s (%s, %s) holds %d MiB; no residual measured for %s", b.unit, e.Profile, e.Mode, used, e.Profile)
		c.Fix = "the residual is measured at the profile's first sleep; switching to it and away measures it again"
	case used > res+residualToleranceMiB:
		c.Severity = units.SeverityFail
		c.Message = fmt.Sprintf("%s (%s, %s) holds %d MiB, above its residual %d MiB (+%d)", b.unit, e.Profile, e.Mode, used, res, residualToleranceMiB)
		c.Fix = "the daemon puts it back into standby within gpu.standby_watch_interval; if this persists, `gpuhost switch` to it or " + restartHint(cfg, b.unit, true)
	default:
		c.Message = fmt.Sprintf("%s (%s, %s) holds %d MiB, at or below its residual %d MiB", b.unit, e.Profile, e.Mode, used, res)
	}
	return c
}

// plausibleResidual is the most a backend may keep in standby before its
// measured residual itself is suspect: an idle `ollama serve` keeps no
// runner on the GPU, and a vLLM asleep keeps its CUDA context and
// allocator pools, not its weights (vLLM 32714: a release whose residual
// went from ~1.1 GB to 16 GB). The limit is half the profile's weights
// when known, else a quarter of the card; 0 when neither is known.
func plausibleResidual(cfg *config.Config, p *units.Profile, mode units.Standby, totalMiB uint64) (uint64, string) {
	if mode == units.StandbyUnload {
		return 1024, "an idle Ollama keeps no model on the GPU"
	}
	s := &Supervisor{cfg: cfg, log: discardLog}
	if w, _ := s.weightsMiB(p, 0); w > 0 {
		return w / 2, fmt.Sprintf("half of the profile's ~%d MiB of weights", w)
	}
	if totalMiB > 0 {
		return totalMiB / 4, fmt.Sprintf("a quarter of the card's %d MiB", totalMiB)
	}
	return 0, ""
}

// plausibleCheck says whether the recorded residual is one a sleeping
// backend can have: the residual check above trusts it, so a residual
// measured while something else was wrong would hide a backend that
// never really slept.
func (d *Doctor) plausibleCheck(b backendState, e standbyEntry, res uint64, known bool, dev nvml.Device, haveGPU bool) api.DoctorCheck {
	c := api.DoctorCheck{ID: "standby.residual_plausible", Profile: e.Profile, Value: fmt.Sprint(res), Severity: units.SeverityOK}
	var total uint64
	if haveGPU {
		total = dev.MemoryTotalMiB
	}
	limit, why := plausibleResidual(d.Cfg, d.Cfg.Profiles[e.Profile], e.Mode, total)
	switch {
	case !known:
		c.Value = ""
		c.Message = fmt.Sprintf("no residual recorded for %s yet", e.Profile)
	case limit == 0:
		c.Message = fmt.Sprintf("residual %d MiB (no limit known: neither model_params nor the card's size)", res)
	case res > limit:
		c.Severity = units.SeverityWarn
		c.Message = fmt.Sprintf("the recorded residual of %s, %d MiB, is above %d MiB (%s): %s may not really sleep", e.Profile, res, limit, why, b.unit)
		c.Fix = "remove its entry under residual_mib in " + standbyPath(d.Cfg) + " so the next sleep measures it again, and check the engine's release notes for sleep-mode regressions"
	default:
		c.Message = fmt.Sprintf("residual %d MiB, within %d MiB (%s)", res, limit, why)
	}
	return c
}
