package config

import "time"

// HealConfig is how gpuhost brings back a backend that crashed: the active
// backend's unit leaving "active" without gpuhost asking (an exit, a
// signal, a failure) starts the last wanted profile again through the
// normal switch, after a back-off; too many crashes in a window stop the
// retries until `gpuhost heal` or a switch.
type HealConfig struct {
	// Enabled restarts a crashed active backend (default true). Off, a crash leaves the box idle (the doctor fails) until `gpuhost heal` or a switch.
	Enabled *bool `yaml:"enabled"`
	// MaxRestarts is how many restarts gpuhost makes within heal.window before it gives up and the phase becomes failed (default 3).
	MaxRestarts int `yaml:"max_restarts"`
	// Window is the span over which crashes count towards heal.max_restarts (default 10m).
	Window Duration `yaml:"window"`
	// Backoff is the wait before the first restart after a crash; each further restart within the window waits twice as long, up to heal.max_backoff (default 2s).
	Backoff Duration `yaml:"backoff"`
	// MaxBackoff caps the doubling wait between restarts (default 1m).
	MaxBackoff Duration `yaml:"max_backoff"`
}

// healDefaults fills in the heal: section.
func (c *Config) healDefaults() {
	if c.Heal.Enabled == nil {
		c.Heal.Enabled = ptr(true)
	}
	if c.Heal.MaxRestarts == 0 {
		c.Heal.MaxRestarts = 3
	}
	if c.Heal.Window == 0 {
		c.Heal.Window = Duration(10 * time.Minute)
	}
	if c.Heal.Backoff == 0 {
		c.Heal.Backoff = Duration(2 * time.Second)
	}
	if c.Heal.MaxBackoff == 0 {
		c.Heal.MaxBackoff = Duration(time.Minute)
	}
}

// healValidate checks the heal: section.
func (c *Config) healValidate(add func(key, format string, args ...any)) {
	if c.Heal.MaxRestarts < 0 {
		add("heal.max_restarts", "%d is negative (0 means the default, 3)", c.Heal.MaxRestarts)
	}
	if c.Heal.Window.D() < 0 {
		add("heal.window", "%s is negative", c.Heal.Window.D())
	}
	if c.Heal.Backoff.D() < 0 {
		add("heal.backoff", "%s is negative", c.Heal.Backoff.D())
	}
	if c.Heal.MaxBackoff.D() < c.Heal.Backoff.D() {
		add("heal.max_backoff", "%s is shorter than heal.backoff (%s)", c.Heal.MaxBackoff.D(), c.Heal.Backoff.D())
	}
}
