package bench

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// Defaults of compare.
const (
	// DefaultAlpha is the family-wise error rate of one comparison: the
	// chance that compare calls any metric better or worse when no metric
	// changed by the minimum effect or more (Holm's correction spreads it
	// over the metrics compared).
	DefaultAlpha = 0.05
	// DefaultMinEffectPct is the smallest change compare reports: the
	// confidence interval of a delta must lie entirely beyond ±3 % of the
	// baseline. Runs on a shared machine drift by a few percent with no
	// setup change; a smaller difference is not a verdict.
	DefaultMinEffectPct = 3.0
	// DefaultMinRepeats is the fewest repeats on each side for a verdict.
	DefaultMinRepeats = 3
)

// ErrNotComparable is returned by Compare for a result that must not be
// compared (a failed run has no measurements to trust).
var ErrNotComparable = errors.New("result cannot be compared")

// CompareOptions are the statistical settings of Compare; zero fields take
// the defaults.
type CompareOptions struct {
	// Alpha is the family-wise significance level over all metrics.
	Alpha float64
	// MinEffectPct is the minimum change (percent of A's mean) a verdict
	// needs; negative means 0 (any significant change).
	MinEffectPct float64
	// MinRepeats is the fewest samples on each side for a verdict.
	MinRepeats int
}

func (o CompareOptions) withDefaults() (CompareOptions, error) {
	switch {
	case o.Alpha == 0:
		o.Alpha = DefaultAlpha
	case !(o.Alpha > 0 && o.Alpha < 1):
		return o, fmt.Errorf("alpha %v: want a level between 0 and 1, e.g. 0.05", o.Alpha)
	}
	switch {
	case o.MinEffectPct == 0:
		o.MinEffectPct = DefaultMinEffectPct
	case o.MinEffectPct < 0:
		o.MinEffectPct = 0
	case math.IsNaN(o.MinEffectPct) || o.MinEffectPct >= 100:
		return o, fmt.Errorf("minimum effect %v %%: want a percentage below 100", o.MinEffectPct)
	}
	switch {
	case o.MinRepeats == 0:
		o.MinRepeats = DefaultMinRepeats
	case o.MinRepeats < 2:
		return o, fmt.Errorf("minimum repeats %d: want 2 or more (no spread can be estimated from one sample)", o.MinRepeats)
	}
	return o, nil
}

// Comparison is `gpuhost bench compare A B`: every metric both results
// have, with the change, its confidence interval and a verdict.
type Comparison struct {
	A string `json:"a"`
	B string `json:"b"`
	// Alpha is the family-wise level; Tests the number of metrics it is
	// spread over (Holm).
	Alpha        float64      `json:"alpha"`
	MinEffectPct float64      `json:"min_effect_pct"`
	MinRepeats   int          `json:"min_repeats"`
	Tests        int          `json:"tests"`
	Rows         []CompareRow `json:"rows"`
	// Fingerprint lists what differs between the two setups (driver,
	// backend version, flags …), usually the reason for a change.
	Fingerprint []string `json:"fingerprint_changes"`
	// OnlyIn names metrics present in just one result.
	OnlyIn []string `json:"only_in,omitempty"`
}

// CompareRow is one metric of a comparison.
type CompareRow struct {
	Metric         string  `json:"metric"`
	Unit           string  `json:"unit"`
	HigherIsBetter bool    `json:"higher_is_better"`
	A              Stat    `json:"a"`
	B              Stat    `json:"b"`
	DeltaPct       float64 `json:"delta_pct"`
	// CILowPct and CIHighPct bound the (1 − alpha) confidence interval of
	// the delta (Welch), in percent of A's mean; absent without a test.
	CILowPct  *float64 `json:"ci_low_pct,omitempty"`
	CIHighPct *float64 `json:"ci_high_pct,omitempty"`
	// P is the p value of Welch's test against "the change is smaller than
	// the minimum effect" (1 when the observed change is smaller); PHolm
	// the same after Holm's correction over all tested metrics. Both are
	// -1 when no test was possible.
	P           float64 `json:"p"`
	PHolm       float64 `json:"p_holm"`
	Significant bool    `json:"significant"`
	// Verdict is "~" (no change of at least the minimum effect shown),
	// "better", "worse", or "?" (no test possible: Reason says why).
	Verdict string `json:"verdict"`
	Reason  string `json:"reason,omitempty"`
}

