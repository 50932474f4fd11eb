package config

import (
	"fmt"
	"path/filepath"

	"gpuhost/units"
)

// BackendsConfig names the two backend units. Exactly these two kinds exist.
type BackendsConfig struct {
	VLLM   BackendConfig `yaml:"vllm"`
	Ollama BackendConfig `yaml:"ollama"`
}

// BackendConfig is one backend unit: rendered by gpuhost or adopted.
type BackendConfig struct {
	Unit  string   `yaml:"unit"`  // The systemd unit (default gpuhost-vllm.service / gpuhost-ollama.service).
	Adopt bool     `yaml:"adopt"` // Manage an existing unit: install only a drop-in adding Conflicts=, never the operator's file.
	Exec  []string `yaml:"exec"`  // The program and leading arguments the unit runs (the profile's arguments follow).
	// Simulated marks Exec as `gpuhost simulate …`: the profile's sim options
	// are appended to the arguments.
	Simulated bool `yaml:"simulated"`
	// User runs the backend; default units.DefaultBackendUser (created by
	// scripts/install.sh). "root" is allowed but opts out of that.
	User string `yaml:"user"`
	// ReadWritePaths are the folders the backend may write under the unit's
	// ProtectSystem=strict: model caches and model folders. Default: the
	// default backend user's home, units.DefaultBackendHome, which holds
	// ~/.cache/huggingface, ~/.cache/vllm and ~/.ollama.
	ReadWritePaths []string `yaml:"read_write_paths"`
	// Network is "fenced" (default: PrivateNetwork=yes, the backend told it is
	// offline, models fetched into its cache beforehand) or "open" (no
	// PrivateNetwork=: it may download, and its API port is on the host's
	// loopback). Only an open backend's profiles may set network: open.
	Network units.Network `yaml:"network"`
}

// backendsDefaults fills in the backends: section.
func (c *Config) backendsDefaults() {
	if c.Backends.VLLM.Unit == "" {
		c.Backends.VLLM.Unit = "gpuhost-vllm.service"
	}
	if c.Backends.Ollama.Unit == "" {
		c.Backends.Ollama.Unit = "gpuhost-ollama.service"
	}
	for _, b := range []*BackendConfig{&c.Backends.VLLM, &c.Backends.Ollama} {
		if b.User == "" {
			b.User = units.DefaultBackendUser
		}
		if b.ReadWritePaths == nil {
			b.ReadWritePaths = []string{units.DefaultBackendHome}
		}
		if b.Network == "" {
			b.Network = units.NetworkFenced
		}
	}
	if len(c.Backends.VLLM.Exec) == 0 {
		c.Backends.VLLM.Exec = []string{"/usr/local/bin/vllm"}
	}
	if len(c.Backends.Ollama.Exec) == 0 {
		c.Backends.Ollama.Exec = []string{"/usr/local/bin/ollama"}
	}
}

// backendsValidate checks the backends: section. clean says no problem was
// found before it: only then, and when the backends themselves passed, the
// unit renderer's own check runs too.
func (c *Config) backendsValidate(add func(key, format string, args ...any), clean bool) {
	problems := 0
	count := func(key, format string, args ...any) {
		problems++
		add(key, format, args...)
	}
	for _, b := range []struct {
		key string
		cfg BackendConfig
	}{{"backends.vllm", c.Backends.VLLM}, {"backends.ollama", c.Backends.Ollama}} {
		if err := units.ValidServiceName(b.cfg.Unit); err != nil {
			count(b.key+".unit", "%v", err)
		}
		if b.cfg.User != "" {
			if err := units.ValidUser(b.cfg.User); err != nil {
				count(b.key+".user", "%v", err)
			}
		}
		if !filepath.IsAbs(b.cfg.Exec[0]) {
			count(b.key+".exec[0]", "%q must be an absolute path (systemd runs it without a shell)", b.cfg.Exec[0])
		}
		for i, w := range b.cfg.Exec {
			if err := unitValue(w); err != nil {
				count(fmt.Sprintf("%s.exec[%d]", b.key, i), "%v", err)
			}
		}
		for i, p := range b.cfg.ReadWritePaths {
			if err := unitPath(p); err != nil {
				count(fmt.Sprintf("%s.read_write_paths[%d]", b.key, i), "%v", err)
			}
		}
	}
	problems += c.networkValidate(add)
	if c.Backends.VLLM.Unit == c.Backends.Ollama.Unit {
		add("backends.ollama.unit", "%q is the same unit as backends.vllm.unit", c.Backends.Ollama.Unit)
	} else if clean && problems == 0 {
		// The renderer's own check, as `gpuhost units` runs it: anything it
		// refuses that the checks above let through is still a load error.
		for _, bu := range c.BackendUnits() {
			if err := bu.Validate(); err != nil {
				add("backends."+string(bu.Backend), "%v", err)
			}
		}
	}
}

// BackendFor returns the backend unit config of a backend kind.
func (c *Config) BackendFor(b units.Backend) BackendConfig {
	if b == units.Ollama {
		return c.Backends.Ollama
	}
	return c.Backends.VLLM
}

// networkValidate checks backends.*.network and that a profile opts out of
// the offline settings (network: open) only where its backend's unit is
// open too: in a fenced unit the backend would try a network that is not
// there. It returns the number of problems.
func (c *Config) networkValidate(add func(key, format string, args ...any)) int {
	problems := 0
	for _, b := range []struct {
		key string
		cfg BackendConfig
	}{{"backends.vllm", c.Backends.VLLM}, {"backends.ollama", c.Backends.Ollama}} {
		if b.cfg.Network != units.NetworkFenced && b.cfg.Network != units.NetworkOpen {
			problems++
			add(b.key+".network", "%q is not one of %s, %s", b.cfg.Network, units.NetworkFenced, units.NetworkOpen)
		}
	}
	for _, name := range c.ProfileNames() {
		p := c.Profiles[name]
		if p == nil || p.Network != units.NetworkOpen {
			continue
		}
		if bc := c.BackendFor(p.Backend); bc.Network != units.NetworkOpen {
			problems++
			add("profiles."+name+".network", "open needs backends.%s.network: open: %s is fenced (PrivateNetwork=yes), so the backend has no network to reach the hub; open the unit too, or leave network unset and fetch the model into the cache", p.Backend, bc.Unit)
		}
	}
	return problems
}
