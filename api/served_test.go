package api

import (
	"testing"

	"gpuhost/units"
)

// TestActiveServedName: the served name of the active profile (its model
// when none is set); "" in every other phase and for a profile the
// lookup does not know. Status.ActiveServedName reads the status's own
// profile list.
func TestActiveServedName(t *testing.T) {
	profiles := map[string]*units.Profile{
		"named":   {Name: "named", Model: "org/model-a", ServedName: "a"},
		"unnamed": {Name: "unnamed", Model: "org/model-b"},
	}
	tests := []struct {
		st   State
		want string
	}{
		{State{Phase: PhaseActive, Profile: "named"}, "a"},
		{State{Phase: PhaseActive, Profile: "unnamed"}, "org/model-b"},
		{State{Phase: PhaseActive, Profile: "gone"}, ""},
		{State{Phase: PhaseSwitching, Profile: "named"}, ""},
		{State{Phase: PhaseIdle}, ""},
	}
	for _, tc := range tests {
		if got := ActiveServedName(tc.st, ProfilesIn(profiles)); got != tc.want {
			t.Errorf("ActiveServedName(%+v) = %q, want %q", tc.st, got, tc.want)
		}
		var infos []ProfileInfo
		for _, p := range profiles {
			infos = append(infos, ProfileInfo{Name: p.Name, Model: p.Model, ServedName: p.ServedName})
		}
		if got := (Status{State: tc.st, Profiles: infos}).ActiveServedName(); got != tc.want {
			t.Errorf("Status{%+v}.ActiveServedName() = %q, want %q", tc.st, got, tc.want)
		}
	}
}
