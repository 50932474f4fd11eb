package metrics

import (
	"context"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"gpuhost/api"
	"gpuhost/nvml"
	"gpuhost/units"
)

// dcgmLabels are the labels dcgm-exporter puts on its GPU series, in its
// order. Its pci_bus_id label is left out because gpuhost's NVML snapshot
// does not carry the bus id; dashboards key on gpu, UUID and Hostname.
var dcgmLabels = []string{"gpu", "UUID", "device", "modelName", "Hostname"}

// dcgmGauge is one GPU series: dcgm-exporter's field name and HELP text (from
// its etc/default-counters.csv), the nvml.Device field it is read from (its
// JSON name, which is also the key of Device.FactErrors) and the reader.
type dcgmGauge struct {
	desc  *prometheus.Desc
	fact  string
	value func(nvml.Device) float64
}

func newDCGMGauge(name, help, fact string, value func(nvml.Device) float64) dcgmGauge {
	return dcgmGauge{desc: prometheus.NewDesc(name, help, dcgmLabels, nil), fact: fact, value: value}
}

// dcgmGauges are the gauges of dcgm-exporter's default set that NVML gives
// gpuhost. Memory is in MiB and power in W, as DCGM reports them.
var dcgmGauges = []dcgmGauge{
	newDCGMGauge("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "sm_clock_mhz",
		func(d nvml.Device) float64 { return float64(d.SMClockMHz) }),
	newDCGMGauge("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", "mem_clock_mhz",
		func(d nvml.Device) float64 { return float64(d.MemClockMHz) }),
	newDCGMGauge("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "temperature_c",
		func(d nvml.Device) float64 { return float64(d.TemperatureC) }),
	newDCGMGauge("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "power_w",
		func(d nvml.Device) float64 { return d.PowerW }),
	newDCGMGauge("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "utilization_gpu",
		func(d nvml.Device) float64 { return float64(d.UtilizationGPU) }),
	newDCGMGauge("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", "utilization_memory",
		func(d nvml.Device) float64 { return float64(d.UtilizationMemory) }),
	newDCGMGauge("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "memory_free_mib",
		func(d nvml.Device) float64 { return float64(d.MemoryFreeMiB) }),
	newDCGMGauge("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "memory_used_mib",
		func(d nvml.Device) float64 { return float64(d.MemoryUsedMiB) }),
}

// gpuhost's scrape-time series.
var (
	gpuHeldDesc = prometheus.NewDesc("gpuhost_gpu_memory_held_bytes",
		"GPU memory held by each backend unit on each GPU (labels gpu and UUID as dcgm-exporter's); unit and profile empty for a process that is not gpuhost's.",
		[]string{"gpu", "UUID", "unit", "profile"}, nil)
	gpuUpDesc = prometheus.NewDesc("gpuhost_gpu_up",
		"1 when the last GPU snapshot (NVML or the simulator) succeeded, 0 when it failed; the DCGM_FI_* series are absent then.",
		nil, nil)
	activeProfileDesc = prometheus.NewDesc("gpuhost_active_profile_info",
		"The profile whose backend serves /v1 (always 1; absent while idle, switching or failed).",
		[]string{"profile", "backend", "unit", "served_name"}, nil)
	standbyDesc = prometheus.NewDesc("gpuhost_backend_standby_info",
		"A backend kept running in standby (vLLM asleep, Ollama unloaded), ready to wake instead of a cold start (always 1; absent when none is).",
		[]string{"profile", "unit", "mode"}, nil)
	standbyResidualDesc = prometheus.NewDesc("gpuhost_backend_standby_residual_bytes",
		"The GPU memory a backend in standby may hold: its residual as NVML measured it at the profile's first sleep (0 before it was measured).",
		[]string{"profile", "unit"}, nil)
	servingWantedDesc = prometheus.NewDesc("gpuhost_serving_wanted",
		"1 while the last wanted profile serves (or nothing is wanted, or a switch runs), 0 while it does not: a crash loop, a failed switch, nothing running although a profile is wanted; /api/status's state.not_serving says why.",
		nil, nil)
	stateDesc = prometheus.NewDesc("gpuhost_state",
		"The Supervisor's phase: 1 for the current one (idle, switching, active, failed), 0 for the others.",
		[]string{"phase"}, nil)
	unitStateDesc = prometheus.NewDesc("gpuhost_backend_unit_state",
		"systemd ActiveState of each backend unit: 1 for the current state, 0 for the others.",
		[]string{"unit", "state"}, nil)
	doctorCheckDesc = prometheus.NewDesc("gpuhost_doctor_check_status",
		"Result of each doctor check (see `gpuhost doctor`): 1 for its current severity (ok, warn, fail), 0 for the others. Checks with the same id and profile are merged to the worst.",
		[]string{"id", "profile", "severity"}, nil)
	doctorRunDesc = prometheus.NewDesc("gpuhost_doctor_last_run_timestamp_seconds",
		"Unix time of the doctor run that gpuhost_doctor_check_status shows (the doctor runs in the background).",
		nil, nil)
	telegramUpDesc = prometheus.NewDesc("gpuhost_telegram_up",
		"1 while the Telegram bot is polling the Bot API, 0 while it is starting, backing off or stopped (absent when telegram.enabled is false).",
		nil, nil)
	telegramStateDesc = prometheus.NewDesc("gpuhost_telegram_state",
		"The Telegram bot's state: 1 for the current one (starting, polling, backing_off, stopped), 0 for the others.",
		[]string{"state"}, nil)
	telegramErrorsDesc = prometheus.NewDesc("gpuhost_telegram_errors_total",
		"Failed Telegram Bot API calls since the daemon started, by kind (unauthorized, rate_limited, conflict, server, network, invalid_response, bad_request, other).",
		[]string{"kind"}, nil)
	telegramSkippedDesc = prometheus.NewDesc("gpuhost_telegram_updates_skipped_total",
		"Telegram updates the bot could not decode and skipped.",
		nil, nil)
	telegramDroppedDesc = prometheus.NewDesc("gpuhost_telegram_notifications_dropped_total",
		"Telegram notifications given up on (queue full, or every retry failed).",
		nil, nil)
)

