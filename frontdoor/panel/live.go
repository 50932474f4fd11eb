package panel

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"gpuhost/internal/activity"
	"gpuhost/nvml"
)

// liveSnapshotTimeout bounds the GPU reading of a /live answer made
// without a fresh history sample.
const liveSnapshotTimeout = 2 * time.Second

// liveAnswer is GET /live: what the script writes into the header pill on
// every page and into the dashboard's gauges, every 2 s. The values are
// formatted here, as the templates format them, so the script only sets
// text.
type liveAnswer struct {
	Phase string `json:"phase"`
	Pill  string `json:"pill"`
	// PillClass colours the pill (phase-PillClass): "failed" (red) while
	// the wanted profile does not serve, else the phase; Title is its
	// tooltip, saying why.
	PillClass string `json:"pill_class"`
	Title     string `json:"title"`
	// Gauges are keyed as the dashboard's data-live attributes; absent
	// when the GPU could not be read.
	Gauges map[string]string `json:"gauges,omitempty"`
	// MemPct is the memory bar's width (0–100).
	MemPct float64 `json:"mem_pct"`
	// GPUs are every GPU's gauges by NVML index, asked for with ?gpus=1
	// (the dashboard of a box with several GPUs): the lanes past GPU 0
	// follow these, GPU 0's lane the gauges above.
	GPUs map[string]liveGauges `json:"gpus,omitempty"`
}

// liveGauges are one GPU's gauges and its memory bar's width.
type liveGauges struct {
	Gauges map[string]string `json:"gauges"`
	MemPct float64           `json:"mem_pct"`
}

// gaugesOf formats one GPU's readings as the dashboard shows them.
func gaugesOf(g activity.Sample) liveGauges {
	out := liveGauges{Gauges: map[string]string{
		"mem_used": gib(g.UsedMiB), "mem_total": gib(g.TotalMiB), "mem_pct": pct(g.UsedMiB, g.TotalMiB),
		"util": strconv.Itoa(g.UtilPct), "mem_util": strconv.Itoa(g.MemUtil),
		"temp": strconv.Itoa(g.TempC), "power": fmt.Sprintf("%.0f", g.PowerW),
	}}
	out.MemPct, _ = strconv.ParseFloat(pct(g.UsedMiB, g.TotalMiB), 64)
	return out
}

// sampleOf is one device's readings as an activity.Sample.
func sampleOf(d nvml.Device) activity.Sample {
	return activity.Sample{GPU: true, UsedMiB: d.MemoryUsedMiB, TotalMiB: d.MemoryTotalMiB, UtilPct: d.UtilizationGPU,
		MemUtil: d.UtilizationMemory, TempC: d.TemperatureC, PowerW: d.PowerW}
}

// handleLive answers the pill and the gauges. The GPU facts come from the
// activity history's newest sample when it is at most two intervals old
// (the history reads the GPU every 2 s anyway, so an open panel adds no
// NVML calls), else from a snapshot.
func (p *Panel) handleLive(c echo.Context) error {
	st := p.sup.State()
	ans := liveAnswer{Phase: string(st.Phase), Pill: phaseLine(st), PillClass: pillClass(st), Title: pillTitle(st)}
	c.Response().Header().Set("Cache-Control", "no-store")
	if c.QueryParam("gpus") == "1" {
		ans.GPUs = p.liveGPUs(c.Request().Context())
	}
	g, ok := p.liveGPU(c.Request().Context())
	if !ok {
		return c.JSON(http.StatusOK, ans)
	}
	lg := gaugesOf(g)
	ans.Gauges, ans.MemPct = lg.Gauges, lg.MemPct
	return c.JSON(http.StatusOK, ans)
}

// liveGPUs reads every GPU's gauges from one snapshot (the history
// samples GPU 0 only); nil when the GPU could not be read.
func (p *Panel) liveGPUs(ctx context.Context) map[string]liveGauges {
	ctx, cancel := context.WithTimeout(ctx, liveSnapshotTimeout)
	defer cancel()
	snap, err := p.sup.Snapshot(ctx)
	if err != nil {
		return nil
	}
	out := make(map[string]liveGauges, len(snap.Devices))
	for _, d := range snap.Devices {
		out[strconv.Itoa(d.Index)] = gaugesOf(sampleOf(d))
	}
	return out
}

// liveGPU reads the GPU facts of a /live answer (as an activity.Sample).
func (p *Panel) liveGPU(ctx context.Context) (activity.Sample, bool) {
	if src := p.activitySource(); src != nil {
		if s, have := src.Latest(); have && s.GPU && p.now().Sub(s.Time) <= 2*src.Interval() {
			return s, true
		}
	}
	ctx, cancel := context.WithTimeout(ctx, liveSnapshotTimeout)
	defer cancel()
	snap, err := p.sup.Snapshot(ctx)
	if err != nil {
		return activity.Sample{}, false
	}
	d, have := snap.Device0()
	if !have {
		return activity.Sample{}, false
	}
	return sampleOf(d), true
}