// Compare compares b against a (a is the baseline). A failed run is
// refused (ErrNotComparable); so are invalid options.
//
// What a verdict guarantees: if no metric truly changed by the minimum
// effect or more, and the repeats of each run are independent draws, the
// chance that the comparison calls any metric "better" or "worse" is at
// most Alpha (Holm's step-down correction over all tested metrics, each a
// Welch test of |Δ| > min effect). Drift between runs beyond the minimum
// effect is a real difference to compare: it cannot tell a setup change
// from a machine that got busier.
func Compare(a, b *Result, opts CompareOptions) (Comparison, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return Comparison{}, err
	}
	for _, r := range []*Result{a, b} {
		if r.Status == StatusFailed {
			return Comparison{}, fmt.Errorf("%w: %s is a failed run (nothing was measured)", ErrNotComparable, r.ID)
		}
	}
	if a.Kind() != b.Kind() {
		return Comparison{}, fmt.Errorf("%w: %s is a %s result and %s a %s result; they share no metric", ErrNotComparable, a.ID, a.Kind(), b.ID, b.Kind())
	}
	c := Comparison{A: a.ID, B: b.ID, Alpha: o.Alpha, MinEffectPct: o.MinEffectPct, MinRepeats: o.MinRepeats,
		Rows: []CompareRow{}, Fingerprint: fingerprintDiff(a.Fingerprint, b.Fingerprint)}
	c.Fingerprint = append(c.Fingerprint, switchProfilesDiff(a.Switch, b.Switch)...)
	c.Fingerprint = append(c.Fingerprint, capacityDiff(a.Capacity, b.Capacity)...)
	bm := map[string]Metric{}
	for _, m := range b.Metrics() {
		bm[m.Name] = m
	}
	seen := map[string]bool{}
	for _, ma := range a.Metrics() {
		seen[ma.Name] = true
		mb, ok := bm[ma.Name]
		if !ok {
			c.OnlyIn = append(c.OnlyIn, ma.Name+" (only in "+a.ID+")")
			continue
		}
		c.Rows = append(c.Rows, compareMetric(ma, mb, o))
	}
	for _, m := range b.Metrics() {
		if !seen[m.Name] {
			c.OnlyIn = append(c.OnlyIn, m.Name+" (only in "+b.ID+")")
		}
	}
	c.Tests = holm(c.Rows, o.Alpha)
	return c, nil
}

// compareMetric fills everything but the Holm-adjusted p and the verdict
// of a tested row.
func compareMetric(a, b Metric, o CompareOptions) CompareRow {
	row := CompareRow{Metric: a.Name, Unit: a.Unit, HigherIsBetter: a.HigherIsBetter, A: a.Stat, B: b.Stat, P: -1, PHolm: -1}
	if a.Stat.Mean != 0 {
		row.DeltaPct = (b.Stat.Mean - a.Stat.Mean) / math.Abs(a.Stat.Mean) * 100
	}
	switch {
	case a.Stat.N < o.MinRepeats || b.Stat.N < o.MinRepeats:
		row.Verdict = "?"
		row.Reason = fmt.Sprintf("not enough repeats (%d and %d, need %d)", a.Stat.N, b.Stat.N, o.MinRepeats)
		return row
	case a.Stat.Mean == 0:
		row.Verdict = "?"
		row.Reason = "the baseline is zero; no relative change"
		return row
	}
	p, lo, hi, ok := minEffectTest(a.Stat.Samples, b.Stat.Samples, o.MinEffectPct/100, o.Alpha)
	if !ok {
		row.Verdict = "?"
		row.Reason = "no test possible"
		return row
	}
	row.P, row.CILowPct, row.CIHighPct = p, &lo, &hi
	return row
}

