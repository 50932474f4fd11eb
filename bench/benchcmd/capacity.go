package benchcmd

import (
	"context"
	"fmt"
	"gpuhost/bench"

	"github.com/spf13/cobra"
)

// capacityFlags holds what bench capacity's flags set: the target and
// output flags of bench run, and the SLO and bound of the search.
type capacityFlags struct {
	rf runFlags
	co bench.CapacityOptions
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
	f.IntVar(&co.MaxConcurrency, "max-concurrency", bench.DefaultCapacityMaxConcurrency, "the highest concurrency the search probes")
	f.IntVar(&o.Repeats, "repeats", bench.DefaultRepeats, "repeats of every probe (the interval's confidence is 1 − 2^(1−repeats))")
	addTargetFlags(f, rf, "config profile describing the --url server (fingerprint)")
	f.IntVar(&o.ServingRequests, "serving-requests", 0, "requests per probe and repeat (0: max(2×concurrency, 4))")
	f.IntVar(&o.ServingInputTokens, "serving-input", bench.DefaultServingInputTokens, "prompt length in tokens")
	f.IntVar(&o.ServingOutputTokens, "serving-output", bench.DefaultServingOutputTokens, "output length in tokens")
	f.DurationVar(&o.RequestTimeout, "request-timeout", bench.DefaultRequestTimeout, "limit for one request (a request over it fails, and misses the SLO)")
	f.DurationVar(&o.PreflightTimeout, "preflight-timeout", bench.DefaultPreflightTimeout, "limit for the first probe (GET /v1/models) that checks the endpoint answers")
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
		return usageError(fmt.Errorf("--max-concurrency %d: want 1 to %d", cf.co.MaxConcurrency, bench.ConcurrencyLimit))
	}
	if err := cf.co.Check(); err != nil {
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
	r, runErr := bench.RunCapacity(ctx, co)
	bar.finish()
	// Stored as bench run stores: in the daemon's store when it measured
	// the daemon, so list, show and the panel find it there.
	path, err := rf.save(ctx, cmd, deps, store, r, runErr)
	if err != nil {
		return err
	}
	if err := printResult(cmd.OutOrStdout(), r, path, rf.asJSON, rf.noSave); err != nil {
		return err
	}
	return resultExit(r, runErr, "bench capacity", "the search stopped early; see the errors above")
}
