package benchcmd

import "errors"

// Exit statuses of `gpuhost bench …`, so that scripts and CI can tell a
// complete run from a partial or failed one:
//
//	0   ok: the run measured everything it was asked for (or list/show/compare worked)
//	1   partial: some figures are missing, or the run was aborted (the endpoint
//	    stopped answering); the result is printed and stored
//	2   failed: nothing was measured (pre-flight failed: endpoint down, not an
//	    inference server, model not served …), or list/show/compare could not
//	    do their job (no such result, a failed run refused by compare)
//	64  usage: a bad flag, flag value or argument count (nothing was run)
const (
	ExitOK      = 0
	ExitPartial = 1
	ExitFailed  = 2
	ExitUsage   = 64
)

// ExitError is an error with the exit status the command should end with;
// package main ends the process with ExitCode after printing Error.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// ExitCode is the process exit status.
func (e *ExitError) ExitCode() int { return e.Code }

func usageError(err error) error { return &ExitError{Code: ExitUsage, Err: err} }

// withExitCode gives err an exit status: its own if it has one, else code.
func withExitCode(err error, code int) error {
	if err == nil {
		return nil
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		return err
	}
	return &ExitError{Code: code, Err: err}
}