// minEffectTest tests H0: |mean(b) − mean(a)| ≤ eff·|mean(a)| with Welch's
// statistic and returns its two-sided p value (the observed direction's
// one-sided p, doubled) and the (1 − alpha) confidence interval of the
// difference in percent of |mean(a)|. The p value is below a level ℓ
// exactly when the (1 − ℓ) interval lies entirely beyond ±eff.
func minEffectTest(a, b []float64, eff, alpha float64) (p, loPct, hiPct float64, ok bool) {
	if len(a) < 2 || len(b) < 2 {
		return 0, 0, 0, false
	}
	ma, sa := MeanStddev(a)
	mb, sb := MeanStddev(b)
	va, vb := sa*sa/float64(len(a)), sb*sb/float64(len(b))
	se := math.Sqrt(va + vb)
	base := math.Abs(ma)
	d := mb - ma
	excess := math.Abs(d) - eff*base
	if se == 0 {
		p = 1
		if excess > 0 {
			p = 0
		}
		v := d / base * 100
		return p, v, v, true
	}
	den := 0.0
	if va > 0 {
		den += va * va / float64(len(a)-1)
	}
	if vb > 0 {
		den += vb * vb / float64(len(b)-1)
	}
	df := (va + vb) * (va + vb) / den
	p = 1
	if excess > 0 {
		p = StudentTTwoSided(excess/se, df)
	}
	half := StudentTQuantile(1-alpha/2, df) * se
	return p, (d - half) / base * 100, (d + half) / base * 100, true
}

// holm applies Holm's step-down correction to the tested rows (P ≥ 0),
// sets PHolm, Significant and the verdict, and returns how many rows were
// tested.
func holm(rows []CompareRow, alpha float64) int {
	var idx []int
	for i := range rows {
		if rows[i].P >= 0 {
			idx = append(idx, i)
		}
	}
	slices.SortStableFunc(idx, func(x, y int) int {
		switch {
		case rows[x].P < rows[y].P:
			return -1
		case rows[x].P > rows[y].P:
			return 1
		}
		return 0
	})
	m := len(idx)
	running := 0.0
	for k, i := range idx {
		adj := math.Min(1, float64(m-k)*rows[i].P)
		running = math.Max(running, adj)
		r := &rows[i]
		r.PHolm = running
		r.Significant = running < alpha
		switch {
		case !r.Significant:
			r.Verdict = "~"
		case (r.B.Mean > r.A.Mean) == r.HigherIsBetter:
			r.Verdict = "better"
		default:
			r.Verdict = "worse"
		}
	}
	return m
}

