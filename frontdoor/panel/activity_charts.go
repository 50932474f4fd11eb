package panel

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"gpuhost/api"
	"gpuhost/internal/activity"
)

// The charts are server-rendered SVG: each a path in a 600×100 viewBox
// stretched to the card's width (preserveAspectRatio none, strokes kept
// thin by vector-effect), with the labels in HTML beside it, so text is
// never distorted and nothing needs a script or a style attribute.
const (
	chartW = 600.0
	chartH = 100.0
	// maxPoints bounds a path's points: an hour's 1800 samples are
	// averaged in buckets down to about this many.
	maxPoints = 300
)

// chartsView is the charts block of the Activity page.
type chartsView struct {
	Window   string
	From, To string
	Samples  int
	Charts   []chartView
	Switches []switchMark
}

// chartView is one chart: its title, the latest value, the top of its
// scale, the paths (Line the value, Ref a reference such as the total
// memory) and the switch bands.
type chartView struct {
	ID    string
	Title string
	Now   string
	Top   string
	Line  string
	Ref   string
	Marks []switchMark
}

// switchMark is a switch as a band on the time axis and a line of the list.
type switchMark struct {
	X, W    string
	Class   string
	Label   string
	Profile string
	Status  string
	Start   string
	// Duration is the switch's own duration ("3.2 s"; "" while it runs),
	// Mode cold or standby.
	Duration string
	Mode     string
	// Slow: over activity.SlowFactor × the median of its profile and
	// mode; Times says by how much ("7.1× the median 2.6 s").
	Slow  bool
	Times string
	Steps []stepMark
	// Crash: a backend that died (Reason, Message) rather than a switch.
	Crash   bool
	Reason  string
	Message string
}

// stepMark is one step of a switch in the list; Long marks one over
// activity.SlowFactor × that step's median.
type stepMark struct {
	Name, Duration, Message string
	Long, Failed            bool
}

// metric describes one chart: how to read a sample, and its scale.
type metric struct {
	id, title, unit string
	gpu             bool // the value exists only when the sample read the GPU
	value           func(activity.Sample) float64
	top             func(maxSeen float64, w activity.Window) float64
	format          string
}

var metrics = []metric{
	{id: "vram", title: "VRAM used", unit: "GiB", gpu: true, format: "%.1f",
		value: func(s activity.Sample) float64 { return float64(s.UsedMiB) / 1024 },
		top: func(m float64, w activity.Window) float64 {
			total := 0.0
			for _, s := range w.Samples {
				total = math.Max(total, float64(s.TotalMiB)/1024)
			}
			return math.Max(total, m)
		}},
	{id: "util", title: "GPU utilisation", unit: "%", gpu: true, format: "%.0f",
		value: func(s activity.Sample) float64 { return float64(s.UtilPct) },
		top:   func(float64, activity.Window) float64 { return 100 }},
	{id: "power", title: "Power", unit: "W", gpu: true, format: "%.0f",
		value: func(s activity.Sample) float64 { return s.PowerW },
		top:   func(m float64, _ activity.Window) float64 { return niceTop(m, 50) }},
	{id: "temp", title: "Temperature", unit: "°C", gpu: true, format: "%.0f",
		value: func(s activity.Sample) float64 { return float64(s.TempC) },
		top:   func(m float64, _ activity.Window) float64 { return math.Max(100, niceTop(m, 10)) }},
	{id: "rps", title: "Requests", unit: "req/s", format: "%.2f",
		value: func(s activity.Sample) float64 { return s.RequestsPerS },
		top:   func(m float64, _ activity.Window) float64 { return niceTop(m, 1) }},
	{id: "tps", title: "Output tokens", unit: "tok/s", format: "%.0f",
		value: func(s activity.Sample) float64 { return s.TokensPerS },
		top:   func(m float64, _ activity.Window) float64 { return niceTop(m, 10) }},
}

// niceTop is the scale's top: the largest value plus a tenth, rounded up
// to a multiple of step (at least step).
func niceTop(m, step float64) float64 {
	return math.Max(step, math.Ceil(m*1.1/step)*step)
}

// buildCharts turns a window of the history into the charts.
func buildCharts(w activity.Window, window string) chartsView {
	cv := chartsView{Window: window, From: w.From.Local().Format("15:04:05"), To: w.To.Local().Format("15:04:05"), Samples: len(w.Samples)}
	span := w.To.Sub(w.From)
	xOf := func(t time.Time) float64 {
		if span <= 0 {
			return chartW
		}
		return math.Min(chartW, math.Max(0, chartW*float64(t.Sub(w.From))/float64(span)))
	}
	for _, sw := range w.Switches {
		cv.Switches = append(cv.Switches, markOf(sw, w.To, xOf))
	}
	pts := bucket(w.Samples, maxPoints)
	step := w.Interval * time.Duration(max(1, (len(w.Samples)+maxPoints-1)/maxPoints)) // one point's span
	for _, m := range metrics {
		ch := chartView{ID: m.id, Title: m.title, Marks: cv.Switches, Now: "–"}
		maxSeen := 0.0
		for _, s := range w.Samples {
			if !m.gpu || s.GPU {
				maxSeen = math.Max(maxSeen, m.value(s))
			}
		}
		top := m.top(maxSeen, w)
		ch.Top = fmt.Sprintf("max "+m.format+" %s", top, m.unit)
		if m.id == "vram" {
			// The total is the dashed line just below the top.
			ch.Top = fmt.Sprintf("of "+m.format+" %s", top, m.unit)
			top *= 1.05
		}
		if n := len(w.Samples); n > 0 && (!m.gpu || w.Samples[n-1].GPU) {
			ch.Now = fmt.Sprintf(m.format+" %s", m.value(w.Samples[n-1]), m.unit)
		}
		ch.Line = pathOf(pts, m, top, step, xOf)
		if m.id == "vram" && top > 0 {
			ch.Ref = pathOf(pts, metric{gpu: true, value: func(s activity.Sample) float64 { return float64(s.TotalMiB) / 1024 }}, top, step, xOf)
		}
		cv.Charts = append(cv.Charts, ch)
	}
	return cv
}

