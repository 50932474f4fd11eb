package connector

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestDecodeConfigNamesThePath: a misspelt key is an error that says where
// in gpuhost.yaml it is, and an absent section leaves the defaults.
func TestDecodeConfigNamesThePath(t *testing.T) {
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte("timeout: 2s\ntimeuot: 3s\n"), &doc); err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Timeout string `yaml:"timeout"`
	}
	err := DecodeConfig(Env{Name: "demo", Config: *doc.Content[0]}, &cfg)
	if err == nil || !strings.Contains(err.Error(), "mcp.connectors.demo") || !strings.Contains(err.Error(), "timeuot") {
		t.Fatalf("err = %v, want it to name mcp.connectors.demo and timeuot", err)
	}
	cfg.Timeout = "default"
	if err := DecodeConfig(Env{Name: "demo"}, &cfg); err != nil || cfg.Timeout != "default" {
		t.Fatalf("absent section: err %v, timeout %q", err, cfg.Timeout)
	}
}

// TestSecretsRemembersWhatItHandsOut: the server scrubs Values from
// everything that leaves, so a secret that was read must be among them.
func TestSecretsRemembersWhatItHandsOut(t *testing.T) {
	s := NewSecrets(func(n string) (string, bool) { return map[string]string{"K": "v1"}[n], n == "K" })
	if v, err := s.Get("K"); err != nil || v != "v1" {
		t.Fatalf("Get(K) = %q, %v", v, err)
	}
	var miss *MissingSecretError
	if _, err := s.Get("NOPE"); !errors.As(err, &miss) || miss.Name != "NOPE" {
		t.Fatalf("Get(NOPE): err = %v, want *MissingSecretError naming it", err)
	}
	s.Mark("v2")
	s.Mark("")
	if got := strings.Join(slices.Sorted(slices.Values(s.Values())), ","); got != "v1,v2" {
		t.Fatalf("Values = %s, want v1,v2", got)
	}
}

// TestRegisterTwicePanics: two connectors under one name would shadow each
// other silently; it is a programming error caught at init.
func TestRegisterTwicePanics(t *testing.T) {
	f := func() Connector { return nil }
	Register("connector-test-dup", f)
	defer func() {
		if r := recover(); r == nil {
			t.Fatal("second Register did not panic")
		}
	}()
	Register("connector-test-dup", f)
}
