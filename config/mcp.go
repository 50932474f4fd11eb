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
}

// mcpDefaults fills in the mcp: section.
func (c *Config) mcpDefaults() {
	if c.MCP.ConnectorsDir == "" {
		c.MCP.ConnectorsDir = "/etc/gpuhost/connectors.d"
	}
}
