package config

import (
	"fmt"
	"path"
	"strings"
)

// ClientModel maps model names a client sends on its own onto a profile.
// Claude Code asks for its own ids (claude-sonnet-…, and its small/fast
// model claude-…-haiku-…) unless told otherwise; rather than failing those
// with 404, proxy.client_models routes them:
//
//	proxy:
//	  client_models:
//	    - match: "claude-*haiku*"   # Claude Code's small/fast model
//	      profile: small
//	    - match: "claude-*"
//	      profile: coder
//
// Match is an exact name or a pattern (path.Match: * ? [..]); the entries
// are tried in order, the first match wins, and only for names that no
// profile serves: a served name, alias or model id always routes as
// itself, which is why a match may not be (or match) one of them.
type ClientModel struct {
	// Match is the model name a client sends on its own: exact, or a glob
	// (`claude-*haiku*`); it may not match a name or alias a profile serves.
	Match string `yaml:"match"`
	// Profile is the profile whose model answers such requests.
	Profile string `yaml:"profile"`
}

// ClientModelProfile returns the profile proxy.client_models maps name to,
// "" when no entry matches. The caller asks only for a name no profile
// serves.
func (c ProxyConfig) ClientModelProfile(name string) string {
	for _, m := range c.ClientModels {
		if ok, err := path.Match(m.Match, name); err == nil && ok {
			return m.Profile
		}
	}
	return ""
}

// clientModelsValidate checks proxy.client_models: each entry names a
// profile and a valid pattern that neither is nor matches a name a profile
// serves (its served name, an alias), which would make one name route two
// ways.
func (c *Config) clientModelsValidate(add func(key, format string, args ...any)) {
	names := c.ProfileNames()
	for i, m := range c.Proxy.ClientModels {
		key := fmt.Sprintf("proxy.client_models[%d]", i)
		if m.Match == "" {
			add(key+".match", "a name or pattern is needed (e.g. \"claude-*\")")
			continue
		}
		if _, err := path.Match(m.Match, ""); err != nil {
			add(key+".match", "%q is not a valid pattern: %v", m.Match, err)
			continue
		}
		if p, ok := c.Profiles[m.Profile]; !ok || p == nil {
			add(key+".profile", "%q is not a profile (profiles: %s)", m.Profile, strings.Join(names, ", "))
		}
		for _, name := range names {
			p := c.Profiles[name]
			if p == nil {
				continue
			}
			for _, served := range append([]string{p.ServedModelName()}, p.Aliases...) {
				if ok, _ := path.Match(m.Match, served); ok {
					add(key+".match", "%q matches %q, which profile %q serves; a client model name must not be a served name or alias (those route as themselves)", m.Match, served, name)
				}
			}
		}
	}
}
