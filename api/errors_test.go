package api

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
)

func TestSwitchErrorStatus(t *testing.T) {
	tests := []struct {
		err    error
		status int
		title  string
	}{
		{fmt.Errorf("switch to %q: %w", "x", ErrUnknownProfile), http.StatusNotFound, "unknown profile"},
		{fmt.Errorf("wrapped: %w", &BusyError{Target: "a", SwitchID: "s1", Step: "ready"}), http.StatusConflict, "switch in progress"},
		{&DoctorError{Profile: "p"}, http.StatusUnprocessableEntity, "profile fails doctor checks"},
		{errors.New("state dir not writable"), http.StatusInternalServerError, "switch not started"},
	}
	for _, tt := range tests {
		status, title := SwitchErrorStatus(tt.err)
		if status != tt.status || title != tt.title {
			t.Errorf("SwitchErrorStatus(%v) = %d %q, want %d %q", tt.err, status, title, tt.status, tt.title)
		}
	}
}
