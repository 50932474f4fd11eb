package api

import (
	"errors"
	"fmt"
	"gpuhost/units"
	"strings"
)

// ErrUnknownProfile is returned (wrapped) for a profile name not in the config.
var ErrUnknownProfile = errors.New("unknown profile")

// BusyError answers a switch request while another switch runs. We answer
// rather than queue or coalesce: the caller sees exactly what is happening
// and may retry; a silently replaced switch is worse for an operator.
type BusyError struct {
	Target   string
	SwitchID string
	Step     string
}

func (e *BusyError) Error() string {
	return fmt.Sprintf("a switch to %q is already running (id %s, step %s)", e.Target, e.SwitchID, e.Step)
}

// DoctorError refuses a switch whose profile fails the settings checks.
type DoctorError struct {
	Profile string
	Checks  []units.Check
}

func (e *DoctorError) Error() string {
	var msgs []string
	for _, c := range e.Checks {
		msgs = append(msgs, c.ID+": "+c.Message)
	}
	return fmt.Sprintf("profile %q fails doctor checks (use force to override): %s", e.Profile, strings.Join(msgs, "; "))
}

// ErrNoBackend is returned by AwaitActive when nothing runs and no switch
// is under way, so a held request would wait for nothing.
var ErrNoBackend = errors.New("no backend is active")
