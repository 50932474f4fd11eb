package benchcmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	"gpuhost/api"
	"gpuhost/bench"
	"gpuhost/internal/exitclass"
	"gpuhost/nvml"
	"gpuhost/units"
)

// Deps is what the bench commands need from package main.
type Deps struct {
	GpuhostVersion string
	GpuhostCommit  string
	// Env loads the config-derived environment when a command runs (the
	// --config flag is parsed by then); without a config file gpuhost's
	// asks the daemon instead. An error is tolerated where the command can
	// do without: `bench run --url …` against any server with results in
	// --dir or the user's state directory.
	Env func(cmd *cobra.Command) (Env, error)
	// Daemon returns the client of the running daemon's API, found as
	// every daemon command finds it (the command's --url, $GPUHOST_URL,
	// the config's listen, the default), for `bench switch`.
	Daemon func(cmd *cobra.Command) (*api.Client, error)
}

// Env is the config-derived environment of the bench commands.
type Env struct {
	// StateDir holds results under StateDir/bench.
	StateDir string
	// Profiles lets `--profile NAME` supply model_params (roofline) and the
	// fingerprint for a --url run.
	Profiles map[string]*units.Profile
	// Active returns the daemon's managed /v1 as a Target (ServerURL set to
	// the backend for the extras, APIKey set when the daemon needs one) and
	// the active profile; nil when unknown.
	Active func(ctx context.Context) (bench.Target, *units.Profile, error)
	// GPU gives NVML facts for the fingerprint and the roofline; nil skips
	// them.
	GPU func(ctx context.Context) (nvml.Snapshot, error)
}

// NewCmd returns `gpuhost bench` with run, switch, capacity, list, show
// and compare.
func NewCmd(deps Deps) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure prefill, decode and serving speed; store, list and compare results",
		Long: `Measure an OpenAI-compatible endpoint (default: the daemon's /v1 on the active
profile) the way vLLM's bench serve defines the figures, with repeats, and store one
JSON result per run in the daemon's store (<state_dir>/bench, through its API) when the
daemon was measured, else in the local folder (--dir). list, show and compare read the
daemon's store (--url, $GPUHOST_URL), the local folder only when no daemon answers
(said on stderr). Compare two results with a significance
test across repeats. "bench switch A B" measures switching between two profiles;
"bench capacity --ttft-p95 1s --min-tps 20" finds how many concurrent users the endpoint
serves within that SLO.

Exit status: 0 ok; 1 a problem found (a partial, aborted or failed run, a worse
compare); 64 usage (bad flag or argument, unknown profile or result); 69 the endpoint
or the daemon unreachable; 78 the config needed and missing or invalid.`,
	}
	cmd.AddCommand(newRunCmd(deps), newSwitchCmd(deps), newCapacityCmd(deps), newListCmd(deps), newShowCmd(deps), newCompareCmd(deps))
	// Flag and argument errors are usage (64); every other error carries
	// its own class or is a problem found (1).
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError(err) })
	for _, sub := range cmd.Commands() {
		if args := sub.Args; args != nil {
			sub.Args = func(c *cobra.Command, a []string) error {
				if err := args(c, a); err != nil {
					return usageError(err)
				}
				return nil
			}
		}
	}
	return cmd
}

// loadEnv runs deps.Env, tolerating its failure when tolerate is true.
func loadEnv(cmd *cobra.Command, deps Deps, tolerate bool) (Env, error) {
	if deps.Env == nil {
		return Env{}, nil
	}
	env, err := deps.Env(cmd)
	if err != nil && !tolerate {
		return env, err
	}
	return env, nil
}

// storeFor picks the results directory: --dir, the config's state dir, or
// the user's state directory.
func storeFor(cmd *cobra.Command, env Env) (*bench.Store, error) {
	// The commands print skipped files themselves; the store stays quiet.
	quiet := slog.New(slog.DiscardHandler)
	dir, _ := cmd.Flags().GetString("dir")
	if dir != "" {
		return &bench.Store{Dir: dir, Log: quiet}, nil
	}
	if env.StateDir != "" {
		return bench.NewStore(env.StateDir, quiet), nil
	}
	base := os.Getenv("XDG_STATE_HOME")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return nil, errors.New("no results directory: give --dir (no config and no home directory)")
		}
		base = filepath.Join(home, ".local", "state")
	}
	return bench.NewStore(filepath.Join(base, "gpuhost"), quiet), nil
}

