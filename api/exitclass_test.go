package api

import (
	"errors"
	"fmt"
	"testing"

	"gpuhost/internal/exitclass"
)

// TestClientErrorsCarryTheirExitClass: what the CLI ends with for each
// answer of the daemon, written out.
func TestClientErrorsCarryTheirExitClass(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
		want int
	}{
		{"no answer", &UnreachableError{URL: "http://127.0.0.1:1", Err: errors.New("refused")}, 69},
		{"unknown profile", remoteError(404, []byte(`{"error":"unknown profile","detail":"no profile \"x\""}`)), 64},
		{"bad request", remoteError(400, []byte(`{"error":"bad request"}`)), 64},
		{"no such route (an older daemon)", remoteError(404, []byte(`{"error":"not found","detail":"no route GET /api/x"}`)), 1},
		{"a 404 without a JSON body", remoteError(404, []byte(`404 page not found`)), 1},
		{"switch in progress", remoteError(409, []byte(`{"error":"switch in progress"}`)), 1},
		{"server error, wrapped", fmt.Errorf("switch: %w", remoteError(500, []byte(`{"error":"switch not started"}`))), 1},
	} {
		if got := int(exitclass.Of(tt.err)); got != tt.want {
			t.Errorf("%s: exit %d, want %d (%v)", tt.name, got, tt.want, tt.err)
		}
	}
}
