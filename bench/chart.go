package bench

import (
	"bytes"
	"fmt"
	"html"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Chart geometry (SVG user units).
const (
	chartW      = 860
	panelH      = 220
	chartLeft   = 70
	chartRight  = 150 // room for the legend
	chartTop    = 34
	panelGap    = 70
	pointRadius = 3.5
)

var chartColors = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"}

// ChartSVG renders prefill and decode tok/s of the results over time as a
// self-contained SVG (two panels, one line per prompt or output length),
// for the panel's Bench page: no script, no external fonts, safe to inline.
// Results are placed in start order, evenly spaced; every point carries a
// label with the driver version and the profile, and a dashed rule marks
// each driver change, so a driver update shows as a step at its rule.
// Results without figures, and switch and capacity results (no tok/s),
// are left out; with none left, the SVG says so.
func ChartSVG(results []Result) []byte {
	rs := make([]Result, 0, len(results))
	for _, r := range results {
		if r.Kind() == KindRun && len(r.Metrics()) > 0 {
			rs = append(rs, r)
		}
	}
	slices.SortStableFunc(rs, func(a, b Result) int { return a.StartedAt.Compare(b.StartedAt) })
	height := chartTop + 2*panelH + panelGap + 60
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" width="%d" height="%d" font-family="sans-serif" font-size="11" role="img" aria-label="bench results over time">`,
		chartW, height, chartW, height)
	b.WriteString(`<rect width="100%" height="100%" fill="#fff"/>`)
	if len(rs) == 0 {
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle" font-size="14" fill="#555">no bench results yet — run gpuhost bench run</text></svg>`, chartW/2, height/2)
		return b.Bytes()
	}
	plotW := float64(chartW - chartLeft - chartRight)
	xOf := func(i int) float64 {
		if len(rs) == 1 {
			return chartLeft + plotW/2
		}
		return chartLeft + plotW*float64(i)/float64(len(rs)-1)
	}
	panels := []struct{ title, kind string }{{"prefill tok/s", "prefill"}, {"decode tok/s", "decode"}}
	for pi, p := range panels {
		top := float64(chartTop + pi*(panelH+panelGap))
		drawPanel(&b, rs, p.kind, p.title, top, xOf)
	}
	// Time axis labels under the lower panel.
	base := float64(chartTop + 2*panelH + panelGap)
	step := max(1, len(rs)/8)
	for i, r := range rs {
		if i%step != 0 && i != len(rs)-1 {
			continue
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="#555">%s</text>`, xOf(i), base+16, esc(r.StartedAt.Format("2006-01-02 15:04")))
	}
	b.WriteString(`</svg>`)
	return b.Bytes()
}

// drawPanel draws one metric family (prefill or decode) with its own scale.
func drawPanel(b *bytes.Buffer, rs []Result, kind, title string, top float64, xOf func(int) float64) {
	type pt struct {
		i int
		v float64
	}
	series := map[int][]pt{}
	maxV := 0.0
	for i, r := range rs {
		if kind == "prefill" {
			for _, p := range r.Prefill {
				if p.TokS.N > 0 {
					series[p.TargetTokens] = append(series[p.TargetTokens], pt{i, p.TokS.Mean})
					maxV = math.Max(maxV, p.TokS.Mean)
				}
			}
		} else {
			for _, d := range r.Decode {
				if d.TokS.N > 0 {
					series[d.Tokens] = append(series[d.Tokens], pt{i, d.TokS.Mean})
					maxV = math.Max(maxV, d.TokS.Mean)
				}
			}
		}
	}
	bottom := top + panelH
	left, right := float64(chartLeft), float64(chartW-chartRight)
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-size="13" font-weight="bold" fill="#222">%s</text>`, left, top-12, esc(title))
	yMax, tick := niceScale(maxV)
	yOf := func(v float64) float64 { return bottom - v/yMax*panelH }
	for k := 0; float64(k)*tick <= yMax+tick/2; k++ {
		v := float64(k) * tick
		y := yOf(v)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e5e5e5"/>`, left, y, right, y)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="end" fill="#555">%s</text>`, left-6, y+4, esc(fmtTick(v)))
	}
	fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#999"/>`, left, bottom, right, bottom)
	// Driver changes: a dashed rule between the two results.
	for i := 1; i < len(rs); i++ {
		if a, c := rs[i-1].Fingerprint.Driver, rs[i].Fingerprint.Driver; a != c {
			x := (xOf(i-1) + xOf(i)) / 2
			fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#888" stroke-dasharray="4 3"/>`, x, top, x, bottom)
			fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="#444">%s</text>`, x, top-2, esc("driver "+orDash(a)+" → "+orDash(c)))
		}
	}
	if len(series) == 0 {
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="#888">no %s figures</text>`, (left+right)/2, top+panelH/2, esc(kind))
		return
	}
	keys := make([]int, 0, len(series))
	for k := range series {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	unit := "tokens"
	if kind == "prefill" {
		unit = "prompt tokens"
	}
	for si, k := range keys {
		color := chartColors[si%len(chartColors)]
		pts := series[k]
		var path strings.Builder
		for j, p := range pts {
			if j == 0 {
				path.WriteString("M")
			} else {
				path.WriteString(" L")
			}
			fmt.Fprintf(&path, "%.1f %.1f", xOf(p.i), yOf(p.v))
		}
		fmt.Fprintf(b, `<path d="%s" fill="none" stroke="%s" stroke-width="2"/>`, path.String(), color)
		for _, p := range pts {
			r := rs[p.i]
			label := orDash(r.Fingerprint.Driver) + " · " + orDash(r.Fingerprint.Profile)
			fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="%.1f" fill="%s"><title>%s</title></circle>`,
				xOf(p.i), yOf(p.v), pointRadius, color,
				esc(fmt.Sprintf("%s\n%s %d %s: %.1f tok/s\ndriver %s, profile %s, %s %s",
					r.ID, kind, k, unit, p.v, orDash(r.Fingerprint.Driver), orDash(r.Fingerprint.Profile),
					orDash(r.Fingerprint.Backend), r.Fingerprint.BackendVersion)))
			if si == 0 { // one labelled line per panel keeps the labels legible
				fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="9" fill="#333">%s</text>`, xOf(p.i), yOf(p.v)-8, esc(label))
			}
		}
		ly := top + 14 + float64(si)*16
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"/>`, right+12, ly-4, right+30, ly-4, color)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" fill="#222">%s</text>`, right+34, ly, esc(strconv.Itoa(k)+" "+unit))
	}
}

// niceScale returns an axis maximum ≥ v and a tick step from {1, 2, 5}×10ⁿ
// giving at most eight steps above 10 % headroom.
func niceScale(v float64) (maxV, step float64) {
	if v <= 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 1, 0.25
	}
	raw := v * 1.1 / 8 // at most eight steps
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	return math.Ceil(v*1.1/step) * step, step
}

func fmtTick(v float64) string {
	if v >= 1000 {
		return strconv.FormatFloat(v/1000, 'f', -1, 64) + "k"
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

func esc(s string) string { return html.EscapeString(s) }
