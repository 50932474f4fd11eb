package appliance

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"gpuhost/api"
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

// standbyChecks: every backend in standby at or below its residual, and
// (in the daemon) no standby backend found above it within the last hour.
func (d *Doctor) standbyChecks(bs []backendState, sf standbyFile, dev nvml.Device, haveGPU bool) []api.DoctorCheck {
	var out []api.DoctorCheck
	if haveGPU && len(sf.Units) > 0 {
		c := api.DoctorCheck{ID: "standby.residual", Severity: units.SeverityOK}
		var msgs []string
		for _, b := range bs {
			e, ok := sf.Units[b.unit]
			if !ok || !b.status.Active() {
				continue
			}
			used, res := unitUsedMiB(dev, b.status), sf.ResidualMiB[e.Profile]
			msgs = append(msgs, fmt.Sprintf("%s (%s, %s) holds %d MiB, residual %d", b.unit, e.Profile, e.Mode, used, res))
			if used > res+residualToleranceMiB {
				c.Severity = units.SeverityFail
				c.Fix = "the daemon puts it back into standby within gpu.standby_watch_interval; if this persists, `gpuhost switch` to it or stop it"
			}
		}
		c.Message = strings.Join(msgs, "; ")
		if c.Message != "" {
			out = append(out, c)
		}
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
