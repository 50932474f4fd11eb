package mcp

import "gopkg.in/yaml.v3"

// DemoConnectors are the connectors `gpuhost mcp --demo` serves: the
// simulated box (gpu, inference) and the two that need no account (calc,
// weather), each with its defaults.
var DemoConnectors = []string{"calc", "gpu", "inference", "weather"}

// DemoConfig returns the mcp.connectors map enabling DemoConnectors.
func DemoConfig() map[string]yaml.Node {
	out := make(map[string]yaml.Node, len(DemoConnectors))
	for _, n := range DemoConnectors {
		out[n] = yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	}
	return out
}