// addReadFlags registers where list, show and compare read: the daemon
// (--url) or a folder (--dir).
func addReadFlags(cmd *cobra.Command) {
	cmd.Flags().String("url", "", "daemon API base URL whose store to read (default: $GPUHOST_URL, else the config's listen, else http://127.0.0.1:8080); the local folder only when no daemon answers")
	cmd.Flags().String("dir", "", "read this results folder instead of the daemon's store")
}

// cmdContext is the command's context, or Background outside Execute.
func cmdContext(cmd *cobra.Command) context.Context {
	if ctx := cmd.Context(); ctx != nil {
		return ctx
	}
	return context.Background()
}

func addDirFlag(cmd *cobra.Command) {
	cmd.Flags().String("dir", "", "results directory (default: <state_dir>/bench from the config)")
}

// runFlags holds what bench run's flags set: the run's Options and the
// flags that choose the target and the output.
type runFlags struct {
	o                      bench.Options
	url, serverURL, flavor string
	model, profile, keyEnv string
	asJSON, noSave         bool
	keepFailed             bool
	params                 units.ModelParams
}

func newRunCmd(deps Deps) *cobra.Command {
	var rf runFlags
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the benchmark (default: the daemon's /v1 on the active profile)",
		Example: `  gpuhost bench run
  gpuhost bench run --repeats 3 --prefill 512,2048 --decode 128 --concurrency 1,8
  gpuhost bench run --url http://gpu-box:8000 --model Qwen/Qwen3-Coder-30B-A3B-Instruct
  gpuhost bench run --url http://127.0.0.1:11434 --model llama3.1:8b --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runBench(cmd, deps, &rf)
		},
	}
	addRunFlags(cmd, &rf)
	return cmd
}

// addRunFlags registers bench run's flags on cmd, bound to rf.
func addRunFlags(cmd *cobra.Command, rf *runFlags) {
	o := &rf.o
	f := cmd.Flags()
	addTargetFlags(f, rf, "config profile describing the --url server (model_params for the roofline)")
	f.IntVar(&o.Repeats, "repeats", bench.DefaultRepeats, "measured repeats of every figure (mean ± stddev; compare needs ≥ 2)")
	f.IntSliceVar(&o.PrefillTokens, "prefill", bench.DefaultPrefillTokens, "prompt lengths in tokens (capped to the model's context)")
	f.IntSliceVar(&o.DecodeTokens, "decode", bench.DefaultDecodeTokens, "generated lengths in tokens (vLLM: forced with ignore_eos + min_tokens; Ollama: only capped by num_predict, the rate is over the tokens produced)")
	f.IntVar(&o.DecodeMinTokens, "decode-min-tokens", bench.DefaultDecodeMinTokens, "where the length is only capped (Ollama): fewest tokens a decode request must produce to count")
	f.IntSliceVar(&o.Concurrency, "concurrency", bench.DefaultConcurrency, "serving sweep concurrencies (closed loop)")
	f.Float64SliceVar(&o.RequestRates, "request-rate", nil, "open-loop serving levels: Poisson arrivals at these rates in requests/s (as vLLM's bench serve --request-rate)")
	f.Uint64Var(&o.ArrivalSeed, "arrival-seed", 0, "seed of the --request-rate arrival times (same seed, same schedule)")
	f.IntVar(&o.ServingRequests, "serving-requests", 0, "requests per concurrency and repeat (0: max(2×concurrency, 4))")
	f.IntVar(&o.ServingInputTokens, "serving-input", bench.DefaultServingInputTokens, "serving sweep prompt length in tokens")
	f.IntVar(&o.ServingOutputTokens, "serving-output", bench.DefaultServingOutputTokens, "serving sweep output length in tokens")
	f.StringVar(&o.ServingAPI, "serving-api", bench.ServingV1, "serving sweep API: v1 (the OpenAI /v1 clients use) or native (Ollama's /api/chat, with a per-request cross-check against Ollama's own timings)")
	f.StringSliceVar(&o.Phases, "phases", bench.AllPhases, "phases to run: prefill, decode, serving")
	f.DurationVar(&o.RequestTimeout, "request-timeout", bench.DefaultRequestTimeout, "limit for one request")
	f.DurationVar(&o.PreflightTimeout, "preflight-timeout", bench.DefaultPreflightTimeout, "limit for the first probe (GET /v1/models) that checks the endpoint answers")
	f.Float64Var(&rf.params.TotalParamsB, "params-b", 0, "roofline: total parameters in billions (overrides the profile's model_params)")
	f.Float64Var(&rf.params.ActiveParamsB, "active-params-b", 0, "roofline: active parameters per token in billions (MoE)")
	f.Float64Var(&rf.params.WeightBits, "weight-bits", 0, "roofline: bits per weight (4 for INT4/AWQ; default 16)")
	f.BoolVar(&rf.asJSON, "json", false, "print the result as JSON (no progress bar)")
	f.BoolVar(&rf.noSave, "no-save", false, "do not store the result")
	f.BoolVar(&rf.keepFailed, "keep-failed", false, "store the result even when the run failed (nothing measured); compare refuses such results")
	addDirFlag(cmd)
}

// addTargetFlags registers the flags that name what to measure, shared by
// bench run and bench capacity; profileHelp says what --profile supplies.
func addTargetFlags(f *pflag.FlagSet, rf *runFlags, profileHelp string) {
	f.StringVar(&rf.url, "url", "", "OpenAI-compatible endpoint to measure (vLLM, Ollama or other), with or without /v1")
	f.StringVar(&rf.serverURL, "server-url", "", "backend root for /version, /tokenize, /metrics, /api/* when --url is a proxy")
	f.StringVar(&rf.model, "model", "", "model name (default: the only model the server lists)")
	f.StringVar(&rf.flavor, "flavor", "auto", "server kind: auto (detect via /version or /api/version), vllm, ollama, openai")
	f.StringVar(&rf.profile, "profile", "", profileHelp)
	f.StringVar(&rf.keyEnv, "api-key-env", "", "environment variable holding a bearer token for --url")
}

// runBench is bench run: it completes the options from the flags and the
// config, runs the benchmark, stores and prints the result and turns its
// status into the exit error.
func runBench(cmd *cobra.Command, deps Deps, rf *runFlags) error {
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
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
	r, runErr := bench.Run(ctx, rf.o)
	bar.finish()
	path, err := rf.save(ctx, cmd, deps, store, r, runErr)
	if err != nil {
		return err
	}
	if err := printResult(cmd.OutOrStdout(), r, path, rf.asJSON, rf.noSave); err != nil {
		return err
	}
	return resultExit(r, runErr, "bench run", "some figures are missing; see the errors above")
}

// complete fills rf.o from the flags, the config and the daemon: the
// flavor, the target, the API key and the fingerprint facts, then checks
// the options.
func (rf *runFlags) complete(ctx context.Context, deps Deps, env Env) error {
	o := &rf.o
	switch bench.Flavor(rf.flavor) {
	case "", "auto":
		o.Target.Flavor = ""
	case bench.FlavorVLLM, bench.FlavorOllama, bench.FlavorOpenAI:
		o.Target.Flavor = bench.Flavor(rf.flavor)
	default:
		return usageError(fmt.Errorf("--flavor %q: want auto, vllm, ollama or openai", rf.flavor))
	}
	if err := rf.target(ctx, env); err != nil {
		return err
	}
	if rf.keyEnv != "" {
		key := os.Getenv(rf.keyEnv)
		if key == "" {
			return usageError(fmt.Errorf("--api-key-env %s: the variable is empty or unset", rf.keyEnv))
		}
		o.Target.APIKey = key
	}
	o.Params = rf.params
	o.GPU = env.GPU
	o.GpuhostVersion, o.GpuhostCommit = deps.GpuhostVersion, deps.GpuhostCommit
	if err := o.Check(); err != nil {
		return usageError(err)
	}
	return nil
}

// target sets the endpoint to measure: --url (with --profile's
// description), or the daemon's /v1 on its active profile.
func (rf *runFlags) target(ctx context.Context, env Env) error {
	o := &rf.o
	if rf.url != "" {
		o.Target.URL, o.Target.ServerURL, o.Target.Model = rf.url, rf.serverURL, rf.model
		if rf.profile != "" {
			p, ok := env.Profiles[rf.profile]
			if !ok {
				return usageError(fmt.Errorf("--profile %q: no such profile in the config", rf.profile))
			}
			o.ProfileName, o.Profile = rf.profile, p
		}
		return nil
	}
	if env.Active == nil {
		return usageError(errors.New("no --url given and the daemon's /v1 is unknown: give --url and --model, or --config"))
	}
	t, p, err := env.Active(ctx)
	if err != nil {
		return fmt.Errorf("find the active profile (or give --url): %w", err)
	}
	if p == nil {
		return errors.New("the daemon has no active profile: switch to one first, or give --url")
	}
	if o.Target.Flavor != "" {
		t.Flavor = o.Target.Flavor
	}
	if rf.model != "" {
		t.Model = rf.model
	}
	o.Target, o.ProfileName, o.Profile = t, p.Name, p
	return nil
}

// save stores r as saveResult does, in the daemon's store when the run
// measured the daemon (see daemonStore); when the daemon refuses it (an
// older daemon without POST /api/bench/results), locally, saying so.
func (rf *runFlags) save(ctx context.Context, cmd *cobra.Command, deps Deps, store *bench.Store, r *bench.Result, runErr error) (string, error) {
	if rf.noSave || (r.Status == bench.StatusFailed && !rf.keepFailed) {
		return "", nil
	}
	if c := rf.daemonStore(ctx, cmd, deps); c != nil {
		where, err := uploadResult(ctx, c, r)
		if err == nil {
			return where + " (the daemon's store)", nil
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "warning: the daemon at %s did not store the result: %v; storing it here\n", c.BaseURL, err)
	}
	return saveResult(store, r, runErr, rf.noSave, rf.keepFailed)
}

// saveResult stores r unless --no-save, or it failed without --keep-failed,
// and returns the file's path ("" when not stored). A failed save is joined
// with the run's own error.
func saveResult(store *bench.Store, r *bench.Result, runErr error, noSave, keepFailed bool) (string, error) {
	if noSave || (r.Status == bench.StatusFailed && !keepFailed) {
		return "", nil
	}
	path, err := store.Save(r)
	if err != nil {
		return "", errors.Join(runErr, err)
	}
	return path, nil
}

// printResult writes r to out as JSON, or as the report with where it was
// stored (or why not).
func printResult(out io.Writer, r *bench.Result, path string, asJSON, noSave bool) error {
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	if err := bench.WriteReport(out, r); err != nil {
		return err
	}
	switch {
	case path != "":
		fmt.Fprintf(out, "\nsaved %s\n", path)
	case !noSave:
		fmt.Fprintf(out, "\nnot saved: the run failed (--keep-failed stores failed runs)\n")
	}
	return nil
}

// resultExit turns a failed or partial result into its error, named
// after what ("bench run"); missing explains a partial result without an
// error of its own.
func resultExit(r *bench.Result, runErr error, what, missing string) error {
	switch r.Status {
	case bench.StatusFailed:
		if runErr == nil {
			runErr = errors.New("nothing was measured")
		}
		// The cause's class decides (an endpoint down is 69), else 1.
		return fmt.Errorf("%s failed: %w", what, runErr)
	case bench.StatusPartial:
		why := missing
		if runErr != nil {
			why = runErr.Error()
		}
		return exitclass.ProblemErr(fmt.Errorf("%s partial: %s", what, why))
	}
	return nil
}

func newListCmd(deps Deps) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List stored results, oldest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rd, err := readerFor(cmdContext(cmd), cmd, deps)
			if err != nil {
				return err
			}
			sums, warns, err := rd.List(cmdContext(cmd))
			if err != nil {
				return err
			}
			for _, w := range warns {
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: skipped %s\n", w)
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(bench.ListResponse{Results: append([]bench.Summary{}, sums...), Warnings: append([]bench.Warning{}, warns...)})
			}
			if len(sums) == 0 {
				fmt.Fprintf(out, "no results in %s\n", rd.Where())
				return nil
			}
			return bench.WriteList(out, sums)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	addReadFlags(cmd)
	return cmd
}

func newShowCmd(deps Deps) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show ID|latest",
		Short: "Show one stored result",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			rd, err := readerFor(cmdContext(cmd), cmd, deps)
			if err != nil {
				return err
			}
			r, err := rd.Load(cmdContext(cmd), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(r)
			}
			return bench.WriteReport(cmd.OutOrStdout(), r)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the stored JSON")
	addReadFlags(cmd)
	return cmd
}

func newCompareCmd(deps Deps) *cobra.Command {
	var (
		asJSON bool
		co     bench.CompareOptions
	)
	cmd := &cobra.Command{
		Use:   "compare A B",
		Short: "Compare two results: per metric both values, delta with its confidence interval and a verdict",
		Long: `Compare result B against the baseline A. A metric is "better" or "worse" only when the
confidence interval of its change lies entirely beyond ±--min-effect percent, after Holm's
correction over all metrics compared (Welch's t-test across the repeats): with no change of
that size anywhere, the chance of any such verdict is at most --alpha. "~" means no such
change was shown, "?" that a side has fewer than --min-repeats repeats. Failed runs are refused.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !(co.Alpha > 0 && co.Alpha < 1) {
				return usageError(fmt.Errorf("--alpha %v: want a level between 0 and 1, e.g. 0.05", co.Alpha))
			}
			if !(co.MinEffectPct >= 0 && co.MinEffectPct < 100) {
				return usageError(fmt.Errorf("--min-effect %v: want a percentage from 0 to below 100, e.g. 3", co.MinEffectPct))
			}
			if co.MinRepeats < 2 {
				return usageError(fmt.Errorf("--min-repeats %d: want 2 or more", co.MinRepeats))
			}
			opts := co
			if opts.MinEffectPct == 0 {
				opts.MinEffectPct = -1 // explicitly none; 0 would mean the default
			}
			rd, err := readerFor(cmdContext(cmd), cmd, deps)
			if err != nil {
				return err
			}
			a, err := rd.Load(cmdContext(cmd), args[0])
			if err != nil {
				return err
			}
			b, err := rd.Load(cmdContext(cmd), args[1])
			if err != nil {
				return err
			}
			c, err := bench.Compare(a, b, opts)
			if err != nil {
				return fmt.Errorf("compare %s %s: %w", a.ID, b.ID, err)
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				err = enc.Encode(c)
			} else {
				err = c.WriteText(cmd.OutOrStdout())
			}
			if err != nil {
				return err
			}
			return worseExit(c)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().Float64Var(&co.Alpha, "alpha", bench.DefaultAlpha, "family-wise significance level over all metrics (Holm)")
	cmd.Flags().Float64Var(&co.MinEffectPct, "min-effect", bench.DefaultMinEffectPct, "smallest change in percent a verdict needs (0: any significant change)")
	cmd.Flags().IntVar(&co.MinRepeats, "min-repeats", bench.DefaultMinRepeats, "fewest repeats on each side for a verdict")
	addReadFlags(cmd)
	return cmd
}

// bar is the terminal progress bar; it stays silent when w is not a
// terminal (or with --json), so logs and pipes get no control codes.
type bar struct {
	pb *progressbar.ProgressBar
	w  io.Writer
	on bool
}

func newBar(w io.Writer, want bool) *bar {
	b := &bar{w: w}
	if f, ok := w.(*os.File); ok && want && term.IsTerminal(int(f.Fd())) {
		b.on = true
	}
	return b
}

func (b *bar) update(p bench.Progress) {
	if !b.on {
		return
	}
	if b.pb == nil {
		b.pb = progressbar.NewOptions(p.Total,
			progressbar.OptionSetWriter(b.w),
			progressbar.OptionShowCount(),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionSetWidth(30),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
			progressbar.OptionShowDescriptionAtLineEnd(),
		)
	}
	if p.Total != b.pb.GetMax() {
		b.pb.ChangeMax(p.Total)
	}
	b.pb.Describe(p.Message)
	_ = b.pb.Set(p.Done)
}

func (b *bar) finish() {
	if b.pb != nil {
		_ = b.pb.Finish()
		_ = b.pb.Clear()
	}
}

// worseExit makes a comparison that found a metric worse end with
// status 1 ("ran and found a problem"), so a CI step can gate on it.
func worseExit(c bench.Comparison) error {
	var worse []string
	for _, r := range c.Rows {
		if r.Verdict == "worse" {
			worse = append(worse, r.Metric)
		}
	}
	if len(worse) == 0 {
		return nil
	}
	return exitclass.ProblemErr(fmt.Errorf("%s is worse than %s in %s", c.B, c.A, strings.Join(worse, ", ")))
}
