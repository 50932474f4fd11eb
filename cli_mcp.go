package main

import (
	"fmt"
	"gpuhost/config"
	"gpuhost/internal/assemble"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"gpuhost/mcp"
	_ "gpuhost/mcp/connectors/all" // every compiled connector registers itself
)

func newMCPCmd() *cobra.Command {
	return mcp.NewCmd(mcp.CmdDeps{
		Load:      mcpSetup,
		Demo:      mcpDemoSetup,
		DemoTools: mcpDemoToolsSetup,
		Logger:    newLogger, // stderr: stdout is the protocol
		Exit:      func(code int) error { return exitError{code} },
		Version:   version,
		Remote: func(cmd *cobra.Command) (mcp.Remote, error) {
			t, err := resolveDaemon(cmd)
			if err != nil {
				return mcp.Remote{}, err
			}
			c := t.client()
			return mcp.Remote{BaseURL: c.BaseURL, Token: c.Token, Origin: c.Origin}, nil
		},
	})
}

// mcpSetup reads the config for `gpuhost mcp`: the connectors, and a
// read-only view of this box (GPU, units, doctor, bench results) for the
// gpu and inference connectors, opened locally like `gpuhost status`.
func mcpSetup(cmd *cobra.Command) (mcp.Setup, error) {
	cfg, err := loadConfig(cmd)
	if err != nil && configMissing(cmd, err) {
		sub := ""
		if cmd.Name() != "mcp" {
			sub = " " + cmd.Name()
		}
		return mcp.Setup{}, configError{fmt.Errorf("%w\n(without a config, `%s mcp%s --demo` uses the demo's connectors: calc, weather, the simulated GPU)", err, selfCommand(), sub)}
	}
	if err != nil {
		return mcp.Setup{}, err
	}
	return assemble.LocalMCP(cmd.Context(), cfg, nil, version, false), nil
}

// mcpDemoToolsSetup is the demo configuration for listing its tools: the
// connectors and a Supervisor that reads the (simulated) box once but
// starts nothing, so `mcp tools --demo` answers at once and quietly.
func mcpDemoToolsSetup(cmd *cobra.Command) (mcp.Setup, error) {
	return mcpDemo(cmd, "gpuhost-mcp-tools-", nil)
}

// mcpDemoSetup serves the demo configuration: simulated GPU and backends
// (the demo's default profile is started), calc and weather.
func mcpDemoSetup(cmd *cobra.Command) (mcp.Setup, error) {
	log, err := newLogger(cmd)
	if err != nil {
		return mcp.Setup{}, err
	}
	return mcpDemo(cmd, "gpuhost-mcp-demo-", log)
}

// mcpDemo builds the demo's MCP setup in a throw-away state folder (removed
// on Close); with a log the Supervisor runs (backends start), without it
// only reads.
func mcpDemo(cmd *cobra.Command, statePrefix string, log *slog.Logger) (mcp.Setup, error) {
	self, err := os.Executable()
	if err != nil {
		return mcp.Setup{}, err
	}
	state, err := os.MkdirTemp("", statePrefix)
	if err != nil {
		return mcp.Setup{}, err
	}
	cfg, err := config.Demo(self, state, "127.0.0.1:0")
	if err != nil {
		os.RemoveAll(state)
		return mcp.Setup{}, err
	}
	cfg.MCP.Connectors, cfg.MCP.ConnectorsDir = mcp.DemoConfig(), ""
	su := assemble.LocalMCP(cmd.Context(), cfg, log, version, log != nil)
	closeFn := su.Close
	su.Close = func() { closeFn(); os.RemoveAll(filepath.Clean(state)) }
	return su, nil
}
