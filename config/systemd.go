package config

import "path/filepath"

// SystemdConfig says how to reach systemd and where unit files go.
type SystemdConfig struct {
	// Socket empty means the system bus; otherwise a private systemd socket
	// such as /run/systemd/private (used by the tests' private systemd).
	Socket  string `yaml:"socket"`
	UnitDir string `yaml:"unit_dir"` // Where `gpuhost units install` writes units and drop-ins (default /etc/systemd/system).
	// Runner "systemd" (default) or "process" (the demo's in-process runner).
	Runner string `yaml:"runner"`
}

// systemdDefaults fills in the systemd: section.
func (c *Config) systemdDefaults() {
	if c.Systemd.UnitDir == "" {
		c.Systemd.UnitDir = DefaultUnitDir
	}
	if c.Systemd.Runner == "" {
		c.Systemd.Runner = "systemd"
	}
}

// systemdValidate checks the systemd: section.
func (c *Config) systemdValidate(add func(key, format string, args ...any)) {
	switch c.Systemd.Runner {
	case "systemd", "process":
	default:
		add("systemd.runner", "%q is not one of systemd, process", c.Systemd.Runner)
	}
	if c.Systemd.Socket != "" && !filepath.IsAbs(c.Systemd.Socket) {
		add("systemd.socket", "%q must be an absolute path", c.Systemd.Socket)
	}
	if err := unitPath(c.Systemd.UnitDir); err != nil {
		add("systemd.unit_dir", "%v", err)
	}
}

// DefaultUnitDir is systemd.unit_dir's default.
const DefaultUnitDir = "/etc/systemd/system"
