package benchcmd

import (
	"context"
	"errors"
	"fmt"
	"gpuhost/api"
	"gpuhost/bench"

	"github.com/spf13/cobra"
)

// switchFlags holds what bench switch's flags set.
type switchFlags struct {
	o              bench.SwitchOptions
	asJSON, noSave bool
	keepFailed     bool
}

func newSwitchCmd(deps Deps) *cobra.Command {
	var sf switchFlags
	cmd := &cobra.Command{
		Use:   "switch A B",
		Short: "Measure switching between two profiles of the daemon: time to the first token, cold or from standby",
		Long: `Switch the running daemon between its profiles A and B, --rounds times each way, and
measure the time to the first token of a streamed /v1 request to the target's model:

  switch path   from POST /api/switch to the first token of a request sent as soon as the
                switch is accepted (the proxy holds it during the switch);
  request path  with the other profile active, from a request naming the target's model to
                its first token (the proxy's auto_switch switches; skipped, with a note, when
                proxy.auto_switch is off).

Each sample's mode is read from the switch's events: "standby" when the switch had a wake
step (the target was woken from standby), else "cold" (the target's unit was started). The
report gives p50 / p95 per direction, path and mode, with the switch's own duration from its
events, and names the outliers (a sample over 3x its group's median, with the step that
took the time and that step's message from the daemon's events). The result is stored
in the daemon's store, as bench run's results are (--dir: that folder instead), so list,
show, compare and the panel's Bench page find it; compare tests two of them.
A is made active first (not measured) and is active again at the end.

Exit status: 0 ok; 1 partial (a switch or request failed after some samples); 2 failed
(nothing measured); 64 usage (bad flag or argument, or a profile the daemon does not have).`,
		Example: `  gpuhost bench switch coder llama
  gpuhost bench switch coder llama --rounds 5 --json
  gpuhost bench switch coder llama --url http://gpu-box:8080`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runSwitchCmd(cmd, deps, &sf, args)
		},
	}
	addSwitchFlags(cmd, &sf)
	return cmd
}

// addSwitchFlags registers bench switch's flags on cmd, bound to sf.
func addSwitchFlags(cmd *cobra.Command, sf *switchFlags) {
	f := cmd.Flags()
	f.String("url", "", "daemon API base URL (default: $GPUHOST_URL, else the config's listen, else http://127.0.0.1:8080)")
	f.IntVar(&sf.o.Rounds, "rounds", bench.DefaultSwitchRounds, "rounds; each measures A→B and B→A on the switch path and the request path")
	f.DurationVar(&sf.o.Timeout, "timeout", bench.DefaultSwitchTimeout, "limit for one sample (the switch and the first token after it)")
	f.BoolVar(&sf.asJSON, "json", false, "print the result as JSON (no progress bar)")
	f.BoolVar(&sf.noSave, "no-save", false, "do not store the result")
	f.BoolVar(&sf.keepFailed, "keep-failed", false, "store the result even when nothing was measured")
	addDirFlag(cmd)
}

// runSwitchCmd is bench switch A B: it checks the options, finds the
// daemon and the results directory, measures, then stores and prints the
// result and turns its status into the exit error.
func runSwitchCmd(cmd *cobra.Command, deps Deps, sf *switchFlags, args []string) error {
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	o := &sf.o
	o.A, o.B = args[0], args[1]
	if o.Rounds < 1 || o.Rounds > bench.SwitchRoundsLimit {
		return usageError(fmt.Errorf("--rounds %d: want 1 to %d", o.Rounds, bench.SwitchRoundsLimit))
	}
	if err := o.Check(); err != nil {
		return usageError(err)
	}
	if deps.Daemon == nil {
		return errors.New("bench switch: this build has no daemon client")
	}
	c, err := deps.Daemon(cmd)
	if err != nil {
		return fmt.Errorf("find the daemon: %w", err)
	}
	o.Daemon = c
	// The config only says where results go; the daemon is found by
	// --url, $GPUHOST_URL or its listen.
	env, _ := loadEnv(cmd, deps, true)
	store, err := storeFor(cmd, env)
	if err != nil {
		return err
	}
	o.GpuhostVersion, o.GpuhostCommit = deps.GpuhostVersion, deps.GpuhostCommit
	bar := newBar(cmd.ErrOrStderr(), !sf.asJSON)
	o.Progress = bar.update
	r, runErr := bench.RunSwitch(ctx, *o)
	bar.finish()
	if errors.Is(runErr, bench.ErrUnknownProfile) {
		return usageError(runErr)
	}
	path, err := sf.save(ctx, cmd, c, store, r, runErr)
	if err != nil {
		return err
	}
	if err := printResult(cmd.OutOrStdout(), r, path, sf.asJSON, sf.noSave); err != nil {
		return err
	}
	return resultExit(r, runErr, "bench switch", "some samples are missing; see the errors above")
}

// save stores r where `bench run` stores a result measured through the
// daemon: in the daemon's store (POST /api/bench/results), so that list,
// show, compare and the panel's Bench page find it by the ID printed here.
// --dir keeps it local; a daemon that refuses the upload (an older one
// without the route) gets it stored locally, saying so.
func (sf *switchFlags) save(ctx context.Context, cmd *cobra.Command, c *api.Client, store *bench.Store, r *bench.Result, runErr error) (string, error) {
	if sf.noSave || (r.Status == bench.StatusFailed && !sf.keepFailed) {
		return "", nil
	}
	if dir, _ := cmd.Flags().GetString("dir"); dir == "" {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), daemonProbeTimeout)
		where, err := uploadResult(uctx, c, r)
		cancel()
		if err == nil {
			return where + " (the daemon's store)", nil
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "warning: the daemon at %s did not store the result: %v; storing it here\n", c.BaseURL, err)
	}
	return saveResult(store, r, runErr, sf.noSave, sf.keepFailed)
}
