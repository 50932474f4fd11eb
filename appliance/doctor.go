package appliance

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"gpuhost/api"
	"gpuhost/config"
	"gpuhost/nvml"
	"gpuhost/systemd"
	"gpuhost/units"
)

// MinDriverMajor is the oldest driver that runs the CUDA 13 builds of recent
// vLLM wheels (CUDA 13 needs ≥ 580). On the reference box 535 → 610 made
// prefill 3.5× faster.
const MinDriverMajor = 580

// Doctor runs every check it can; a component that cannot be reached turns
// into a failing check rather than an error, so the report is always whole.
type Doctor struct {
	Cfg   *config.Config
	GPU   GPU   // nil: NVML unavailable (GPUErr says why)
	Units Units // nil: systemd unreachable (UnitsErr says why)

	GPUErr   error
	UnitsErr error
	Profile  string // only this profile ("" = all)
	// Telegram reports the daemon's bot (Supervisor.TelegramStatus) for
	// the telegram.bot check; nil, or a nil result, means no check (the
	// CLI's local doctor, or telegram.enabled false).
	Telegram func() *api.TelegramStatus
	// Exclusion reports the daemon's standby watcher (Supervisor.Exclusion)
	// for the standby.exclusion check; nil: no check (the CLI's doctor).
	Exclusion func() (violations uint64, last time.Time, lastMsg string)
	// Gate is the daemon's Supervisor: the endpoint checks run on its
	// active profile under a probe lease (probelease.go) and say
	// "switching to …" while a switch runs. nil (the CLI's local doctor,
	// no daemon): the active backend is the running unit that standby.json
	// does not record in standby.
	Gate ProbeGate
	// Watcher reports verified wakes and drift (doctor_wake.go); nil: no
	// such checks.
	Watcher Watcher
	// LaneGate is the probe gate of one lane on a box whose profiles run
	// on several GPU sets (the Box's engine of that lane); nil: Gate for
	// every lane.
	LaneGate func(config.Lane) ProbeGate
}

// ProbeGate is what the doctor needs of the Supervisor so that its probes
// never collide with a switch.
type ProbeGate interface {
	State() api.State
	LeaseProbe(ctx context.Context, profile string) (context.Context, func(), error)
}

// Run executes the checks.
func (d *Doctor) Run(ctx context.Context) api.DoctorReport {
	t0 := time.Now()
	var checks []api.DoctorCheck
	add := func(c api.DoctorCheck) { checks = append(checks, c) }

	// GPU and driver.
	gpuChecks, snap, haveGPU := d.gpuChecks(ctx)
	checks = append(checks, gpuChecks...)
	dev, _ := snap.Device0()

	// Profiles: the known-good settings rules.
	facts := units.GPUFacts{}
	if haveGPU {
		facts = units.GPUFacts{TotalMiB: dev.MemoryTotalMiB, Name: dev.Name}
	}
	// What the daemon's Supervisor persisted about standby: the residuals
	// the other backend keeps while it sleeps, and who sleeps now.
	sf := readStandbyFile(d.Cfg, discardLog)
	for _, name := range d.Cfg.ProfileNames() {
		if d.Profile != "" && name != d.Profile {
			continue
		}
		p := d.Cfg.Profiles[name]
		pf := facts
		if haveGPU {
			pf.ReservedMiB = reservedMiB(d.Cfg, sf.ResidualMiB, p)
			if fd, ok := fitDevice(p, snap); ok {
				pf.TotalMiB, pf.Name, pf.Count = fd.MemoryTotalMiB, fd.Name, len(p.GPUs.Resolved())
			}
			checks = append(checks, placementChecks(p, snap)...)
		}
		checks = append(checks, d.hostRAMCheck(ctx, p)...)
		for _, c := range append(units.ProfileChecks(*p, pf, *d.Cfg.Policy), modelCacheCheck(ctx, d.Cfg, d.Units, p)) {
			add(api.DoctorCheck{ID: c.ID, Severity: c.Severity, Profile: name, Message: c.Message, Fix: c.Fix, Value: c.Value})
		}
	}
	if d.Profile == "" {
		for _, c := range networkChecks(d.Cfg) {
			add(api.DoctorCheck{ID: c.ID, Severity: c.Severity, Message: c.Message, Fix: c.Fix, Value: c.Value})
		}
	}

	// Units: Conflicts both ways, exclusivity, drift, foreign GPU processes.
	if d.Units == nil {
		add(api.DoctorCheck{ID: "units.systemd", Severity: units.SeverityFail, Message: "systemd not reachable: " + errText(d.UnitsErr),
			Fix: "run as root on a systemd host, or set systemd.socket in the config"})
	} else {
		checks = append(checks, d.laneUnitChecks(ctx, sf, snap, haveGPU)...)
	}
	if d.Telegram != nil && d.Profile == "" {
		if st := d.Telegram(); st != nil {
			checks = append(checks, telegramCheck(st, time.Now()))
		}
	}
	checks = append(checks, d.watchChecks()...)
	rep := api.DoctorReport{Checks: checks, Worst: string(units.SeverityOK), TookMS: float64(time.Since(t0).Microseconds()) / 1000}
	for _, c := range checks {
		switch c.Severity {
		case units.SeverityFail:
			rep.Worst, rep.Exit = string(units.SeverityFail), api.DoctorExitFail
		case units.SeverityWarn:
			if rep.Worst != string(units.SeverityFail) {
				rep.Worst = string(units.SeverityWarn)
			}
		}
	}
	return rep
}

