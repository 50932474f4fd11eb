package main

import (
	"errors"
	"net"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"gpuhost/api"
	"gpuhost/bench/benchcmd"
	"gpuhost/config"
)

// The exit statuses of every gpuhost command: one contract, so that a
// script can tell "it ran and found a problem" from "it could not run".
// 64, 69 and 78 are sysexits.h's EX_USAGE, EX_UNAVAILABLE and EX_CONFIG.
const (
	exitOK          = 0
	exitProblem     = 1
	exitUsage       = 64
	exitUnavailable = 69
	exitConfig      = 78
)

// exitCodesHelp is `gpuhost help exit-codes` (and docs/cli.md says the same).
const exitCodesHelp = `Every gpuhost command ends with one of these exit statuses:

  0   success (the doctor may still print warnings)
  1   the command ran and found a problem: a doctor failure, 'status'
      while the wanted profile does not serve, a failed
      switch, a worse 'bench compare', a partial or failed bench run, an
      ask without an answer, an 'mcp test' target that failed
  64  usage error: an unknown command or flag, a bad flag value or argument
      count, an unknown profile; nothing was run
  69  the daemon or a service the command needs is unreachable (no answer
      at --url / $GPUHOST_URL / the config's listen, systemd not reachable,
      the benchmarked endpoint down)
  78  configuration error: the config file is missing where one is needed,
      unreadable, or invalid (the message names the file, key and line)

130 means a switch was left to run in the daemon after Ctrl-C.`

// usageError marks an error as the caller's wrong use of a command (64).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// configError marks an error as a configuration error (78).
type configError struct{ err error }

func (e configError) Error() string { return e.err.Error() }
func (e configError) Unwrap() error { return e.err }

// unavailableError marks an error as "a needed service is unreachable" (69).
type unavailableError struct{ err error }

func (e unavailableError) Error() string { return e.err.Error() }
func (e unavailableError) Unwrap() error { return e.err }

// exitCodeOf maps a command's error to the contract above. The most
// specific mark wins: an explicit status, then usage, configuration and
// reachability, then bench's own statuses; anything else is a problem
// the command found (1).
func exitCodeOf(err error) int {
	var ee exitError
	var ce *config.Error
	var ue *api.UnreachableError
	var be *benchcmd.ExitError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, new(usageError)) || isCobraUsage(err):
		return exitUsage
	case errors.As(err, new(configError)) || errors.As(err, &ce):
		return exitConfig
	case errors.As(err, new(unavailableError)) || errors.As(err, &ue) || refused(err):
		return exitUnavailable
	case errors.As(err, &be):
		switch be.ExitCode() {
		case benchcmd.ExitUsage:
			return exitUsage
		case benchcmd.ExitOK:
			return exitOK
		}
		return exitProblem
	}
	return exitProblem
}

// refused reports a connection that could not be made (nothing listens,
// no route): the daemon, or the endpoint a command needs, is unreachable.
func refused(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial" || errors.Is(err, syscall.ECONNREFUSED)
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
	for _, sub := range c.Commands() {
		markUsageErrors(sub)
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

// doctorExit is the doctor's CLI status: its report's 2 (a failure) is
// the contract's 1; warnings (the report's 1) are printed, not a failure.
func doctorExit(reportExit int) error {
	if reportExit >= 2 {
		return exitError{exitProblem}
	}
	return nil
}
