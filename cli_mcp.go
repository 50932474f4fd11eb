package main

import (
	"gpuhost/config"
	"gpuhost/internal/wiring"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"gpuhost/mcp"
	_ "gpuhost/mcp/connectors/all" // every compiled connector registers itself
	"gpuhost/mcp/declarative"
)

func newMCPCmd() *cobra.Command {
	return mcp.NewCmd(mcp.CmdDeps{
		Load:        mcpSetup,
		Demo:        mcpDemoSetup,
		Declarative: declarative.Load,
		Logger:      newLogger, // stderr: stdout is the protocol
		Exit:        func(code int) error { return exitError{code} },
		Version:     version,
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
	if err != nil {
		return mcp.Setup{}, err
	}
	d, closeFn := wiring.LocalMCPDaemon(cmd.Context(), cfg, nil, false)
	return mcp.Setup{Connectors: cfg.MCP.Connectors, ConnectorsDir: cfg.MCP.ConnectorsDir, Daemon: d, Close: closeFn}, nil
}

// mcpDemoSetup serves the demo configuration: simulated GPU and backends
// (the demo's default profile is started), calc and weather.
func mcpDemoSetup(cmd *cobra.Command) (mcp.Setup, error) {
	self, err := os.Executable()
	if err != nil {
		return mcp.Setup{}, err
	}
	state, err := os.MkdirTemp("", "gpuhost-mcp-demo-")
	if err != nil {
		return mcp.Setup{}, err
	}
	cfg, err := config.Demo(self, state, "127.0.0.1:0")
	if err != nil {
		os.RemoveAll(state)
		return mcp.Setup{}, err
	}
	log, err := newLogger(cmd)
	if err != nil {
		return mcp.Setup{}, err
	}
	d, closeFn := wiring.LocalMCPDaemon(cmd.Context(), cfg, log, true)
	return mcp.Setup{Connectors: mcp.DemoConfig(), Daemon: d, Close: func() { closeFn(); os.RemoveAll(filepath.Clean(state)) }}, nil
}
