package bench

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
)

// DefaultAlpha is the significance level of compare: a difference with
// p ≥ 0.05 is reported as "~" (no significant change), as benchstat does.
const DefaultAlpha = 0.05

// Comparison is `gpuhost bench compare A B`: every metric both results
// have, with the change and whether the repeats make it significant.
type Comparison struct {
	A     string       `json:"a"`
	B     string       `json:"b"`
	Alpha float64      `json:"alpha"`
	Rows  []CompareRow `json:"rows"`
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
	// P is the two-sided p value of Welch's t-test; -1 when it could not
	// be computed (fewer than two samples on a side).
	P           float64 `json:"p"`
	Significant bool    `json:"significant"`
	// Verdict is "~" (no significant change), "better", "worse", or "?"
	// (too few samples to tell).
	Verdict string `json:"verdict"`
}

// Compare compares b against a (a is the baseline). alpha ≤ 0 means
// DefaultAlpha.
func Compare(a, b *Result, alpha float64) Comparison {
	if alpha <= 0 || alpha >= 1 {
		alpha = DefaultAlpha
	}
	c := Comparison{A: a.ID, B: b.ID, Alpha: alpha, Rows: []CompareRow{}, Fingerprint: fingerprintDiff(a.Fingerprint, b.Fingerprint)}
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
		c.Rows = append(c.Rows, compareMetric(ma, mb, alpha))
	}
	for _, m := range b.Metrics() {
		if !seen[m.Name] {
			c.OnlyIn = append(c.OnlyIn, m.Name+" (only in "+b.ID+")")
		}
	}
	return c
}

func compareMetric(a, b Metric, alpha float64) CompareRow {
	row := CompareRow{Metric: a.Name, Unit: a.Unit, HigherIsBetter: a.HigherIsBetter, A: a.Stat, B: b.Stat, P: -1}
	if a.Stat.Mean != 0 {
		row.DeltaPct = (b.Stat.Mean - a.Stat.Mean) / math.Abs(a.Stat.Mean) * 100
	}
	_, _, p, ok := WelchTest(a.Stat.Samples, b.Stat.Samples)
	if !ok || math.IsNaN(p) {
		row.Verdict = "?"
		return row
	}
	row.P = p
	row.Significant = p < alpha
	switch {
	case !row.Significant:
		row.Verdict = "~"
	case (b.Stat.Mean > a.Stat.Mean) == a.HigherIsBetter:
		row.Verdict = "better"
	default:
		row.Verdict = "worse"
	}
	return row
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
	add("driver", a.Driver, b.Driver)
	add("cuda", a.CUDA, b.CUDA)
	add("backend", a.Backend, b.Backend)
	add("backend version", a.BackendVersion, b.BackendVersion)
	add("profile", a.Profile, b.Profile)
	add("flags", strings.Join(a.ProfileFlags, " "), strings.Join(b.ProfileFlags, " "))
	add("model", a.Model, b.Model)
	add("gpuhost", a.GpuhostVersion, b.GpuhostVersion)
	add("host", a.Host, b.Host)
	return out
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// WriteText prints the comparison as a table in benchstat's spirit:
//
//	metric              A                B                 delta     p
//	decode.128.tok_s    150.0 ± 0.1      181.2 ± 0.3      +20.80 %  0.000  better
//	prefill.512.tok_s   2390 ± 54        2402 ± 40          +0.5 %  0.71   ~
func (c Comparison) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 2, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "metric\t%s\t%s\tdelta\tp\tverdict\n", c.A, c.B)
	for _, r := range c.Rows {
		p := "-"
		if r.P >= 0 {
			p = fmt.Sprintf("%.3f", r.P)
		}
		delta := fmt.Sprintf("%+.1f%%", r.DeltaPct)
		if r.Verdict == "~" {
			delta = "~"
		}
		fmt.Fprintf(tw, "%s (%s)\t%s\t%s\t%s\t%s\t%s\n", r.Metric, r.Unit, fmtStat(r.A), fmtStat(r.B), delta, p, r.Verdict)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(c.Fingerprint) > 0 {
		fmt.Fprintf(w, "\nsetup changes:\n")
		for _, f := range c.Fingerprint {
			fmt.Fprintf(w, "  %s\n", f)
		}
	}
	if len(c.OnlyIn) > 0 {
		only := slices.Clone(c.OnlyIn)
		fmt.Fprintf(w, "\nnot compared: %s\n", strings.Join(only, ", "))
	}
	_, err := fmt.Fprintf(w, "\n~: no significant change (Welch's t-test, p ≥ %.2f); ?: fewer than 2 repeats on a side\n", c.Alpha)
	return err
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
