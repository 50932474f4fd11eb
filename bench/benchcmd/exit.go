package benchcmd

import "gpuhost/internal/exitclass"

// The statuses `gpuhost bench …` ends with are the CLI's one contract
// (internal/exitclass), so scripts and CI can tell a complete run from a
// partial or failed one:
//
//	0   ok: the run measured everything it was asked for (or list/show/compare worked)
//	1   a problem found: some figures are missing, the run was aborted or
//	    measured nothing (the endpoint answered but is not an inference
//	    server, the model is not served), compare found a metric worse or
//	    was given a failed run
//	64  usage: a bad flag, flag value or argument count, an unknown
//	    profile or result (nothing was run)
//	69  the endpoint or the daemon is unreachable
//	78  the config is needed and missing or invalid
func usageError(err error) error { return exitclass.UsageErr(err) }
