package config

import "time"

// SwitchConfig tunes the switch state machine.
type SwitchConfig struct {
	ReadyTimeout Duration `yaml:"ready_timeout"` // How long a started backend may take to answer health (default 15m).
	StopTimeout  Duration `yaml:"stop_timeout"`  // How long a backend may take to stop (default 90s).
	// Rollback to the previous profile when the new one fails to start.
	Rollback *bool `yaml:"rollback"`
	// RestoreOnBoot switches to the last wanted profile when the daemon
	// starts and no backend runs.
	RestoreOnBoot *bool `yaml:"restore_on_boot"`
	// DrainTimeout is how long a switch lets the /v1 requests running on
	// the backend it takes away finish; the ones still running then are
	// cut with an error in their API's shape. Default 5s; 0 = cut at once.
	DrainTimeout *Duration `yaml:"drain_timeout"`
}

// DefaultSwitchDrainTimeout is switch.drain_timeout's default: long
// enough for a short answer in flight (a tool call, a one-line reply: a
// few hundred tokens at 50–150 tok/s) to finish, short against what the
// switch itself takes and what every held request waits for. A long
// answer (1,500 tokens at 50 tok/s is 30 s) is not worth holding the
// switch for: it is cut with an error its client retries.
const DefaultSwitchDrainTimeout = 5 * time.Second

// switchDefaults fills in the switch: section.
func (c *Config) switchDefaults() {
	if c.Switch.ReadyTimeout == 0 {
		c.Switch.ReadyTimeout = Duration(15 * time.Minute)
	}
	if c.Switch.StopTimeout == 0 {
		c.Switch.StopTimeout = Duration(90 * time.Second)
	}
	if c.Switch.Rollback == nil {
		c.Switch.Rollback = ptr(true)
	}
	if c.Switch.RestoreOnBoot == nil {
		c.Switch.RestoreOnBoot = ptr(true)
	}
	if c.Switch.DrainTimeout == nil {
		c.Switch.DrainTimeout = ptr(Duration(DefaultSwitchDrainTimeout))
	}
}

// switchValidate checks the switch: section.
func (c *Config) switchValidate(add func(key, format string, args ...any)) {
	if c.Switch.ReadyTimeout.D() < time.Second {
		add("switch.ready_timeout", "%s is too short (at least 1s)", c.Switch.ReadyTimeout.D())
	}
}