// telegramStates are the bot's states, always emitted by gpuhost_telegram_state.
var telegramStates = []string{api.TelegramStarting, api.TelegramPolling, api.TelegramBackingOff, api.TelegramStopped}

// phases and unitStates enumerate the values the state-set series always
// carry, so that a series exists (with 0) before its state first happens.
var (
	phases = []api.Phase{api.PhaseIdle, api.PhaseSwitching, api.PhaseActive, api.PhaseFailed}
	// unitStates are systemd's ActiveState values.
	unitStates = []string{"active", "reloading", "inactive", "failed", "activating", "deactivating", "maintenance", "refreshing"}
	severities = []units.Severity{units.SeverityOK, units.SeverityWarn, units.SeverityFail}
)

// scrapeCollector reads the Supervisor and the GPU when Prometheus scrapes.
//
// Locking: it calls only Supervisor.Status, which copies the state under the
// Supervisor's short state lock and does the GPU snapshot and the unit reads
// after releasing it; the switch lock is never touched. So a scrape during a
// switch that is waiting seconds for a backend to load neither waits for the
// switch nor delays it, and a slow or hung NVML call can only cost this
// scrape its GPU series (bounded by scrapeTimeout), never the Supervisor's
// progress. The collector holds no lock of its own across those calls
// either; the doctor report is copied out of the cache under Metrics.mu.
type scrapeCollector struct{ m *Metrics }

func (c *scrapeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, g := range dcgmGauges {
		ch <- g.desc
	}
	for _, d := range []*prometheus.Desc{gpuUpDesc, gpuHeldDesc, activeProfileDesc, standbyDesc, standbyResidualDesc, servingWantedDesc, stateDesc, unitStateDesc, doctorCheckDesc, doctorRunDesc,
		telegramUpDesc, telegramStateDesc, telegramErrorsDesc, telegramSkippedDesc, telegramDroppedDesc} {
		ch <- d
	}
}

func (c *scrapeCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.m.scrapeTimeout)
	defer cancel()
	st := c.m.sup.Status(ctx)

	c.collectGPU(ch, st)
	collectState(ch, st)
	collectUnits(ch, st)
	collectTelegram(ch, st.Telegram)
	if rep, at := c.m.cachedDoctor(); rep != nil {
		collectDoctor(ch, rep)
		ch <- prometheus.MustNewConstMetric(doctorRunDesc, prometheus.GaugeValue, float64(at.UnixNano())/1e9)
	}
}

