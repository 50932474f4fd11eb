// Package mcp is gpuhost's MCP server: it knows no tools itself. Every
// connector under mcp/connectors/<name>/ registers itself at init with
// package gpuhost/mcp/connector, which holds the contract and nothing of
// the server, so a connector does not link this package's HTTP, CLI and
// MCP-server dependencies. The registry here builds each enabled
// connector's tools from the gpuhost config and enforces the rules that
// hold for all of them (docs/design.md decisions 1 and 2): tools
// only read, targets are enumerated from config, secrets are read at call
// time and scrubbed from everything that leaves, failures are isError
// results the model can act on.
package mcp
