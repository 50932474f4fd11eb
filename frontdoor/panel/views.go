package panel

import (
	"fmt"
	"html/template"
	"math"
	"strings"
	"sync"
	"time"

	"gpuhost/api"
)

// funcs are the template helpers; html/template escapes whatever they
// return, so none of them builds HTML.
var funcs = template.FuncMap{
	"gib":       gib,
	"pct":       pct,
	"dur":       formatDuration,
	"join":      strings.Join,
	"ago":       ago,
	"clock":     func(t time.Time) string { return t.Local().Format("2006-01-02 15:04:05") },
	"phaseLine": phaseLine,
	"pillClass": pillClass,
	"pillTitle": pillTitle,
	"codeSpans": codeSpans,
	"idBreaks":  idBreaks,
}

// idBreaks is a check id (profile.vram_fit[qwen3-coder]) escaped, with a
// line-break opportunity after each dot and before a bracket, so that a
// narrow cell wraps it between its parts instead of mid-word.
func idBreaks(id string) template.HTML {
	var b strings.Builder
	for _, r := range id {
		if r == '[' {
			b.WriteString("<wbr>")
		}
		b.WriteString(template.HTMLEscapeString(string(r)))
		if r == '.' {
			b.WriteString("<wbr>")
		}
	}
	return template.HTML(b.String()) //nolint:gosec // every rune escaped above
}

func gib(mib uint64) string { return fmt.Sprintf("%.1f", float64(mib)/1024) }

// pct is used over total in percent, one decimal, at most 100.
func pct(used, total uint64) string {
	if total == 0 {
		return "0"
	}
	return fmt.Sprintf("%.1f", math.Min(100, 100*float64(used)/float64(total)))
}

// phaseLine is the header pill's text (also /live's, which the script
// writes into the pill as the state changes). The profiles in standby are
// named too, so that a switch away (or the watcher putting a backend back
// to sleep) shows on every page within the script's 2 s, not only on the
// next load of the profiles page. On a box of several lanes it names each
// lane that is not idle ("GPU 0: qwen3-coder · vllm | GPU 1: llama3-8b ·
// ollama"): GPU 0's state alone would hide what the others serve.
func phaseLine(st api.State) string {
	if len(st.Lanes) == 0 {
		return lanePhaseLine(st)
	}
	var parts []string
	for _, l := range st.Lanes {
		if l.Phase == api.PhaseIdle && len(l.Standby) == 0 && l.NotServing == "" {
			continue
		}
		parts = append(parts, l.Lane+": "+lanePhaseLine(l))
	}
	if len(parts) == 0 {
		return "idle"
	}
	return strings.Join(parts, " | ")
}

// lanePhaseLine is one lane's (or a box of one lane's) pill text.
func lanePhaseLine(st api.State) string {
	line := "idle"
	switch st.Phase {
	case api.PhaseActive:
		line = fmt.Sprintf("%s · %s", st.Profile, st.Backend)
		if st.Step != "" {
			line += " (" + st.Step + ")"
		}
	case api.PhaseSwitching:
		line = fmt.Sprintf("switching to %s · %s", st.Target, st.Step)
	case api.PhaseFailed:
		line = "failed"
	}
	if st.NotServing != "" && st.Phase != api.PhaseFailed {
		line = "not serving " + st.LastWanted + " · " + line
	}
	if len(st.Standby) == 0 {
		return line
	}
	names := make([]string, len(st.Standby))
	for i, sb := range st.Standby {
		names[i] = sb.Profile
	}
	return line + " · " + strings.Join(names, ", ") + " in standby"
}

// pillClass is the header pill's colour class: red (failed) whenever the
// wanted profile does not serve, whatever the phase.
// On a box of several lanes the worst lane colours it: failed (or not
// serving), then switching, then active.
func pillClass(st api.State) string {
	if len(st.Lanes) == 0 {
		if st.NotServing != "" {
			return string(api.PhaseFailed)
		}
		return string(st.Phase)
	}
	class := api.PhaseIdle
	for _, l := range st.Lanes {
		switch {
		case l.NotServing != "" || l.Phase == api.PhaseFailed:
			return string(api.PhaseFailed)
		case l.Phase == api.PhaseSwitching:
			class = api.PhaseSwitching
		case l.Phase == api.PhaseActive && class == api.PhaseIdle:
			class = api.PhaseActive
		}
	}
	return string(class)
}

