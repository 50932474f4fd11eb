package main

import (
	"strings"
	"testing"

	"gpuhost/api"
)

// TestPrintStatusReportsWantedDrift: with restore_on_boot off a last wanted
// profile that does not run stays so; `gpuhost status` says it.
func TestPrintStatusReportsWantedDrift(t *testing.T) {
	tests := []struct {
		name  string
		state api.State
		want  string // "" = no wanted line
	}{
		{"wanted runs", api.State{Phase: api.PhaseActive, Profile: "coder", Unit: "v.service", LastWanted: "coder"}, ""},
		{"other profile runs", api.State{Phase: api.PhaseActive, Profile: "coder", Unit: "v.service", LastWanted: "llama"},
			"wanted:  last wanted profile llama does not run; coder (v.service) does; `gpuhost switch llama` completes it"},
		{"nothing runs", api.State{Phase: api.PhaseIdle, LastWanted: "llama"}, "no backend runs"},
		{"switching", api.State{Phase: api.PhaseSwitching, Target: "llama", LastWanted: "llama"}, ""},
		{"never wanted", api.State{Phase: api.PhaseActive, Profile: "coder"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			printStatus(&b, api.Status{State: tt.state})
			got := b.String()
			if tt.want == "" {
				if strings.Contains(got, "wanted:") {
					t.Errorf("unexpected wanted line:\n%s", got)
				}
				return
			}
			if !strings.Contains(got, tt.want) {
				t.Errorf("output lacks %q:\n%s", tt.want, got)
			}
		})
	}
}
