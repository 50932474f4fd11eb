package api

import "gpuhost/units"

// ActiveServedName is the one rule for the model name the daemon's /v1
// serves now: the served name (the model when none is set) of the active
// profile; "" while no profile is active (idle, switching, failed) or the
// active one is not among the profiles lookup knows. The triage worker in
// the daemon, the one beside it and a hand-fed mail all classify on it.
func ActiveServedName(st State, lookup func(name string) (units.Profile, bool)) string {
	if st.Phase != PhaseActive {
		return ""
	}
	p, ok := lookup(st.Profile)
	if !ok {
		return ""
	}
	return p.ServedModelName()
}

// ActiveServedName applies the rule to a status as the API reports it.
func (s Status) ActiveServedName() string {
	return ActiveServedName(s.State, func(name string) (units.Profile, bool) {
		for _, p := range s.Profiles {
			if p.Name == name {
				return units.Profile{Name: p.Name, Model: p.Model, ServedName: p.ServedName}, true
			}
		}
		return units.Profile{}, false
	})
}

// ProfilesIn looks profiles up in a config's profile map.
func ProfilesIn(profiles map[string]*units.Profile) func(name string) (units.Profile, bool) {
	return func(name string) (units.Profile, bool) {
		if p := profiles[name]; p != nil {
			return *p, true
		}
		return units.Profile{}, false
	}
}

// ServedModelName is the model name clients send for the profile: its
// served name, or its model when none is set (units.Profile's rule).
func (p ProfileInfo) ServedModelName() string {
	return units.Profile{Model: p.Model, ServedName: p.ServedName}.ServedModelName()
}