// pillTitle is the pill's tooltip: why it is red, else the phase.
// With several lanes it is every lane's line.
func pillTitle(st api.State) string {
	if len(st.Lanes) > 0 {
		lines := make([]string, len(st.Lanes))
		for i, l := range st.Lanes {
			lines[i] = api.LaneLine(l)
		}
		return strings.Join(lines, "\n")
	}
	if st.NotServing != "" {
		return "not serving: " + st.NotServing
	}
	return string(st.Phase)
}

// formatDuration renders milliseconds the way the progress line shows them.
func formatDuration(ms float64) string {
	switch {
	case ms <= 0 || math.IsNaN(ms) || math.IsInf(ms, 0):
		return ""
	case ms < 1:
		return "<1 ms"
	case ms < 1000:
		return fmt.Sprintf("%.0f ms", ms)
	case ms < 120000:
		return fmt.Sprintf("%.1f s", ms/1000)
	}
	return fmt.Sprintf("%.1f min", ms/60000)
}

func ago(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	d := time.Since(t)
	switch {
	case d < 2*time.Second:
		return "just now"
	case d < time.Minute:
		return fmt.Sprintf("%d s ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%d min ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%.1f h ago", d.Hours())
	}
	return fmt.Sprintf("%d days ago", int(d.Hours()/24))
}

// stepLabels are the words of the progress line: running, then done. The
// JavaScript in static/panel.js carries the same table.
var stepLabels = map[string][2]string{
	api.StepDrain:       {"draining requests in flight", "requests drained"},
	api.StepStop:        {"stopping", "stopped"},
	api.StepVRAMRelease: {"waiting for VRAM release", "VRAM released"},
	api.StepConfigure:   {"configuring", "configured"},
	api.StepStart:       {"starting", "started"},
	api.StepReady:       {"waiting until ready", "ready"},
	api.StepLoadModel:   {"loading model", "model loaded"},
	api.StepVerify:      {"verifying", "verified"},
}

// detailMiB reads a MiB figure from an event's Detail, whether it holds a Go
// integer (events from the ring buffer) or a JSON number.
func detailMiB(d map[string]any, key string) (uint64, bool) {
	switch v := d[key].(type) {
	case uint64:
		return v, true
	case int:
		if v >= 0 {
			return uint64(v), true
		}
	case int64:
		if v >= 0 {
			return uint64(v), true
		}
	case float64:
		if v >= 0 && !math.IsNaN(v) && !math.IsInf(v, 0) {
			return uint64(v), true
		}
	}
	return 0, false
}

// stepLabel words one step event. beforeMiB is the GPU memory used when the
// switch was requested (negative: unknown), for "VRAM released x → y GiB".
func stepLabel(step string, status api.EventStatus, detail map[string]any, beforeMiB int64) string {
	base, prefix := step, ""
	if rest, ok := strings.CutPrefix(step, api.StepRollback); ok {
		base, prefix = rest, "rollback: "
	}
	words, known := stepLabels[base]
	if !known {
		words = [2]string{base, base + " done"}
	}
	switch status {
	case api.StatusStarted:
		return prefix + words[0]
	case api.StatusFailed:
		return prefix + words[0] + " failed"
	}
	label := words[1]
	used, haveUsed := detailMiB(detail, api.DetailUsedMiB)
	switch base {
	case api.StepVRAMRelease:
		if haveUsed && beforeMiB >= 0 {
			label = fmt.Sprintf("VRAM released %.1f → %.1f GiB", float64(beforeMiB)/1024, float64(used)/1024)
		} else if haveUsed {
			label = fmt.Sprintf("VRAM released → %.1f GiB", float64(used)/1024)
		}
	case api.StepDrain:
		drained, okD := detailMiB(detail, api.DetailDrained)
		cut, okC := detailMiB(detail, api.DetailCut)
		if okD && okC {
			label = fmt.Sprintf("requests drained: %d finished, %d cut", drained, cut)
		}
	case api.StepVerify:
		if total, ok := detailMiB(detail, api.DetailTotalMiB); haveUsed && ok {
			label = fmt.Sprintf("verified · %.1f/%.1f GiB used", float64(used)/1024, float64(total)/1024)
		}
	}
	return prefix + label
}

