package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"gpuhost/api"
	"gpuhost/config"
	"gpuhost/internal/assemble"
	"gpuhost/triage"
)

// newTriageCmd is `gpuhost triage`: the mail triage worker on its own,
// beside (or instead of) the one `gpuhost serve` hosts.
func newTriageCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "triage",
		Short: "Mail triage: poll the mailbox, classify each mail on the model, post to Slack/Telegram",
		Long: `The triage worker reads the triage: section of the config. It keeps its
checkpoint in <state_dir>/triage/, so run only one worker per mailbox: either
inside gpuhost serve (triage.enabled) or with "gpuhost triage run", not both.
Without a config file, "gpuhost triage mail --eml FILE" judges one mail through
the running daemon's /v1 and prints the post.`,
	}
	cmd.AddCommand(newTriageRunCmd(), newTriageOnceCmd(), newTriageMailCmd())
	return cmd
}

func newTriageRunCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "run",
		Short: "Poll the mailbox until SIGTERM/SIGINT (foreground)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadTriageConfig(cmd, "gpuhost triage run")
			if err != nil {
				return err
			}
			w, closeFn, err := openTriage(cmd, cfg)
			if err != nil {
				return err
			}
			defer closeFn()
			// Run returns nil when the signal context ends; the mail in
			// progress is left for the next start, its checkpoint intact.
			return w.Run(cmd.Context())
		},
	}
}

func newTriageOnceCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "once",
		Short: "Poll once: process every new mail, then exit",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadTriageConfig(cmd, "gpuhost triage once")
			if err != nil {
				return err
			}
			w, closeFn, err := openTriage(cmd, cfg)
			if err != nil {
				return err
			}
			defer closeFn()
			n, err := w.Once(cmd.Context())
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %d mail(s) processed\n", w.Name(), n)
			return err
		},
	}
}

func newTriageMailCmd() *cobra.Command {
	var (
		uid    uint32
		eml    string
		dryRun bool
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "mail (--uid N | --eml FILE) [--dry-run]",
		Short: "Send one mail through the pipeline by hand (the checkpoint is not moved)",
		Long: `Without a config file, --eml FILE is classified through the running daemon's /v1
(found by --url, $GPUHOST_URL, else ` + DefaultDaemonURL + `) on its active model, with the
triage defaults and no rules, CRM lookup or sinks: the judged post is printed, nothing is
posted. --uid needs the mailbox of a config's triage: section.`,
		Example: `  gpuhost triage mail --eml inquiry.eml --dry-run   # print what would be posted
  gpuhost triage mail --uid 4711                    # post mailbox UID 4711 again`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if (uid == 0) == (eml == "") {
				return usageError{errors.New("give exactly one of --uid N (a mailbox UID, > 0) or --eml FILE")}
			}
			var raw []byte
			if eml != "" {
				var err error
				if raw, err = readEML(eml); err != nil {
					return err
				}
			}
			w, closeFn, handFed, err := openTriageMail(cmd, eml != "")
			if err != nil {
				return err
			}
			defer closeFn()
			var res triage.Result
			if eml != "" {
				res, err = w.ProcessRaw(cmd.Context(), raw, dryRun)
			} else {
				res, err = w.ProcessUID(cmd.Context(), uid, dryRun)
			}
			if err != nil && res.Key == "" {
				return err
			}
			if perr := printMailResult(cmd.OutOrStdout(), res, dryRun, asJSON, handFed); perr != nil {
				return perr
			}
			return err
		},
	}
	cmd.Flags().Uint32Var(&uid, "uid", 0, "mailbox UID to process")
	cmd.Flags().StringVar(&eml, "eml", "", "RFC 5322 file (.eml) to process; - reads stdin")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "post nothing; print what would be posted")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON (no mail body)")
	urlFlag(cmd)
	return cmd
}

// printMailResult prints a hand-sent mail's result: JSON, or the post and
// where it went.
func printMailResult(out io.Writer, res triage.Result, dryRun, asJSON, handFed bool) error {
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	if dryRun {
		fmt.Fprintln(out, "Dry run — this would be posted:")
		fmt.Fprintln(out)
	}
	fmt.Fprint(out, res.Text)
	switch {
	case dryRun:
		if !strings.HasSuffix(res.Text, "\n") {
			fmt.Fprintln(out)
		}
	case handFed:
		fmt.Fprintln(out, "\nPosted to: nowhere (no config file, so no Slack, Telegram or console sink)")
	default:
		fmt.Fprintf(out, "\nPosted to: %v\n", res.Posted)
	}
	return nil
}

// maxEMLBytes bounds a hand-fed mail like the worker bounds fetched ones.
const maxEMLBytes = 64 << 20

func readEML(path string) ([]byte, error) {
	var r io.Reader
	if path == "-" {
		r = os.Stdin
	} else {
		f, err := os.Open(path)
		if err != nil {
			return nil, usageError{fmt.Errorf("--eml: %w", err)} // a file that cannot be opened is a bad flag value
		}
		defer f.Close()
		r = f
	}
	raw, err := io.ReadAll(io.LimitReader(r, maxEMLBytes+1))
	if err != nil {
		return nil, fmt.Errorf("--eml %s: read: %w", path, err)
	}
	if len(raw) > maxEMLBytes {
		return nil, fmt.Errorf("--eml %s: larger than %d bytes", path, maxEMLBytes)
	}
	return raw, nil
}

// openTriage builds the worker from the config the way `gpuhost serve`
// does (the assembly's OpenTriageBeside), following the active model of
// the daemon the one rule finds (resolveDaemon).
func openTriage(cmd *cobra.Command, cfg *config.Config) (*triage.Worker, func(), error) {
	log, err := newLogger(cmd)
	if err != nil {
		return nil, nil, err
	}
	if !cfg.Triage.Enabled {
		return nil, nil, configError{fmt.Errorf("%s: triage.enabled is false; configure the triage: section first", cfg.Path())}
	}
	active, err := triageActiveModel(cmd, cfg)
	if err != nil {
		return nil, nil, err
	}
	return assemble.OpenTriageBeside(cmd.Context(), cfg, log, version, active)
}

// triageActiveModel is the active model of the daemon the one rule finds
// (resolveDaemon: --url, $GPUHOST_URL, the config's listen; the token
// from $GPUHOST_API_TOKEN or the config), for a worker beside it.
func triageActiveModel(cmd *cobra.Command, cfg *config.Config) (func() string, error) {
	t, err := resolveDaemon(cmd)
	if err != nil {
		return nil, err
	}
	return daemonActiveModel(cfg, t.client()), nil
}

// daemonActiveModel asks the running daemon which profile is active, so a
// worker beside `gpuhost serve` follows model switches; without a daemon
// it is the default profile's served name.
func daemonActiveModel(cfg *config.Config, client *api.Client) func() string {
	fallback := ""
	if p := cfg.Profiles[cfg.DefaultProfile]; p != nil {
		fallback = p.ServedModelName()
	}
	return func() string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := client.Status(ctx)
		if err != nil {
			slog.Debug("triage: daemon status unavailable; using the default profile's model", "err", err)
			return fallback
		}
		if name := st.ActiveServedName(); name != "" {
			return name
		}
		return fallback
	}
}
