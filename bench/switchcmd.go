package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

// switchFlags holds what bench switch's flags set.
type switchFlags struct {
	o              SwitchOptions
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
events; the result is stored with the other bench results, and compare tests two of them.
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
	f.IntVar(&sf.o.Rounds, "rounds", DefaultSwitchRounds, "rounds; each measures A→B and B→A on the switch path and the request path")
	f.DurationVar(&sf.o.Timeout, "timeout", DefaultSwitchTimeout, "limit for one sample (the switch and the first token after it)")
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
	if o.Rounds < 1 || o.Rounds > maxSwitchRounds {
		return usageError(fmt.Errorf("--rounds %d: want 1 to %d", o.Rounds, maxSwitchRounds))
	}
	if _, err := o.withDefaults(); err != nil {
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
	r, runErr := RunSwitch(ctx, *o)
	bar.finish()
	if errors.Is(runErr, ErrUnknownProfile) {
		return usageError(runErr)
	}
	path, err := saveResult(store, r, runErr, sf.noSave, sf.keepFailed)
	if err != nil {
		return err
	}
	if err := printResult(cmd.OutOrStdout(), r, path, sf.asJSON, sf.noSave); err != nil {
		return err
	}
	return resultExit(r, runErr, "bench switch", "some samples are missing; see the errors above")
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
	if sb.RequestPath == RequestPathSkipped {
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
