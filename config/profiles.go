package config

import (
	"fmt"
	"regexp"
	"sort"
	"strings"

	"gpuhost/units"
)

// profilesDefaults fills in the policy: the profiles share, and each
// profile's name and served name.
func (c *Config) profilesDefaults() {
	if c.Policy == nil {
		p := units.DefaultPolicy()
		c.Policy = &p
	}
	for name, p := range c.Profiles {
		if p == nil {
			continue
		}
		p.Name = name
		if p.ServedName == "" {
			p.ServedName = p.Model
		}
	}
}

var profileNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// profilesValidate checks profiles: (names and each profile, in name
// order), their aliases, and default_profile.
func (c *Config) profilesValidate(add func(key, format string, args ...any)) {
	if len(c.Profiles) == 0 {
		add("profiles", "at least one profile is needed")
	}
	names := make([]string, 0, len(c.Profiles))
	for name := range c.Profiles {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		p := c.Profiles[name]
		key := "profiles." + name
		if p == nil {
			add(key, "profile is empty")
			continue
		}
		if !profileNameRE.MatchString(name) {
			add(key, "profile name must be lower-case letters, digits, '.', '_' or '-' (max 63)")
		}
		for _, fe := range append(p.Validate(), p.PlacementConflicts()...) {
			add(key+"."+fe.Key, "%s", fe.Msg)
		}
	}
	c.checkAliases(add, names)
	if c.DefaultProfile != "" {
		if _, ok := c.Profiles[c.DefaultProfile]; !ok {
			add("default_profile", "%q is not a profile (profiles: %s)", c.DefaultProfile, strings.Join(names, ", "))
		}
	}
}

// checkAliases refuses a model name that would resolve to two profiles or be
// listed twice by /v1/models: one served name for two different models, an
// alias equal to a served name (its own profile's or another's), or one
// alias in two profiles.
func (c *Config) checkAliases(add func(key, format string, args ...any), names []string) {
	served := map[string]string{} // served name → first profile serving it
	for _, name := range names {
		p := c.Profiles[name]
		if p == nil {
			continue
		}
		owner, ok := served[p.ServedModelName()]
		if !ok {
			served[p.ServedModelName()] = name
			continue
		}
		// Variants of one model (the same backend and model, other flags)
		// may share its name: the active one answers. Two different models
		// under one name would answer a client with whichever is loaded.
		if o := c.Profiles[owner]; o.Backend != p.Backend || o.Model != p.Model {
			key := "profiles." + name + ".served_name"
			if _, written := c.keyLines[key]; !written {
				key = "profiles." + name + ".model" // served_name defaults to the model
			}
			add(key, "%q is also the served name of profile %q, which runs another model (%s %s); profiles may share a served name only as variants of one model", p.ServedModelName(), owner, o.Backend, o.Model)
		}
	}
	aliasOf := map[string]string{}
	for _, name := range names {
		p := c.Profiles[name]
		if p == nil {
			continue
		}
		for i, a := range p.Aliases {
			key := fmt.Sprintf("profiles.%s.aliases[%d]", name, i)
			if owner, ok := served[a]; ok {
				if owner == name {
					add(key, "%q is this profile's own served name; remove the alias", a)
				} else {
					add(key, "%q is the served name of profile %q; an alias must not name another profile's model", a, owner)
				}
				continue
			}
			if owner, ok := aliasOf[a]; ok {
				add(key, "%q is already an alias of profile %q", a, owner)
				continue
			}
			aliasOf[a] = name
		}
	}
}

// ProfileNames returns the profile names sorted, for messages and listings.
func (c *Config) ProfileNames() []string {
	names := make([]string, 0, len(c.Profiles))
	for n := range c.Profiles {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// StandbyUsed reports whether any profile uses standby: both backend
// units may then run at once (one asleep), so they must not conflict.
func (c *Config) StandbyUsed() bool {
	for _, p := range c.Profiles {
		if p != nil && p.StandbyEnabled() {
			return true
		}
	}
	return false
}