// laneUnitChecks runs the unit checks of every lane (a box of one lane:
// the config's two units) with the lane's own config and probe gate, and
// the foreign-process check once over every lane's units and every GPU.
func (d *Doctor) laneUnitChecks(ctx context.Context, sf standbyFile, snap nvml.Snapshot, haveGPU bool) []api.DoctorCheck {
	var all []backendState
	var out []api.DoctorCheck
	limits := map[string]uint64{} // unit → what it may hold on a GPU (its residual when in standby)
	lanes := d.Cfg.Lanes()
	for _, l := range lanes {
		ld := *d
		ld.Cfg = d.Cfg.LaneConfig(l)
		lsf := sf
		if len(lanes) > 1 {
			lsf = readStandbyFile(ld.Cfg, discardLog)
			if d.LaneGate != nil {
				ld.Gate = d.LaneGate(l)
			}
		}
		sup := &Supervisor{cfg: ld.Cfg, units: d.Units, log: discardLog}
		bs, err := sup.backends(ctx)
		if err != nil {
			out = append(out, api.DoctorCheck{ID: "units.systemd", Severity: units.SeverityFail, Message: err.Error(), Fix: "check `systemctl status`"})
			continue
		}
		all = append(all, bs...)
		for _, b := range bs {
			limits[b.unit] = residualToleranceMiB
			if e, ok := lsf.Units[b.unit]; ok {
				limits[b.unit] += lsf.ResidualMiB[e.Profile]
			}
		}
		out = append(out, unitChecks(ld.Cfg, bs, lsf.Units)...)
		if haveGPU {
			out = append(out, pinningChecks(ld.Cfg, bs, snap)...)
		}
		out = append(out, ld.standbyChecks(ctx, bs, lsf, snap, haveGPU)...)
		out = append(out, ld.wantedCheck(bs, lsf.Units))
		out = append(out, ld.endpointChecks(ctx, bs, lsf)...)
	}
	if haveGPU && len(all) > 0 {
		out = append(out, foreignProcessCheck(snap.Devices, all))
		if len(lanes) > 1 {
			out = append(out, perGPUExclusionCheck(snap.Devices, all, limits))
		}
	}
	return out
}