// fingerprintDiff lists the setup fields that differ.
func fingerprintDiff(a, b Fingerprint) []string {
	var out []string
	add := func(name, x, y string) {
		if x != y {
			out = append(out, fmt.Sprintf("%s: %s → %s", name, orDash(x), orDash(y)))
		}
	}
	add("gpu", a.GPUName, b.GPUName)
	add("gpus", a.GPUs, b.GPUs)
	add("driver", a.Driver, b.Driver)
	add("cuda", a.CUDA, b.CUDA)
	add("backend", a.Backend, b.Backend)
	add("backend version", a.BackendVersion, b.BackendVersion)
	add("profile", a.Profile, b.Profile)
	add("flags", strings.Join(a.ProfileFlags, " "), strings.Join(b.ProfileFlags, " "))
	add("model", a.Model, b.Model)
	add("gpuhost", a.GpuhostVersion, b.GpuhostVersion)
	add("host", a.Host, b.Host)
	add("context", itoaOrEmpty(a.MaxModelLen), itoaOrEmpty(b.MaxModelLen))
	keys := slices.Sorted(maps.Keys(a.Server))
	for k := range b.Server {
		if _, ok := a.Server[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		add("server "+k, a.Server[k], b.Server[k])
	}
	if x, y := a.Server["ollama.ps.size"], b.Server["ollama.ps.size"]; x != "" && y != "" && x != y &&
		a.Server["ollama.ps.context_length"] == b.Server["ollama.ps.context_length"] && a.Model == b.Model {
		out = append(out, "  (same model and context, another loaded size: Ollama allocated another KV cache — "+
			"OLLAMA_NUM_PARALLEL or OLLAMA_KV_CACHE_TYPE changed; its API reports neither)")
	}
	return out
}

func itoaOrEmpty(n int) string {
	if n == 0 {
		return ""
	}
	return strconv.Itoa(n)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// WriteText prints the setup changes first, then the comparison as a
// table in benchstat's spirit:
//
//	metric                     A            B            delta     95% CI            p(Holm)  verdict
//	decode.128.tok_s (tok/s)   150.0 ± 0.1  181.2 ± 0.3  +20.8% *  [+20.4%, +21.2%]  0.000    better
//	prefill.512.tok_s (tok/s)  2390 ± 54    1821 ± 240   -23.8% ~  [-52.1%, +4.5%]   0.310    ~
func (c Comparison) WriteText(w io.Writer) error {
	if len(c.Fingerprint) > 0 {
		fmt.Fprintf(w, "setup changes:\n")
		for _, f := range c.Fingerprint {
			fmt.Fprintf(w, "  %s\n", f)
		}
		fmt.Fprintln(w)
	} else {
		fmt.Fprintf(w, "setup changes: none recorded\n\n")
	}
	tw := tabwriter.NewWriter(w, 2, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "metric\t%s\t%s\tdelta\t%.0f%% CI\tp(Holm)\tverdict\n", c.A, c.B, (1-c.Alpha)*100)
	for _, r := range c.Rows {
		p, ci := "-", "-"
		if r.PHolm >= 0 {
			p = fmt.Sprintf("%.3f", r.PHolm)
		}
		if r.CILowPct != nil && r.CIHighPct != nil {
			ci = fmt.Sprintf("[%+.1f%%, %+.1f%%]", *r.CILowPct, *r.CIHighPct)
		}
		verdict := r.Verdict
		if r.Reason != "" {
			verdict += " " + r.Reason
		}
		fmt.Fprintf(tw, "%s (%s)\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Metric, r.Unit, fmtStat(r.A), fmtStat(r.B), fmtDelta(r), ci, p, verdict)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(c.OnlyIn) > 0 {
		only := slices.Clone(c.OnlyIn)
		fmt.Fprintf(w, "\nnot compared: %s\n", strings.Join(only, ", "))
	}
	_, err := fmt.Fprintf(w, "\nbetter/worse: the %.0f%% confidence interval excludes changes below ±%g%% after Holm's correction over %d metrics "+
		"(Welch's t-test; with no change of %g%% or more, any false verdict has probability ≤ %g); "+
		"~: no such change shown; ?: no test (fewer than %d repeats on a side); "+
		"the mark after a delta: * significant after Holm, ~ not significant, ? not tested\n",
		(1-c.Alpha)*100, c.MinEffectPct, c.Tests, c.MinEffectPct, c.Alpha, c.MinRepeats)
	return err
}

// fmtDelta is a row's change with its significance mark, always the
// number: "+20.8% *" (significant after Holm), "-23.8% ~" (not
// significant), "+1.0% ?" (no test possible).
func fmtDelta(r CompareRow) string {
	mark := "?"
	switch {
	case r.Significant:
		mark = "*"
	case r.PHolm >= 0:
		mark = "~"
	}
	return fmt.Sprintf("%+.1f%% %s", r.DeltaPct, mark)
}

// fmtStat prints mean ± stddev with a precision that suits the magnitude.
func fmtStat(s Stat) string {
	if s.N == 0 {
		return "-"
	}
	if s.N == 1 {
		return fmtNum(s.Mean)
	}
	return fmtNum(s.Mean) + " ± " + fmtNum(s.Stddev)
}

func fmtNum(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 1000:
		return fmt.Sprintf("%.0f", v)
	case a >= 100:
		return fmt.Sprintf("%.1f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.3f", v)
	}
}
