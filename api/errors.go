package api

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"gpuhost/units"
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
		m := c.ID + ": " + c.Message
		if c.Fix != "" {
			// The fix is what the operator runs next (for a model not in
			// the cache: the command that fetches it), so every front
			// door that shows the error shows it too.
			m += " (fix: " + c.Fix + ")"
		}
		msgs = append(msgs, m)
	}
	return fmt.Sprintf("profile %q fails doctor checks (use force to override): %s", e.Profile, strings.Join(msgs, "; "))
}

// ErrNoBackend is returned by AwaitActive when nothing runs and no switch
// is under way, so a held request would wait for nothing.
var ErrNoBackend = errors.New("no backend is active")

// SwitchErrorStatus is the one mapping from an error of Supervisor.Switch
// to the HTTP status and short title a front door answers with, so the API
// and the panel cannot drift apart: an unknown profile is 404, a running
// switch 409 (the caller may retry), a profile failing the doctor's checks
// 422 (force overrides), anything else 500. The /v1 proxy's auto-switch
// decides differently on purpose (it waits for a running switch and skips
// a refused candidate) and only uses the errors' types.
func SwitchErrorStatus(err error) (status int, title string) {
	var be *BusyError
	var de *DoctorError
	switch {
	case errors.Is(err, ErrUnknownProfile):
		return http.StatusNotFound, "unknown profile"
	case errors.As(err, &be):
		return http.StatusConflict, "switch in progress"
	case errors.As(err, &de):
		return http.StatusUnprocessableEntity, "profile fails doctor checks"
	default:
		return http.StatusInternalServerError, "switch not started"
	}
}
