// Command gpuhost turns a single-GPU box into a dependable local-inference
// appliance: it decides which inference server runs (vLLM or Ollama, as
// systemd units, never both), proves it with NVML, checks the known-good
// settings and serves one stable API.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"gpuhost/bench/benchcmd"
	"gpuhost/frontdoor/telegram"
	"gpuhost/internal/exitclass"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

// exitError carries a specific exit status (exitcodes.go) out of a cobra
// command without printing anything more.
type exitError struct{ code int }

func (e exitError) Error() string              { return fmt.Sprintf("exit status %d", e.code) }
func (e exitError) ExitClass() exitclass.Class { return exitclass.Class(e.code) }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := newRootCmd().ExecuteContext(ctx)
	stop()
	if err == nil {
		return
	}
	if !errors.As(err, new(exitError)) { // an exitError has said what it had to
		fmt.Fprintln(os.Stderr, "gpuhost:", err)
	}
	os.Exit(exitCodeOf(err))
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "gpuhost",
		Short:         "Single-GPU inference appliance: vLLM/Ollama switching over systemd, NVML-verified",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().String("config", "", "config file (default /etc/gpuhost/gpuhost.yaml)")
	root.PersistentFlags().String("log-level", "info", "log level: debug, info, warn, error")
	root.AddCommand(
		newServeCmd(), newDemoCmd(), newStatusCmd(), newSwitchCmd(), newHealCmd(), newDoctorCmd(),
		newUnitsCmd(), newSimulateCmd(), newVersionCmd(), newOpencodeConfigCmd(), newClientConfigCmd(),
		benchcmd.NewCmd(benchcmd.Deps{GpuhostVersion: version, Env: benchEnv, Daemon: apiClient}),
		newMCPCmd(), newAskCmd(), newTriageCmd(), newExitCodesTopic(),
		// Pairing is approved on the machine, never in the chat.
		telegram.NewPairCmd(func(cmd *cobra.Command) (string, error) {
			cfg, err := loadConfig(cmd)
			if err != nil {
				return "", err
			}
			return cfg.StateDir, nil
		}),
	)
	// cobra adds help and completion when it executes; added here, they
	// are in the tree that markUsageErrors marks and that docs/cli.md and
	// the exit-code test walk.
	root.SetHelpCommand(newHelpCmd())
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	markUsageErrors(root)
	return root
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the gpuhost version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(cmd.OutOrStdout(), "gpuhost", version)
			return nil
		},
	}
}

// newLogger logs with slog to stderr; journald adds the timestamp under
// systemd, so the time is left out there.
func newLogger(cmd *cobra.Command) (*slog.Logger, error) {
	lvl, _ := cmd.Flags().GetString("log-level")
	var level slog.Level
	if err := level.UnmarshalText([]byte(lvl)); err != nil {
		return nil, usageError{fmt.Errorf("--log-level %q: want debug, info, warn or error", lvl)}
	}
	opts := &slog.HandlerOptions{Level: level}
	if os.Getenv("JOURNAL_STREAM") != "" {
		opts.ReplaceAttr = func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
}
