package config

import "gopkg.in/yaml.v3"

// MCPConfig controls the MCP server. A connector is enabled when its
// section exists under connectors (an empty mapping enables it with its
// defaults); each connector decodes and validates its own section.
type MCPConfig struct {
	// Disabled turns off the daemon's /mcp mount (stdio `gpuhost mcp` still works).
	Disabled bool `yaml:"disabled"`
	// ConnectorsDir holds declarative connectors (*.yaml), read at start
	// and on SIGHUP.
	ConnectorsDir string               `yaml:"connectors_dir"`
	Connectors    map[string]yaml.Node `yaml:"connectors"` // One section per enabled connector, decoded by the connector (docs/mcp.md).
	// MaxSessions caps the /mcp sessions of clients on protocol revisions
	// before 2026-07-28 (later ones hold none): at the cap, an initialize
	// evicts the least recently used session, whose client then starts a
	// new one. Each holds ~17 KB.
	MaxSessions int `yaml:"max_sessions"`
}

// DefaultMCPMaxSessions is mcp.max_sessions' default (mcp.DefaultMaxSessions).
const DefaultMCPMaxSessions = 256

// mcpDefaults fills in the mcp: section.
func (c *Config) mcpDefaults() {
	if c.MCP.ConnectorsDir == "" {
		c.MCP.ConnectorsDir = "/etc/gpuhost/connectors.d"
	}
	if c.MCP.MaxSessions == 0 {
		c.MCP.MaxSessions = DefaultMCPMaxSessions
	}
}

func (c *Config) mcpValidate(add func(key, format string, args ...any)) {
	if n := c.MCP.MaxSessions; n < 1 || n > 1<<20 {
		add("mcp.max_sessions", "%d is outside 1..1048576", n)
	}
}
