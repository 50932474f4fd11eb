package panel

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"gpuhost/internal/activity"
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
}

// handleLive answers the pill and the gauges. The GPU facts come from the
// activity history's newest sample when it is at most two intervals old
// (the history reads the GPU every 2 s anyway, so an open panel adds no
// NVML calls), else from a snapshot.
func (p *Panel) handleLive(c echo.Context) error {
	st := p.sup.State()
	ans := liveAnswer{Phase: string(st.Phase), Pill: phaseLine(st), PillClass: pillClass(st), Title: pillTitle(st)}
	c.Response().Header().Set("Cache-Control", "no-store")
	g, ok := p.liveGPU(c.Request().Context())
	if !ok {
		return c.JSON(http.StatusOK, ans)
	}
	ans.Gauges = map[string]string{
		"mem_used": gib(g.UsedMiB), "mem_total": gib(g.TotalMiB), "mem_pct": pct(g.UsedMiB, g.TotalMiB),
		"util": strconv.Itoa(g.UtilPct), "mem_util": strconv.Itoa(g.MemUtil),
		"temp": strconv.Itoa(g.TempC), "power": fmt.Sprintf("%.0f", g.PowerW),
	}
	ans.MemPct, _ = strconv.ParseFloat(pct(g.UsedMiB, g.TotalMiB), 64)
	return c.JSON(http.StatusOK, ans)
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
	return activity.Sample{GPU: true, UsedMiB: d.MemoryUsedMiB, TotalMiB: d.MemoryTotalMiB, UtilPct: d.UtilizationGPU,
		MemUtil: d.UtilizationMemory, TempC: d.TemperatureC, PowerW: d.PowerW}, true
}
