package bench

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode/utf8"
)

// mdTable is a Markdown table in llama-bench's layout: a header row, an
// alignment row ("---:" for right-aligned columns) and the rows, every
// column padded to its widest cell (counted in runes).
type mdTable struct {
	head  []string
	right []bool
	rows  [][]string
}

func (t *mdTable) write(w io.Writer) {
	width := make([]int, len(t.head))
	for i, h := range t.head {
		width[i] = max(utf8.RuneCountInString(h), 3)
	}
	for _, r := range t.rows {
		for i, c := range r {
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	line := func(fill func(i int) string) {
		var b strings.Builder
		b.WriteString("|")
		for i := range t.head {
			b.WriteString(" ")
			b.WriteString(fill(i))
			b.WriteString(" |")
		}
		fmt.Fprintln(w, b.String())
	}
	pad := func(cells []string) func(int) string {
		return func(i int) string {
			gap := strings.Repeat(" ", width[i]-utf8.RuneCountInString(cells[i]))
			if t.right[i] {
				return gap + cells[i]
			}
			return cells[i] + gap
		}
	}
	line(pad(t.head))
	line(func(i int) string {
		if t.right[i] {
			return strings.Repeat("-", width[i]-1) + ":"
		}
		return strings.Repeat("-", width[i])
	})
	for _, r := range t.rows {
		line(pad(r))
	}
}

// writeSummary prints the llama-bench style summary of a run: one row for
// the result's model, backend and driver, one column per prefill length
// (pp<N>) and decode length (tg<N>) measured, each tok/s mean ± stddev over
// the repeats. It prints nothing for a result without prefill or decode.
func writeSummary(w io.Writer, r *Result) {
	if len(r.Prefill) == 0 && len(r.Decode) == 0 {
		return
	}
	f := r.Fingerprint
	t := mdTable{head: []string{"model", "backend", "gpu", "driver"}, right: []bool{false, false, false, false}}
	row := []string{orDash(f.Model), orDash(joinNonEmpty(" ", f.Backend, f.BackendVersion)), orDash(f.GPUName), orDash(f.Driver)}
	capped := false
	for _, p := range r.Prefill {
		t.head, t.right = append(t.head, "pp"+strconv.Itoa(p.TargetTokens)), append(t.right, true)
		row = append(row, fmtStat(p.TokS))
	}
	for _, d := range r.Decode {
		name := "tg" + strconv.Itoa(d.Tokens)
		if d.Length == LengthCapped {
			name += "†"
			capped = true
		}
		t.head, t.right = append(t.head, name), append(t.right, true)
		row = append(row, fmtStat(d.TokS))
	}
	t.rows = [][]string{row}
	fmt.Fprintf(w, "\nsummary (tok/s, mean ± sd over %s)\n", plural(r.Config.Repeats, "repeat", "repeats"))
	t.write(w)
	if capped {
		fmt.Fprintln(w, "† the length is only capped (the model may stop early): the rate is over the tokens produced")
	}
}

// writeServing prints the serving sweep in the style of vLLM's `bench
// serve`: per level the throughput (req/s, output tok/s, mean ± sd), then
// TTFT, TPOT and ITL as mean / median / p99 in ms (each the mean over the
// repeats of that repeat's figure), then the load (requests, failures,
// total tok/s, E2E, duration, tokens). ITL columns say "not recorded" in the header when no
// level has an ITL figure, rather than showing blanks as figures.
func writeServing(w io.Writer, r *Result) {
	if len(r.Serving) == 0 {
		return
	}
	s0 := r.Serving[0]
	itl := false
	for _, s := range r.Serving {
		itl = itl || s.ITL.Mean.N > 0
	}
	head := []string{"concurrency", "req/s", "out tok/s",
		"TTFT mean", "TTFT p50", "TTFT p99", "TPOT mean", "TPOT p50", "TPOT p99"}
	if itl {
		head = append(head, "ITL mean", "ITL p50", "ITL p99")
	}
	t := mdTable{head: head, right: make([]bool, len(head))}
	for i := range t.right {
		t.right[i] = true
	}
	for _, s := range r.Serving {
		row := []string{levelName(s), fmtStat(s.ReqPerS), fmtStat(s.OutputTPS)}
		row = append(row, distCells(s.TTFT)...)
		row = append(row, distCells(s.TPOT)...)
		if itl {
			row = append(row, distCells(s.ITL)...)
		}
		t.rows = append(t.rows, row)
	}
	note := ""
	if !itl {
		note = "; ITL not recorded by this run"
	}
	fmt.Fprintf(w, "\nserving (%d in / %d out tokens; latencies ms, mean over repeats%s)\n", s0.InputTokens, s0.OutputTokens, note)
	t.write(w)
	tw := tabwriter.NewWriter(w, 2, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w)
	fmt.Fprintln(tw, "concurrency\trequests\tfailed\ttotal tok/s\tE2E p50 / p99 ms\tduration s\ttokens in / out\t")
	for _, s := range r.Serving {
		tokens := "-" // results before the totals were recorded
		if s.TotalInputTokens+s.TotalOutputTokens > 0 {
			tokens = fmt.Sprintf("%d / %d", s.TotalInputTokens, s.TotalOutputTokens)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t\n", levelName(s), s.Completed, s.Failed, fmtStat(s.TotalTPS), pq(s.E2E), fmtStat(s.DurationS), tokens)
	}
	tw.Flush()
}

// levelName names a serving level: its concurrency (closed loop) or
// "rate 2/s" (open loop).
func levelName(s Serving) string {
	if s.RequestRate > 0 {
		return fmt.Sprintf("rate %g/s", s.RequestRate)
	}
	return strconv.Itoa(s.Concurrency)
}

// distCells is a distribution's mean, median and p99 (means over the
// repeats), "-" where there is no figure.
func distCells(d DistStat) []string {
	cell := func(s Stat) string {
		if s.N == 0 {
			return "-"
		}
		return fmtNum(s.Mean)
	}
	return []string{cell(d.Mean), cell(d.P50), cell(d.P99)}
}

// joinNonEmpty joins the non-empty parts with sep.
func joinNonEmpty(sep string, parts ...string) string {
	var keep []string
	for _, p := range parts {
		if p = strings.TrimSpace(p); p != "" {
			keep = append(keep, p)
		}
	}
	return strings.Join(keep, sep)
}

// plural is "1 repeat", "3 repeats".
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}

// truncate shortens s to at most n runes, ending in "…" when cut.
func truncate(s string, n int) string {
	if n < 1 || utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}