func markOf(sw activity.Switch, now time.Time, xOf func(time.Time) float64) switchMark {
	end := sw.End
	if end.IsZero() {
		end = now
	}
	x0, x1 := xOf(sw.Start), xOf(end)
	w := math.Max(x1-x0, 2) // a quick switch is still a visible line
	if x0+w > chartW {
		x0 = chartW - w
	}
	status := sw.Status
	if status == "started" {
		status = "running"
	}
	m := switchMark{X: num(x0), W: num(w), Class: "mark mark-" + status, Profile: sw.Profile, Status: status,
		Start: sw.Start.Local().Format("15:04:05"), Mode: sw.Mode, Slow: sw.Slow,
		Label: fmt.Sprintf("switch to %s (%s) at %s", sw.Profile, status, sw.Start.Local().Format("15:04:05"))}
	if !sw.End.IsZero() && status != "unknown" {
		d := sw.DurationMS
		if d <= 0 {
			d = float64(sw.End.Sub(sw.Start)) / float64(time.Millisecond)
		}
		m.Duration = msText(d)
		m.Label += ", " + m.Duration
	}
	if sw.Slow {
		m.Class += " mark-slow"
		m.Times = fmt.Sprintf("%.1f× the median %s", sw.DurationMS/sw.MedianMS, msText(sw.MedianMS))
		m.Label += " (" + m.Times + ")"
	}
	if sw.Kind == string(api.EventCrash) {
		m.Crash, m.Reason, m.Message, m.Duration = true, sw.Reason, sw.Message, ""
		m.Label = fmt.Sprintf("crash of %s (%s) at %s", sw.Profile, sw.Reason, m.Start)
	}
	for _, st := range sw.Steps {
		m.Steps = append(m.Steps, stepMark{Name: st.Name, Duration: msText(st.MS), Message: st.Message, Long: st.Long, Failed: st.Status == string(api.StatusFailed)})
	}
	return m
}

// msText prints a duration in ms for people: "850 ms", "3.2 s", "20.3 s".
func msText(ms float64) string {
	if ms < 1000 {
		return fmt.Sprintf("%.0f ms", ms)
	}
	return fmt.Sprintf("%.1f s", ms/1000)
}

// bucket averages consecutive samples so that at most n remain. A bucket's
// GPU facts average over the samples that read the GPU; a bucket with none
// keeps GPU false (a gap).
func bucket(ss []activity.Sample, n int) []activity.Sample {
	if len(ss) <= n {
		return ss
	}
	size := (len(ss) + n - 1) / n
	out := make([]activity.Sample, 0, n)
	for i := 0; i < len(ss); i += size {
		part := ss[i:min(i+size, len(ss))]
		var b activity.Sample
		gpus := 0
		for _, s := range part {
			b.RequestsPerS += s.RequestsPerS / float64(len(part))
			b.TokensPerS += s.TokensPerS / float64(len(part))
			if s.GPU {
				gpus++
				b.UsedMiB += s.UsedMiB
				b.TotalMiB = max(b.TotalMiB, s.TotalMiB)
				b.UtilPct += s.UtilPct
				b.PowerW += s.PowerW
				b.TempC += s.TempC
			}
		}
		if gpus > 0 {
			b.GPU = true
			b.UsedMiB /= uint64(gpus)
			b.UtilPct /= gpus
			b.PowerW /= float64(gpus)
			b.TempC /= gpus
		}
		b.Time = part[len(part)-1].Time
		out = append(out, b)
	}
	return out
}

// pathOf is the SVG path of m over the points: "M" starts a piece, "L"
// continues it; a sample without the value, or a pause of more than three
// steps (a point's span) between samples (the daemon was not running), starts a new
// piece, so a gap is never drawn as a line.
func pathOf(pts []activity.Sample, m metric, top float64, step time.Duration, xOf func(time.Time) float64) string {
	var b strings.Builder
	pen := false
	var last time.Time
	for _, s := range pts {
		if m.gpu && !s.GPU {
			pen = false
			continue
		}
		if pen && step > 0 && s.Time.Sub(last) > 3*step {
			pen = false
		}
		y := chartH
		if top > 0 {
			y = chartH - chartH*math.Min(1, math.Max(0, m.value(s)/top))
		}
		if pen {
			b.WriteString(" L")
		} else {
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			b.WriteByte('M')
		}
		b.WriteString(num(xOf(s.Time)))
		b.WriteByte(' ')
		b.WriteString(num(y))
		pen, last = true, s.Time
	}
	return b.String()
}

// num writes a coordinate with one decimal.
func num(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) }
