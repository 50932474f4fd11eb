package bench

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// WriteReport prints a result for people: fingerprint, then each phase as
// a table (mean ± stddev over the repeats), cross-checks, roofline, errors.
func WriteReport(w io.Writer, r *Result) error {
	switch {
	case r.Switch != nil:
		return writeSwitchReport(w, r)
	case r.Capacity != nil:
		return writeCapacityReport(w, r)
	}
	writeRunHeader(w, r)
	writeSummary(w, r)
	tw := tabwriter.NewWriter(w, 2, 0, 2, ' ', tabwriter.AlignRight)
	if len(r.Prefill) > 0 {
		fmt.Fprintln(w, "\nprefill (max_tokens 1, unique prefix per request)")
		fmt.Fprintln(tw, "prompt tokens\tTTFT ms\ttok/s\tsized by\t")
		for _, p := range r.Prefill {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t\n", p.TargetTokens, fmtStat(p.TTFTms), fmtStat(p.TokS), orDash(p.Calibration))
		}
		tw.Flush()
	}
	if len(r.Decode) > 0 {
		fmt.Fprintln(w, "\ndecode ((out − 1) / (t_last − t_first) over the tokens produced)")
		fmt.Fprintln(tw, "tokens\tlength\tproduced\ttok/s\tserver tok/s\tapi\t")
		for _, d := range r.Decode {
			srv := "-"
			if d.ServerTokS != nil {
				srv = fmtStat(*d.ServerTokS)
			}
			produced := "-"
			if d.Produced.N > 0 {
				produced = fmt.Sprintf("%.0f", d.Produced.Mean)
				if d.Short > 0 {
					produced += fmt.Sprintf(" (min %.0f)", slices.Min(d.Produced.Samples))
				}
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t\n", d.Tokens, orDash(d.Length), produced, fmtStat(d.TokS), srv, d.API)
		}
		tw.Flush()
	}
	writeServing(w, r)
	if len(r.CrossChecks) > 0 {
		fmt.Fprintln(w, "\ncross-checks (client vs server)")
		for _, c := range r.CrossChecks {
			fmt.Fprintf(w, "  %s: %s vs %s %s (%+.2f %%)", c.Name, fmtNum(c.Client), fmtNum(c.Server), c.Unit, c.DisagreementPct)
			if c.Note != "" {
				fmt.Fprintf(w, "  [%s]", c.Note)
			}
			fmt.Fprintln(w)
		}
	}
	if rl := r.Roofline; rl != nil {
		fmt.Fprintf(w, "\nroofline: %.0f GB/s, %.1fB params × %.3g bits, KV %.0f B/token\n", rl.BandwidthGBs, rl.ParamsB, rl.WeightBits, rl.KVBytesPerToken)
		for _, p := range rl.Decode {
			fmt.Fprintf(w, "  decode %d: %s of a %.1f tok/s ceiling (%.0f %%)\n", p.Tokens, fmtNum(p.TokS), p.CeilingTokS, p.PctOfCeiling)
		}
	}
	writeErrorsNotes(w, r)
	return nil
}

// writeErrorsNotes prints a result's errors (with their counts) and notes.
func writeErrorsNotes(w io.Writer, r *Result) {
	if len(r.Errors) > 0 {
		fmt.Fprintln(w, "\nerrors")
		for _, e := range r.Errors {
			fmt.Fprintf(w, "  [%s] %s", e.Phase, e.Message)
			if e.Count > 1 {
				fmt.Fprintf(w, " (×%d)", e.Count)
			}
			fmt.Fprintln(w)
		}
	}
	if len(r.Notes) > 0 {
		fmt.Fprintln(w, "\nnotes")
		for _, n := range r.Notes {
			fmt.Fprintf(w, "  %s\n", n)
		}
	}
}

// writeRunHeader prints a result's first lines: ID, status, start and
// duration, then the fingerprint; fields the result lacks are left out
// rather than printed as blanks.
func writeRunHeader(w io.Writer, r *Result) {
	f := r.Fingerprint
	fmt.Fprintf(w, "%s  %s  (%s, %.0f s)\n", r.ID, strings.ToUpper(r.Status), r.StartedAt.Local().Format("2006-01-02 15:04:05"), r.FinishedAt.Sub(r.StartedAt).Seconds())
	fmt.Fprintf(w, "  %s\n", joinNonEmpty(", ", "backend "+orDash(joinNonEmpty(" ", f.Backend, f.BackendVersion)), "model "+orDash(f.Model), f.URL))
	writeGPULine(w, f)
	if f.Profile != "" {
		fmt.Fprintf(w, "  profile %s\n", f.Profile)
	}
	if f.GPUs != "" {
		fmt.Fprintf(w, "  gpus %s %s\n", f.GPUs, strings.Join(f.GPUUUIDs, ","))
	}
	if len(f.Server) > 0 {
		keys := slices.Sorted(maps.Keys(f.Server))
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = k + "=" + f.Server[k]
		}
		fmt.Fprintf(w, "  server settings: %s\n", strings.Join(parts, " "))
	}
	fmt.Fprintf(w, "  %s\n", joinNonEmpty("; ", plural(r.Config.Repeats, "repeat", "repeats"), gpuhostLine(f)))
}

