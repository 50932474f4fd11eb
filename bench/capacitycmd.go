package bench

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

// capacityFlags holds what bench capacity's flags set: the target and
// output flags of bench run, and the SLO and bound of the search.
type capacityFlags struct {
	rf runFlags
	co CapacityOptions
}

func newCapacityCmd(deps Deps) *cobra.Command {
	var cf capacityFlags
	cmd := &cobra.Command{
		Use:   "capacity",
		Short: "Find how many concurrent users the endpoint serves within an SLO (TTFT p95, per-user tok/s)",
		Long: `Find the largest number of concurrent users (closed-loop concurrency, as the serving
sweep of bench run) that the endpoint (default: the daemon's /v1 on the active profile)
serves within the SLO. Each probe is a short serving run at one concurrency, --repeats
times; a repeat meets the SLO when its TTFT p95 is at most --ttft-p95, its per-user
output rate 1000 / TPOT p95 (95 % of the requests decoded at least that fast) is at least
--min-tps, and no request failed; a level meets it when more than half of its repeats do.
The search doubles from 1 until a level misses (at most --max-concurrency), then bisects
between the last level met and the first missed.

The interval is read from the repeats: each repeat alone brackets its own capacity
between the probed levels, and [lowest, highest] over the repeats covers the median
per-repeat capacity with probability at least 1 − 2^(1−R) for R independent repeats
(75 % at 3, 94 % at 5). The result is stored with the other results; compare tests two
capacity results on capacity.users, one sample per repeat.

Exit status: 0 ok; 1 partial (the search stopped early); 2 failed (nothing measured);
64 usage (bad flag or argument).`,
		Example: `  gpuhost bench capacity --ttft-p95 1s --min-tps 20
  gpuhost bench capacity --ttft-p95 2s --min-tps 15 --max-concurrency 128 --repeats 3
  gpuhost bench capacity --url http://127.0.0.1:11434 --model llama3.1:8b --ttft-p95 1s --min-tps 20 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runCapacityCmd(cmd, deps, &cf)
		},
	}
	addCapacityFlags(cmd, &cf)
	return cmd
}

// addCapacityFlags registers bench capacity's flags on cmd, bound to cf:
// bench run's target, serving and output flags under the same names, and
// the SLO.
func addCapacityFlags(cmd *cobra.Command, cf *capacityFlags) {
	rf, o, co := &cf.rf, &cf.rf.o, &cf.co
	f := cmd.Flags()
	f.DurationVar(&co.TTFTP95, "ttft-p95", 0, "SLO: the most the 95th percentile of the time to first token may be (e.g. 1s; 0: no bound)")
	f.Float64Var(&co.MinUserTokS, "min-tps", 0, "SLO: the least per-user output rate in tok/s, 1000 / TPOT p95 (0: no bound)")
	f.IntVar(&co.MaxConcurrency, "max-concurrency", DefaultCapacityMaxConcurrency, "the highest concurrency the search probes")
	f.IntVar(&o.Repeats, "repeats", DefaultRepeats, "repeats of every probe (the interval's confidence is 1 − 2^(1−repeats))")
	addTargetFlags(f, rf, "config profile describing the --url server (fingerprint)")
	f.IntVar(&o.ServingRequests, "serving-requests", 0, "requests per probe and repeat (0: max(2×concurrency, 4))")
	f.IntVar(&o.ServingInputTokens, "serving-input", DefaultServingInputTokens, "prompt length in tokens")
	f.IntVar(&o.ServingOutputTokens, "serving-output", DefaultServingOutputTokens, "output length in tokens")
	f.DurationVar(&o.RequestTimeout, "request-timeout", DefaultRequestTimeout, "limit for one request (a request over it fails, and misses the SLO)")
	f.DurationVar(&o.PreflightTimeout, "preflight-timeout", DefaultPreflightTimeout, "limit for the first probe (GET /v1/models) that checks the endpoint answers")
	f.BoolVar(&rf.asJSON, "json", false, "print the result as JSON (no progress bar)")
	f.BoolVar(&rf.noSave, "no-save", false, "do not store the result")
	f.BoolVar(&rf.keepFailed, "keep-failed", false, "store the result even when nothing was measured")
	addDirFlag(cmd)
}

// runCapacityCmd is bench capacity: it checks the SLO, finds the target
// as bench run does, searches, then stores and prints the result and
// turns its status into the exit error.
func runCapacityCmd(cmd *cobra.Command, deps Deps, cf *capacityFlags) error {
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	if cf.co.MaxConcurrency < 1 {
		return usageError(fmt.Errorf("--max-concurrency %d: want 1 to %d", cf.co.MaxConcurrency, maxConcurrency))
	}
	if _, err := cf.co.withDefaults(); err != nil {
		return usageError(err)
	}
	rf := &cf.rf
	env, err := loadEnv(cmd, deps, rf.url != "")
	if err != nil {
		return fmt.Errorf("no --url given and the config is needed for the daemon's /v1: %w", err)
	}
	store, err := storeFor(cmd, env)
	if err != nil {
		return err
	}
	if err := rf.complete(ctx, deps, env); err != nil {
		return err
	}
	bar := newBar(cmd.ErrOrStderr(), !rf.asJSON)
	rf.o.Progress = bar.update
	co := cf.co
	co.Options = rf.o
	r, runErr := RunCapacity(ctx, co)
	bar.finish()
	path, err := saveResult(store, r, runErr, rf.noSave, rf.keepFailed)
	if err != nil {
		return err
	}
	if err := printResult(cmd.OutOrStdout(), r, path, rf.asJSON, rf.noSave); err != nil {
		return err
	}
	return resultExit(r, runErr, "bench capacity", "the search stopped early; see the errors above")
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
