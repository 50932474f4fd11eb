package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"gpuhost/internal/exitclass"
)

// The exit statuses of every gpuhost command: one contract, so that a
// script can tell "it ran and found a problem" from "it could not run".
// The classes live in internal/exitclass, where every package that knows
// why it failed takes them from; these are their names in package main.
const (
	exitOK          = int(exitclass.OK)
	exitProblem     = int(exitclass.Problem)
	exitUsage       = int(exitclass.Usage)
	exitUnavailable = int(exitclass.Unavailable)
	exitConfig      = int(exitclass.Config)
)

// exitCodesHelp is `gpuhost help exit-codes` (and docs/cli.md says the same).
const exitCodesHelp = `Every gpuhost command ends with one of these exit statuses:

  0   success (the doctor may still print warnings)
  1   the command ran and found a problem: a doctor failure, 'status'
      while the wanted profile does not serve, a failed
      switch, a worse 'bench compare', a partial or failed bench run, an
      ask without an answer, an 'mcp test' target that failed
  64  usage error: an unknown command, flag or help topic, a bad flag value
      or argument count, an unknown name (profile, client, bench result,
      connector, pairing code, Telegram user); nothing was run
  69  the daemon or a service the command needs is unreachable (no answer
      at --url / $GPUHOST_URL / the config's listen, systemd not reachable,
      the benchmarked endpoint down)
  78  configuration error: the config file is missing where one is needed,
      unreadable, or invalid (the message names the file, key and line);
      for 'simulate', a fenced unit without the offline settings;
      a listen address beyond loopback without a bearer token

130 means a switch was left to run in the daemon after Ctrl-C.`

// usageError marks an error as the caller's wrong use of a command (64).
type usageError struct{ err error }

func (e usageError) Error() string              { return e.err.Error() }
func (e usageError) Unwrap() error              { return e.err }
func (e usageError) ExitClass() exitclass.Class { return exitclass.Usage }

// configError marks an error as a configuration error (78).
type configError struct{ err error }

func (e configError) Error() string              { return e.err.Error() }
func (e configError) Unwrap() error              { return e.err }
func (e configError) ExitClass() exitclass.Class { return exitclass.Config }

// exitCodeOf is the status a command's error ends the process with: the
// class the error carries (exitclass.Of), or usage for the few errors
// cobra returns unmarked.
func exitCodeOf(err error) int {
	if err != nil && !exitclass.Has(err) && isCobraUsage(err) {
		return exitUsage
	}
	return int(exitclass.Of(err))
}

// isCobraUsage recognises the usage errors cobra returns unwrapped: an
// unknown command and a missing required flag.
func isCobraUsage(err error) bool {
	msg := err.Error()
	return strings.HasPrefix(msg, "unknown command ") || strings.HasPrefix(msg, "required flag(s) ")
}

// markUsageErrors makes every flag-parsing and argument-count error of
// the command tree a usageError, so each command exits 64 on them.
func markUsageErrors(c *cobra.Command) {
	c.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	if args := c.Args; args != nil {
		c.Args = func(cmd *cobra.Command, a []string) error {
			if err := args(cmd, a); err != nil {
				return usageError{err}
			}
			return nil
		}
	}
	if !c.Runnable() && c.HasSubCommands() && c.HasParent() {
		// A group (bench, pair, …) given a word that is none of its
		// commands is a usage error; cobra would print the group's help
		// and exit 0. Bare, it prints its help.
		c.Args = func(cmd *cobra.Command, a []string) error {
			if err := cobra.NoArgs(cmd, a); err != nil {
				return usageError{err}
			}
			return nil
		}
		c.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	}
	for _, sub := range c.Commands() {
		markUsageErrors(sub)
	}
}

// newHelpCmd replaces cobra's help command, which prints "Unknown help
// topic" and exits 0: an unknown topic or command is a usage error (64).
func newHelpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "help [command]",
		Short: "Help about any command",
		Long:  "Help provides help for any command in the application.\nSimply type gpuhost help [path to command] for full details.",
		RunE: func(c *cobra.Command, args []string) error {
			cmd, rest, err := c.Root().Find(args)
			if err != nil || cmd == nil || len(rest) > 0 {
				return usageError{fmt.Errorf("unknown help topic %q (gpuhost help lists the commands)", strings.Join(args, " "))}
			}
			cmd.InitDefaultHelpFlag()
			return cmd.Help()
		},
	}
}

// newExitCodesTopic is the help topic `gpuhost help exit-codes`.
func newExitCodesTopic() *cobra.Command {
	return &cobra.Command{
		Use:   "exit-codes",
		Short: "The exit statuses every command ends with (0, 1, 64, 69, 78)",
		Long:  exitCodesHelp,
	}
}

// doctorExit is the doctor's CLI status: the report's exit, which is the
// contract's 0 (ok, warnings printed) or 1 (a check failed).
func doctorExit(reportExit int) error {
	if reportExit != exitOK {
		return exitError{exitProblem}
	}
	return nil
}