// writeGPULine prints "  gpu NAME (N MiB), driver D, CUDA C" with only
// the facts the fingerprint has; nothing without GPU name and driver.
func writeGPULine(w io.Writer, f Fingerprint) {
	if f.GPUName == "" && f.Driver == "" {
		return
	}
	gpu := orDash(f.GPUName)
	if f.GPUMemoryMiB > 0 {
		gpu += fmt.Sprintf(" (%d MiB)", f.GPUMemoryMiB)
	}
	fmt.Fprintf(w, "  %s\n", joinNonEmpty(", ", "gpu "+gpu, prefixed("driver ", f.Driver), prefixed("CUDA ", f.CUDA)))
}

// gpuhostLine is "gpuhost v0.3.0 1a2b3c4 on gpu-box" with only the facts
// the fingerprint has ("" with none).
func gpuhostLine(f Fingerprint) string {
	return joinNonEmpty(" ", prefixed("gpuhost ", f.GpuhostVersion), f.GpuhostCommit, prefixed("on ", f.Host))
}

// prefixed is label+v, or "" when v is empty.
func prefixed(label, v string) string {
	if v == "" {
		return ""
	}
	return label + v
}

func pq(d DistStat) string {
	if d.P50.N == 0 {
		return "-"
	}
	return fmtNum(d.P50.Mean) + " / " + fmtNum(d.P99.Mean)
}

// Widest cells of the list's free-text columns: a longer value (a
// Hugging Face path as the model) is cut with "…" so that one result does
// not push every other line's figures off the screen. The ID is never cut:
// it is what show and compare take.
const (
	listBackendWidth = 28
	listModelWidth   = 36
	listDriverWidth  = 16
)

// WriteList prints the table of `gpuhost bench list`: one line per
// result; a switch names both backends, a capacity result gives its answer
// and SLO. It sits with WriteReport so that the command keeps no copy of
// the number and text formatting both tables share.
func WriteList(out io.Writer, sums []Summary) error {
	tw := tabwriter.NewWriter(out, 2, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATUS\tBACKEND\tMODEL\tDRIVER\tPREFILL tok/s\tDECODE tok/s\tCAPACITY")
	for _, s := range sums {
		backend, model := strings.TrimSpace(s.Backend+" "+s.BackendVersion), s.Model
		capacity := "-"
		switch {
		case s.Kind == KindSwitch:
			backend, model = "switch "+strings.ReplaceAll(s.Backend, ",", "↔"), strings.ReplaceAll(s.Model, ",", "↔")
		case s.Capacity != nil:
			c := s.Capacity
			users := strconv.Itoa(c.Users)
			if c.AtMax {
				users = "≥ " + users
			}
			capacity = fmt.Sprintf("%s users [%d, %d] at %s", users, c.Low, c.High, c.SLO)
		}
		status := s.Status
		if s.Outliers > 0 {
			status += fmt.Sprintf(" (%d outliers)", s.Outliers)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, status, truncate(orDash(backend), listBackendWidth),
			truncate(orDash(model), listModelWidth), truncate(orDash(s.Driver), listDriverWidth),
			fmtLengths(s.PrefillTokS), fmtLengths(s.DecodeTokS), capacity)
	}
	return tw.Flush()
}

// fmtLengths prints "512:2390 2048:2380".
func fmtLengths(m map[int]float64) string {
	if len(m) == 0 {
		return "-"
	}
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d:%s", k, fmtNum(m[k]))
	}
	return strings.Join(parts, " ")
}

