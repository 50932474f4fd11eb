package panel

import (
	"context"
	"errors"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"gpuhost/api"
	"gpuhost/bench"
)

// BenchSource is what the Bench page needs of the daemon's benchmark
// service: the stored runs and a way to start one.
type BenchSource interface {
	List() ([]*bench.Result, []bench.Warning, error)
	Start(ctx context.Context, req bench.StartRequest) (bench.RunStatus, error)
	Current() *bench.RunStatus
}

// SetBench enables the Bench page; call it before Register.
func (p *Panel) SetBench(src BenchSource) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.bench = src
}

type benchView struct {
	Runs []bench.Summary
	// Switches are the `bench switch` results, newest first: one table row
	// per direction, path and mode.
	Switches []switchRow
	// Outliers are the switch samples over bench.OutlierFactor × their
	// group's median, with the step that took the time, newest result
	// first.
	Outliers []outlierRow
	Lengths  struct{ Prefill, Decode []int }
	Warnings []bench.Warning
	Running  *bench.RunStatus
	// Live is set while Running is in progress: the script follows its
	// "bench <id>: …" events on /api/events from Since.
	Live   bool
	Since  uint64
	Notice *noticeView
	Error  string
}

// outlierRow is one outlier of a switch result.
type outlierRow struct {
	ID string
	bench.SwitchOutlier
}

// switchRow is one group of a switch result on the Bench page.
type switchRow struct {
	ID        string
	StartedAt time.Time
	Status    string
	Errors    int
	// First is set on the first row of a result (which shows its ID).
	First bool
	bench.SwitchGroup
}

func switchRows(r *bench.Result) []switchRow {
	s := bench.Summarize(r)
	rows := []switchRow{}
	for i, g := range r.Switch.Groups {
		rows = append(rows, switchRow{ID: r.ID, StartedAt: r.StartedAt, Status: r.Status, Errors: s.Errors, First: i == 0, SwitchGroup: g})
	}
	if len(rows) == 0 { // nothing measured: still list the result
		rows = append(rows, switchRow{ID: r.ID, StartedAt: r.StartedAt, Status: r.Status, Errors: s.Errors, First: true,
			SwitchGroup: bench.SwitchGroup{From: r.Switch.A, To: r.Switch.B}})
	}
	return rows
}

func (p *Panel) benchSource() BenchSource {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.bench
}

func (p *Panel) handleBench(c echo.Context) error {
	return p.renderBench(c, http.StatusOK, nil)
}

func (p *Panel) renderBench(c echo.Context, code int, notice *noticeView) error {
	src := p.benchSource()
	v := benchView{Notice: notice}
	if src == nil {
		v.Error = "benchmarks are not configured in this daemon"
		return p.render(c, code, "bench", p.pageData(c, "bench", "Bench", v))
	}
	results, warnings, err := src.List()
	if err != nil {
		v.Error = err.Error()
	}
	v.Warnings, v.Running = warnings, src.Current()
	v.Live, v.Since = v.Running != nil && v.Running.Status == "running", p.sup.LastSeq()
	pre, dec := map[int]bool{}, map[int]bool{}
	for i := len(results) - 1; i >= 0; i-- { // newest first
		if results[i].Switch != nil {
			v.Switches = append(v.Switches, switchRows(results[i])...)
			for _, o := range results[i].Switch.Outliers {
				v.Outliers = append(v.Outliers, outlierRow{ID: results[i].ID, SwitchOutlier: o})
			}
			continue
		}
		s := bench.Summarize(results[i])
		for n := range s.PrefillTokS {
			pre[n] = true
		}
		for n := range s.DecodeTokS {
			dec[n] = true
		}
		v.Runs = append(v.Runs, s)
	}
	v.Lengths.Prefill, v.Lengths.Decode = sortedKeys(pre), sortedKeys(dec)
	return p.render(c, code, "bench", p.pageData(c, "bench", "Bench", v))
}

func sortedKeys(m map[int]bool) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}

// benchAccepted answers the panel script's POST /bench/run: the run and
// the event sequence number to follow its progress from.
type benchAccepted struct {
	ID      string `json:"id"`
	Profile string `json:"profile"`
	Since   uint64 `json:"since"`
}

// handleBenchRun starts a run on the active profile (form POST, CSRF-checked
// by the guard) with the service's defaults: JSON for the script (which
// then follows /api/events), a redirect to the Bench page for a plain form
// POST (which shows the run in progress).
func (p *Panel) handleBenchRun(c echo.Context) error {
	src := p.benchSource()
	if src == nil {
		return p.benchRefused(c, http.StatusNotFound, "Benchmarks are not configured.")
	}
	since := p.sup.LastSeq()
	ctx, cancel := context.WithTimeout(c.Request().Context(), 10*time.Second)
	defer cancel()
	st, err := src.Start(ctx, bench.StartRequest{})
	if err != nil {
		code := http.StatusConflict
		var re *bench.RequestError
		if errors.As(err, &re) {
			code = http.StatusBadRequest
		}
		return p.benchRefused(c, code, "Not started: "+err.Error())
	}
	p.log.Info("bench requested from the panel", "bench", st.ID, "profile", st.Profile, "remote", c.RealIP())
	if !wantsJSON(c) {
		return c.Redirect(http.StatusSeeOther, "/bench")
	}
	return c.JSON(http.StatusAccepted, benchAccepted{ID: st.ID, Profile: st.Profile, Since: since})
}

// benchRefused answers a run that did not start: JSON for the script, the
// Bench page with the reason for a form POST.
func (p *Panel) benchRefused(c echo.Context, code int, msg string) error {
	if wantsJSON(c) {
		return c.JSON(code, api.APIError{Error: strings.ToLower(http.StatusText(code)), Detail: msg})
	}
	return p.renderBench(c, code, &noticeView{Kind: "error", Message: msg})
}