// stepView is one entry of the progress line.
type stepView struct {
	Step     string
	Status   string // running, done, failed
	Label    string
	Duration string
	Message  string
}

// progressView is a switch's progress as the profiles page shows it, built
// from the event buffer for readers without JavaScript (and as the starting
// point the script continues from).
type progressView struct {
	ID        string
	Profile   string
	Since     uint64 // the last event shown; the script follows from here
	BeforeMiB int64
	Running   bool
	Found     bool
	Outcome   string // "", done, failed
	Result    string
	Steps     []stepView
	Journal   []string
}

// buildProgress folds a switch's events into the progress line.
func buildProgress(id string, events []api.Event, beforeMiB int64, current api.State) progressView {
	pv := progressView{ID: id, BeforeMiB: beforeMiB}
	index := map[string]int{}
	for _, e := range events {
		if e.SwitchID != id {
			continue
		}
		pv.Found = true
		pv.Since = e.Seq
		switch e.Kind {
		case api.EventSwitch:
			switch e.Status {
			case api.StatusStarted:
				pv.Profile = e.Profile
			case api.StatusDone:
				pv.Outcome = "done"
				pv.Result = fmt.Sprintf("%s is active", e.Profile)
				if d := formatDuration(e.DurationMS); d != "" {
					pv.Result += " (total " + d + ")"
				}
			case api.StatusFailed:
				pv.Outcome, pv.Result = "failed", e.Message
			case api.StatusInfo:
				pv.Steps = append(pv.Steps, stepView{Step: "info", Status: "info", Label: e.Message})
			}
			if pv.Profile == "" {
				pv.Profile = e.Profile
			}
		case api.EventStep:
			sv := stepView{Step: e.Step, Label: stepLabel(e.Step, e.Status, e.Detail, beforeMiB), Message: e.Message}
			switch e.Status {
			case api.StatusStarted:
				sv.Status = "running"
			case api.StatusFailed:
				sv.Status = "failed"
				pv.Journal = e.Journal
			default:
				sv.Status = "done"
			}
			sv.Duration = formatDuration(e.DurationMS)
			if i, ok := index[e.Step]; ok {
				pv.Steps[i] = sv
			} else {
				index[e.Step] = len(pv.Steps)
				pv.Steps = append(pv.Steps, sv)
			}
		}
	}
	pv.Running = pv.Found && pv.Outcome == "" && switchRunning(current, id)
	if pv.Found && pv.Outcome == "" && !pv.Running {
		// The buffer lost the end (or the daemon restarted): say so rather
		// than spin forever.
		pv.Outcome, pv.Result = "unknown", "the end of this switch is no longer in the event buffer; see the dashboard for the current state"
	}
	return pv
}

// beforeMemo remembers, per switch started here, the GPU memory used when
// it was requested: the events say where VRAM went, not where it came from.
type beforeMemo struct {
	max   int
	mu    sync.Mutex
	order []string
	mib   map[string]int64
}

func newBeforeMemo(max int) *beforeMemo {
	return &beforeMemo{max: max, mib: map[string]int64{}}
}

func (m *beforeMemo) put(id string, mib int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.mib[id]; !ok {
		m.order = append(m.order, id)
	}
	m.mib[id] = mib
	for len(m.order) > m.max {
		delete(m.mib, m.order[0])
		m.order = m.order[1:]
	}
}

func (m *beforeMemo) get(id string) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if v, ok := m.mib[id]; ok {
		return v
	}
	return -1
}