// writeCapacityReport prints a capacity result for people: the answer
// with its interval and SLO, every probe with its repeats' figures, and
// how the answer and the interval were found.
func writeCapacityReport(w io.Writer, r *Result) error {
	cb := r.Capacity
	writeRunHeader(w, r)
	conf := "1 repeat: no confidence level"
	if cb.Confidence > 0 {
		conf = fmt.Sprintf("%.0f %% confidence, %d repeats", cb.Confidence*100, cb.Repeats)
	}
	fmt.Fprintf(w, "\ncapacity: %s within %s (%s)\n", cb.interval(), orDash(cb.slo()), conf)
	fmt.Fprintf(w, "  %d in / %d out tokens per request, closed loop, probed up to --max-concurrency %d\n",
		cb.InputTokens, cb.OutputTokens, cb.MaxConcurrency)
	if len(cb.Probes) > 0 {
		fmt.Fprintln(w, "\nprobes in the order run (per repeat: TTFT p95 ms; user tok/s = 1000 / TPOT p95 ms)")
		tw := tabwriter.NewWriter(w, 2, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "concurrency\trequests\tTTFT p95 ms\tuser tok/s\tmet\twhy not\t")
		for _, p := range cb.Probes {
			ttft, tps := make([]string, len(p.Repeats)), make([]string, len(p.Repeats))
			why := ""
			for i, rp := range p.Repeats {
				ttft[i], tps[i] = fmtNum(rp.TTFTP95ms), fmtNum(rp.UserTokS)
				if why == "" {
					why = rp.Why
				}
			}
			met := fmt.Sprintf("%d/%d", p.RepeatsMet, len(p.Repeats))
			if p.MeetsSLO {
				met += " yes"
			} else {
				met += " no"
			}
			fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\t\n", p.Concurrency, p.Requests, strings.Join(ttft, " / "), strings.Join(tps, " / "), met, orDash(why))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(cb.PerRepeat) > 0 {
		b := make([]string, len(cb.PerRepeat))
		for i, pr := range cb.PerRepeat {
			b[i] = fmt.Sprintf("[%d, %d]", pr.Low, pr.High)
		}
		fmt.Fprintf(w, "\nper repeat: %s\n", strings.Join(b, " "))
	}
	fmt.Fprintln(w, "\n  a level meets the SLO when more than half of its repeats do (a failed request misses it); the search")
	fmt.Fprintln(w, "  doubles from 1, then bisects; each repeat alone brackets its capacity between the probed levels, and")
	fmt.Fprintln(w, "  the interval [lowest, highest] covers the median per-repeat capacity with probability ≥ 1 − 2^(1−repeats)")
	writeErrorsNotes(w, r)
	return nil
}

// writeSwitchReport prints a switch result for people: the two profiles,
// then per direction, path and mode the first-token time and the switch's
// own duration (p50 / p95 over the samples), then errors and notes.
func writeSwitchReport(w io.Writer, r *Result) error {
	f, sb := r.Fingerprint, r.Switch
	fmt.Fprintf(w, "%s  %s  (%s, %.0f s)\n", r.ID, strings.ToUpper(r.Status), r.StartedAt.Local().Format("2006-01-02 15:04:05"), r.FinishedAt.Sub(r.StartedAt).Seconds())
	var ps []string
	for _, p := range sb.Profiles {
		ps = append(ps, p.Name+" ("+orDash(joinNonEmpty(" ", p.Backend, p.ServedName))+")")
	}
	if len(ps) == 0 {
		ps = []string{sb.A, sb.B}
	}
	fmt.Fprintf(w, "  switch %s, %s, through %s\n", strings.Join(ps, " ↔ "), plural(sb.Rounds, "round", "rounds"), orDash(f.URL))
	writeGPULine(w, f)
	if g := gpuhostLine(f); g != "" {
		fmt.Fprintf(w, "  %s\n", g)
	}
	if len(sb.Groups) > 0 {
		fmt.Fprintln(w, "\ntime to first token and the switch's own duration (ms, p50 / p95 over the samples)")
		tw := tabwriter.NewWriter(w, 2, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "direction\tpath\tmode\tn\tfirst token\tswitch\t")
		for _, g := range sb.Groups {
			fmt.Fprintf(tw, "%s → %s\t%s\t%s\t%d\t%s\t%s\t\n", g.From, g.To, g.Path, g.Mode, g.N, pp(g.FirstTokenMS), pp(g.SwitchMS))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(w, "\n  switch path: from POST /api/switch to the first token of a /v1 request sent once it was accepted")
		fmt.Fprintln(w, "  request path: from a /v1 request naming the target's model (auto_switch) to its first token")
		fmt.Fprintln(w, "  mode: standby when the switch had a wake step, else cold (the target's unit was started)")
	}
	if len(sb.Outliers) > 0 {
		fmt.Fprintf(w, "\noutliers (over %d× their group's median first token; the step that took the time, from the daemon's events)\n", OutlierFactor)
		for _, o := range sb.Outliers {
			fmt.Fprintf(w, "  %s\n", o)
		}
	}
	// A skipped request path is said once, among the notes (the result's
	// notes carry it for every surface).
	if sb.RequestPath == RequestPathSkipped && !slices.ContainsFunc(r.Notes, func(n string) bool { return strings.Contains(n, sb.RequestPathNote) }) {
		fmt.Fprintf(w, "\nrequest path skipped: %s\n", sb.RequestPathNote)
	}
	if len(r.Errors) > 0 {
		fmt.Fprintln(w, "\nerrors")
		for _, e := range r.Errors {
			fmt.Fprintf(w, "  [%s] %s\n", e.Phase, e.Message)
		}
	}
	if len(r.Notes) > 0 {
		fmt.Fprintln(w, "\nnotes")
		for _, n := range r.Notes {
			fmt.Fprintf(w, "  %s\n", n)
		}
	}
	return nil
}

// pp prints "p50 / p95".
func pp(l LatencyStat) string {
	if l.N == 0 {
		return "-"
	}
	return fmtNum(l.P50) + " / " + fmtNum(l.P95)
}