// perGPUExclusionCheck is the exclusion rule on a box of several lanes, as
// NVML shows it now: on each GPU at most one backend unit holds memory
// above its residual (in standby) or the tolerance.
func perGPUExclusionCheck(devs []nvml.Device, bs []backendState, limits map[string]uint64) api.DoctorCheck {
	c := api.DoctorCheck{ID: "gpus.exclusive", Severity: units.SeverityOK}
	var bad, fine []string
	for _, d := range devs {
		var above []string
		for _, b := range bs {
			if !b.status.Active() {
				continue
			}
			if used := unitUsedMiB(d, b.status); used > limits[b.unit] {
				above = append(above, fmt.Sprintf("%s (%s) %d MiB", b.unit, orDash(b.profile), used))
			}
		}
		switch {
		case len(above) > 1:
			bad = append(bad, fmt.Sprintf("GPU %d: %s", d.Index, strings.Join(above, ", ")))
		case len(above) == 1:
			fine = append(fine, fmt.Sprintf("GPU %d: %s", d.Index, above[0]))
		default:
			fine = append(fine, fmt.Sprintf("GPU %d: none", d.Index))
		}
	}
	c.Value = fmt.Sprint(len(bad))
	if len(bad) > 0 {
		c.Severity, c.Message = units.SeverityFail, "two backends hold memory above their residual on one GPU: "+strings.Join(bad, "; ")
		c.Fix = "stop one of them: `gpuhost switch PROFILE` on the GPU's lane (gpuhost's watcher stops the one whose lane did not claim the GPU)"
		return c
	}
	c.Message = "at most one backend above its residual on each GPU (" + strings.Join(fine, "; ") + ")"
	return c
}

