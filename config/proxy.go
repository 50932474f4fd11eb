package config

import "time"

// ProxyConfig tunes the OpenAI-compatible /v1 endpoint.
type ProxyConfig struct {
	Disabled bool `yaml:"disabled"` // Turns off the /v1 proxy.
	// AutoSwitch lets a request for another profile's model trigger a
	// switch (and be held until it is done); off, such a request gets 404.
	AutoSwitch bool `yaml:"auto_switch"`
	// HoldTimeout is how long a request is held during a switch before it
	// gets 503 with Retry-After.
	HoldTimeout  Duration `yaml:"hold_timeout"`
	MaxBodyBytes int64    `yaml:"max_body_bytes"` // The largest /v1 request body (default 32 MiB).
	// BodyMemoryBytes is the memory all request bodies the proxy holds at
	// once may take (bodies are read whole to route them and to hold them
	// during a switch); beyond it a request gets 503 with Retry-After.
	BodyMemoryBytes int64 `yaml:"body_memory_bytes"`
	// DrainTimeout (auto_switch) is how long a switch away from the
	// current model waits for the requests running on it to finish; after
	// it the switch goes ahead and cuts them. Default 30s (or hold_timeout
	// when that is shorter); 0 = no drain.
	DrainTimeout *Duration `yaml:"drain_timeout"`
	// MinResidency (auto_switch) keeps a model that is in use loaded at
	// least this long after it became active and after its latest request:
	// requests for another model are held meanwhile (never failed for it;
	// see frontdoor/proxy). Default 10s (or hold_timeout when that is
	// shorter); 0 = switch at once.
	MinResidency *Duration `yaml:"min_residency"`
	// ClientModels maps the model names a client sends on its own (Claude
	// Code's claude-… ids) onto profiles; see ClientModel.
	ClientModels []ClientModel `yaml:"client_models"`
}

// Default proxy.drain_timeout and proxy.min_residency.
const (
	DefaultDrainTimeout = 30 * time.Second
	DefaultMinResidency = 10 * time.Second
)

// proxyDefaults fills in the proxy: section, but for body_memory_bytes
// (httpDefaults).
func (c *Config) proxyDefaults() {
	if c.Proxy.HoldTimeout == 0 {
		c.Proxy.HoldTimeout = Duration(10 * time.Minute)
	}
	if c.Proxy.MaxBodyBytes == 0 {
		c.Proxy.MaxBodyBytes = 32 << 20
	}
	// Unset, the policy's bounds follow a shorter hold_timeout down.
	if c.Proxy.DrainTimeout == nil {
		c.Proxy.DrainTimeout = ptr(min(Duration(DefaultDrainTimeout), c.Proxy.HoldTimeout))
	}
	if c.Proxy.MinResidency == nil {
		c.Proxy.MinResidency = ptr(min(Duration(DefaultMinResidency), c.Proxy.HoldTimeout))
	}
}

// proxyValidate checks the proxy: section, but for body_memory_bytes
// (httpValidate).
func (c *Config) proxyValidate(add func(key, format string, args ...any)) {
	c.clientModelsValidate(add)
	if c.Proxy.MaxBodyBytes < 1024 {
		add("proxy.max_body_bytes", "%d is too small (at least 1024)", c.Proxy.MaxBodyBytes)
	}
	// The policy's waits are not charged to hold_timeout (a request is
	// never failed for them), so each is bounded by it instead.
	if d := c.Proxy.DrainTimeout.D(); d > c.Proxy.HoldTimeout.D() {
		add("proxy.drain_timeout", "%s is longer than proxy.hold_timeout (%s): a request for another model would wait longer for the drain than any request is held for a switch", d, c.Proxy.HoldTimeout.D())
	}
	if d := c.Proxy.MinResidency.D(); d > c.Proxy.HoldTimeout.D() {
		add("proxy.min_residency", "%s is longer than proxy.hold_timeout (%s): a request for another model would wait longer for the residency than any request is held for a switch", d, c.Proxy.HoldTimeout.D())
	}
}
