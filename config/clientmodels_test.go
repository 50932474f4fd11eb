package config

import (
	"strings"
	"testing"
)

// TestClientModels: entries route the names no profile serves, first match
// first; an entry that names no profile, is no valid pattern, or would
// capture a served name or alias is refused naming its key.
func TestClientModels(t *testing.T) {
	base := minimal + "    aliases: [coder]\n  small:\n    backend: ollama\n    model: qwen3:4b\n    port: 11434\n"
	cfg, err := Parse("c.yaml", []byte(base+"proxy:\n  client_models:\n    - {match: 'claude-*haiku*', profile: small}\n    - {match: 'claude-*', profile: p1}\n    - {match: gpt-4o, profile: p1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"claude-3-5-haiku-20241022": "small", "claude-sonnet-4-5-20250929": "p1", "gpt-4o": "p1", "gpt-4o-mini": "", "org/model": "",
	} {
		if got := cfg.Proxy.ClientModelProfile(name); got != want {
			t.Errorf("ClientModelProfile(%q) = %q, want %q", name, got, want)
		}
	}
	for _, tc := range []struct{ entry, want string }{
		{"{match: 'claude-*', profile: nope}", `proxy.client_models[0].profile (line`},
		{"{match: 'claude-[', profile: p1}", `proxy.client_models[0].match (line`},
		{"{match: '', profile: p1}", `proxy.client_models[0].match`},
		{"{match: 'co*', profile: small}", `matches "coder", which profile "p1" serves`},
		{"{match: 'qwen3:4b', profile: p1}", `matches "qwen3:4b", which profile "small" serves`},
	} {
		_, err := Parse("c.yaml", []byte(base+"proxy:\n  client_models:\n    - "+tc.entry+"\n"))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.entry, err, tc.want)
		}
	}
}