// gpuChecks are the driver's view: NVML reachable, the driver, every GPU;
// haveGPU is false when there is no GPU to judge profiles by.
func (d *Doctor) gpuChecks(ctx context.Context) (checks []api.DoctorCheck, snap nvml.Snapshot, haveGPU bool) {
	add := func(c api.DoctorCheck) { checks = append(checks, c) }
	if d.GPU == nil {
		add(api.DoctorCheck{ID: "gpu.nvml", Severity: units.SeverityFail, Message: "NVML not reachable: " + errText(d.GPUErr),
			Fix: "install the NVIDIA driver (libnvidia-ml.so.1) and check `nvidia-smi`; gpuhost must be built with cgo"})
		return checks, nvml.Snapshot{}, false
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	s, err := d.GPU.Snapshot(cctx)
	cancel()
	if err != nil {
		add(api.DoctorCheck{ID: "gpu.nvml", Severity: units.SeverityFail, Message: "NVML query failed: " + err.Error(), Fix: "check `nvidia-smi`"})
		return checks, nvml.Snapshot{}, false
	}
	dev, ok := s.Device0()
	if !ok {
		add(api.DoctorCheck{ID: "gpu.nvml", Severity: units.SeverityFail, Message: "NVML reports no GPU", Fix: "check `nvidia-smi -L`"})
		return checks, nvml.Snapshot{}, false
	}
	add(api.DoctorCheck{ID: "gpu.nvml", Severity: units.SeverityOK, Value: s.Backend,
		Message: fmt.Sprintf("%s via %s: %s, %d MiB, %.0f GB/s", dev.Name, s.Backend, dev.UUID, dev.MemoryTotalMiB, dev.BandwidthGBs)})
	add(driverCheck(s.DriverVersion, s.CUDADriverVersion))
	return append(checks, deviceChecks(s)...), s, true
}

func errText(err error) string {
	if err == nil {
		return "not configured"
	}
	return err.Error()
}

func driverCheck(version, cuda string) api.DoctorCheck {
	c := api.DoctorCheck{ID: "gpu.driver", Value: version}
	major, err := nvml.DriverMajor(version)
	switch {
	case err != nil:
		c.Severity, c.Message = units.SeverityFail, fmt.Sprintf("cannot read driver version %q: %v", version, err)
		c.Fix = "check `nvidia-smi`"
	case major < MinDriverMajor:
		c.Severity = units.SeverityFail
		c.Message = fmt.Sprintf("driver %s (CUDA %s) is older than %d: CUDA 13 builds of vLLM will not start", version, cuda, MinDriverMajor)
		c.Fix = fmt.Sprintf("install driver ≥ %d (on the reference box 535 → 610 made prefill 3.5× and decode 24%% faster)", MinDriverMajor)
	default:
		c.Severity = units.SeverityOK
		c.Message = fmt.Sprintf("driver %s, CUDA %s (≥ %d)", version, cuda, MinDriverMajor)
	}
	return c
}

func unitChecks(cfg *config.Config, bs []backendState, asleep map[string]standbyEntry) []api.DoctorCheck {
	var out []api.DoctorCheck
	standby := cfg.StandbyUsed()
	// Conflicts= both ways.
	for i, b := range bs {
		if len(bs) != 2 {
			break // a lane with one backend's profiles has one unit: nothing to conflict with in it
		}
		other := bs[1-i].unit
		c := api.DoctorCheck{ID: "units.conflicts", Value: strings.Join(b.status.Conflicts, " ")}
		switch {
		case b.status.LoadState != "" && b.status.LoadState != "loaded":
			c.Severity = units.SeverityFail
			c.Message = fmt.Sprintf("%s is %s", b.unit, b.status.LoadState)
			c.Fix = "run `gpuhost units install` (or `--adopt` for existing units)"
		case standby && slices.Contains(b.status.Conflicts, other):
			c.Severity = units.SeverityWarn
			c.Message = fmt.Sprintf("%s has Conflicts=%s although profiles use standby: starting one backend stops the other instead of letting it sleep", b.unit, other)
			c.Fix = "run `gpuhost units install` to render the units for standby"
		case standby:
			c.Severity = units.SeverityOK
			c.Message = fmt.Sprintf("%s has no Conflicts=%s: profiles use standby, gpuhost enforces one VRAM holder", b.unit, other)
		case slices.Contains(b.status.Conflicts, other):
			c.Severity = units.SeverityOK
			c.Message = fmt.Sprintf("%s has Conflicts=%s", b.unit, other)
		default:
			c.Severity = units.SeverityFail
			c.Message = fmt.Sprintf("%s lacks Conflicts=%s (has %q): `systemctl start` could run both backends", b.unit, other, c.Value)
			c.Fix = "run `gpuhost units install` (adopted units get a 10-gpuhost.conf drop-in)"
		}
		out = append(out, c)
	}
	// At most one backend active; one in standby does not count.
	var active, sleeping []string
	serving, asleepBs := servingBackends(bs, asleep)
	for _, b := range asleepBs {
		e := asleep[b.unit]
		sleeping = append(sleeping, fmt.Sprintf("%s (%s, %s)", b.unit, e.Profile, e.Mode))
	}
	for _, b := range serving {
		active = append(active, fmt.Sprintf("%s (%s)", b.unit, b.status.ActiveState))
	}
	ex := api.DoctorCheck{ID: "units.exclusive", Value: fmt.Sprint(len(active))}
	if len(active) > 1 {
		ex.Severity, ex.Message = units.SeverityFail, "more than one backend active: "+strings.Join(active, ", ")
		ex.Fix = "stop one of them: `gpuhost switch PROFILE`"
	} else {
		ex.Severity, ex.Message = units.SeverityOK, fmt.Sprintf("%d backend active %v", len(active), active)
		if len(sleeping) > 0 {
			ex.Message += "; in standby: " + strings.Join(sleeping, ", ")
		}
	}
	out = append(out, ex)
	// Drift: live flags of the running vLLM unit against its profile.
	for _, b := range bs {
		if !b.status.Active() || b.backend != units.VLLM || b.status.MainPID <= 0 {
			continue
		}
		dc := api.DoctorCheck{ID: "units.drift", Profile: b.profile}
		p, ok := cfg.Profiles[b.profile]
		argv, err := cmdlineWithRetry(b.status.MainPID)
		switch {
		case !ok:
			dc.Severity = units.SeverityWarn
			dc.Message = fmt.Sprintf("%s runs profile %q which is not in the config", b.unit, b.profile)
			dc.Fix = "switch to a configured profile: `gpuhost switch PROFILE`"
		case err != nil:
			dc.Severity, dc.Message = units.SeverityWarn, fmt.Sprintf("cannot read the command line of %s (pid %d): %v", b.unit, b.status.MainPID, err)
		default:
			live, perr := units.ParseVLLMArgv(argv)
			if perr != nil {
				dc.Severity, dc.Message = units.SeverityWarn, fmt.Sprintf("cannot parse the command line of %s: %v", b.unit, perr)
				break
			}
			// What gpuhost adds itself is wanted, not drift.
			want := *p
			want.VLLM.ExtraArgs = append(units.AddedVLLMArgs(*p), p.VLLM.ExtraArgs...)
			diffs := units.Drift(want, live)
			if len(diffs) == 0 {
				dc.Severity, dc.Message = units.SeverityOK, fmt.Sprintf("%s (pid %d) runs with the flags of profile %s%s", b.unit, b.status.MainPID, p.Name, ignoredDriftText(p))
				break
			}
			var ds []string
			for _, df := range diffs {
				ds = append(ds, fmt.Sprintf("%s: want %s, live %s", df.Flag, df.Want, df.Live))
			}
			dc.Severity = units.SeverityWarn
			dc.Message = fmt.Sprintf("%s runs with flags that differ from profile %s: %s%s", b.unit, p.Name, strings.Join(ds, "; "), ignoredDriftText(p))
			_, inStandby := asleep[b.unit]
			dc.Fix = "the flags change only when it starts again: " + restartHint(cfg, b.unit, inStandby)
		}
		out = append(out, dc)
	}
	return out
}

// ownProcessesMessage is the ok message of gpu.foreign_processes for n
// GPU processes, all in the active backend unit.
func ownProcessesMessage(n int) string {
	switch n {
	case 0:
		return "no GPU processes"
	case 1:
		return "1 GPU process, in the active backend unit"
	}
	return fmt.Sprintf("%d GPU processes, all in the active backend unit", n)
}

func foreignProcessCheck(devs []nvml.Device, bs []backendState) api.DoctorCheck {
	var active []backendState
	for _, b := range bs {
		if b.status.Active() {
			active = append(active, b)
		}
	}
	var foreign []string
	activeUnits := statuses(active)
	n := 0
	for _, dev := range devs {
		n += len(dev.Processes)
		for _, p := range dev.Processes {
			if !systemd.InUnits(p.PID, activeUnits...) {
				where := ""
				if len(devs) > 1 {
					where = fmt.Sprintf(" on GPU %d", dev.Index)
				}
				foreign = append(foreign, fmt.Sprintf("pid %d (%s) %d MiB%s", p.PID, p.Name, p.UsedMiB, where))
			}
		}
	}
	sort.Strings(foreign)
	c := api.DoctorCheck{ID: "gpu.foreign_processes", Value: fmt.Sprint(len(foreign))}
	if len(foreign) > 0 {
		c.Severity = units.SeverityFail
		c.Message = "GPU memory held by processes outside the backend units: " + strings.Join(foreign, ", ")
		c.Fix = "stop them; gpuhost must be the only user of the GPU"
	} else {
		c.Severity = units.SeverityOK
		c.Message = ownProcessesMessage(n)
	}
	return c
}

// cmdlineWithRetry reads a process's command line, retrying briefly: right
// after a start the kernel can show it empty for a moment.
func cmdlineWithRetry(pid int) ([]string, error) {
	var err error
	for i := 0; i < 5; i++ {
		var argv []string
		if argv, err = systemd.CmdlineOf(pid); err == nil {
			return argv, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil, err
}