// collectGPU emits the DCGM gauges of every GPU, or gpuhost_gpu_up 0 alone
// when the snapshot failed. A fact the card could not report (named in
// FactErrors) is left out, as dcgm-exporter leaves out blank values, so a
// zero is never mistaken for a reading.
func (c *scrapeCollector) collectGPU(ch chan<- prometheus.Metric, st api.Status) {
	if st.GPU == nil {
		if st.GPUError != "" {
			c.m.log.Debug("metrics: GPU snapshot failed", "err", st.GPUError)
		}
		ch <- prometheus.MustNewConstMetric(gpuUpDesc, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(gpuUpDesc, prometheus.GaugeValue, 1)
	for _, d := range st.GPU.Devices {
		idx := strconv.Itoa(d.Index)
		labels := []string{idx, cleanLabel(d.UUID), "nvidia" + idx, cleanLabel(d.Name), cleanLabel(c.m.hostname)}
		for _, g := range dcgmGauges {
			if _, missing := d.FactErrors[g.fact]; missing {
				continue
			}
			ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, g.value(d), labels...)
		}
	}
	for _, g := range st.GPUs {
		held := map[[2]string]uint64{}
		for _, h := range g.Holders {
			held[[2]string{h.Unit, h.Profile}] += h.UsedMiB
		}
		for k, mib := range held {
			ch <- prometheus.MustNewConstMetric(gpuHeldDesc, prometheus.GaugeValue, float64(mib)*(1<<20),
				strconv.Itoa(g.Index), cleanLabel(g.UUID), cleanLabel(k[0]), cleanLabel(k[1]))
		}
	}
}

func collectState(ch chan<- prometheus.Metric, st api.Status) {
	ch <- prometheus.MustNewConstMetric(servingWantedDesc, prometheus.GaugeValue, boolValue(st.State.NotServing == ""))
	for _, p := range phases {
		ch <- prometheus.MustNewConstMetric(stateDesc, prometheus.GaugeValue, boolValue(st.State.Phase == p), string(p))
	}
	if !phaseKnown(st.State.Phase) {
		ch <- prometheus.MustNewConstMetric(stateDesc, prometheus.GaugeValue, 1, cleanLabel(string(st.State.Phase)))
	}
	for _, sb := range st.State.Standby {
		profile, unit := cleanLabel(sb.Profile), cleanLabel(sb.Unit)
		ch <- prometheus.MustNewConstMetric(standbyDesc, prometheus.GaugeValue, 1, profile, unit, cleanLabel(sb.Mode))
		ch <- prometheus.MustNewConstMetric(standbyResidualDesc, prometheus.GaugeValue, float64(sb.ResidualMiB)*(1<<20), profile, unit)
	}
	if st.State.Phase != api.PhaseActive {
		return
	}
	served := st.ActiveServedName()
	ch <- prometheus.MustNewConstMetric(activeProfileDesc, prometheus.GaugeValue, 1,
		cleanLabel(st.State.Profile), cleanLabel(string(st.State.Backend)), cleanLabel(st.State.Unit), cleanLabel(served))
}

func phaseKnown(p api.Phase) bool {
	for _, k := range phases {
		if p == k {
			return true
		}
	}
	return false
}

// collectUnits emits the state set of each backend unit. A unit read twice
// (a name listed for both backends) is emitted once.
func collectUnits(ch chan<- prometheus.Metric, st api.Status) {
	seen := map[string]bool{}
	for _, u := range st.Units {
		name := cleanLabel(u.Name)
		if seen[name] {
			continue
		}
		seen[name] = true
		known := false
		for _, s := range unitStates {
			known = known || u.ActiveState == s
			ch <- prometheus.MustNewConstMetric(unitStateDesc, prometheus.GaugeValue, boolValue(u.ActiveState == s), name, s)
		}
		if !known {
			ch <- prometheus.MustNewConstMetric(unitStateDesc, prometheus.GaugeValue, 1, name, cleanLabel(u.ActiveState))
		}
	}
}

// severityRank orders severities for merging; an unknown one ranks between
// warn and fail so that it is neither hidden nor taken for a failure.
func severityRank(s units.Severity) int {
	switch s {
	case units.SeverityOK:
		return 0
	case units.SeverityWarn:
		return 1
	case units.SeverityFail:
		return 3
	}
	return 2
}

// collectDoctor emits the state set of each check. The doctor may report
// one id several times for the same profile (units.conflicts, once per
// backend unit); Prometheus needs distinct label sets, so those merge to
// the worst severity.
func collectDoctor(ch chan<- prometheus.Metric, rep *api.DoctorReport) {
	type key struct{ id, profile string }
	worst := map[key]units.Severity{}
	for _, c := range rep.Checks {
		k := key{cleanLabel(c.ID), cleanLabel(c.Profile)}
		if prev, ok := worst[k]; !ok || severityRank(c.Severity) > severityRank(prev) {
			worst[k] = c.Severity
		}
	}
	for k, sev := range worst {
		known := false
		for _, s := range severities {
			known = known || sev == s
			ch <- prometheus.MustNewConstMetric(doctorCheckDesc, prometheus.GaugeValue, boolValue(sev == s), k.id, k.profile, string(s))
		}
		if !known {
			ch <- prometheus.MustNewConstMetric(doctorCheckDesc, prometheus.GaugeValue, 1, k.id, k.profile, cleanLabel(string(sev)))
		}
	}
}

// collectTelegram emits the bot's series; none when there is no bot.
func collectTelegram(ch chan<- prometheus.Metric, tg *api.TelegramStatus) {
	if tg == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(telegramUpDesc, prometheus.GaugeValue, boolValue(tg.State == api.TelegramPolling))
	known := false
	for _, s := range telegramStates {
		known = known || tg.State == s
		ch <- prometheus.MustNewConstMetric(telegramStateDesc, prometheus.GaugeValue, boolValue(tg.State == s), s)
	}
	if !known {
		ch <- prometheus.MustNewConstMetric(telegramStateDesc, prometheus.GaugeValue, 1, cleanLabel(tg.State))
	}
	for kind, n := range tg.Errors {
		ch <- prometheus.MustNewConstMetric(telegramErrorsDesc, prometheus.CounterValue, float64(n), cleanLabel(kind))
	}
	ch <- prometheus.MustNewConstMetric(telegramSkippedDesc, prometheus.CounterValue, float64(tg.UpdatesSkipped))
	ch <- prometheus.MustNewConstMetric(telegramDroppedDesc, prometheus.CounterValue, float64(tg.NotificationsDropped))
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
