package mcp

import (
	"context"
	"fmt"
	"gpuhost/api"

	"gopkg.in/yaml.v3"

	"gpuhost/appliance"
	"gpuhost/bench"
	"gpuhost/nvml"
)

// SupervisorDaemon adapts the running appliance to Daemon, so package
// main wires the gpu and inference connectors in one line. It exposes
// reads only: the Supervisor's Switch is deliberately not reachable.
type SupervisorDaemon struct {
	Sup *appliance.Supervisor
	// DoctorFn runs the doctor (the same function the API uses).
	DoctorFn api.DoctorFunc
	// Bench is the results store (nil: no results).
	Bench *bench.Store
}

var _ Daemon = (*SupervisorDaemon)(nil)

// Snapshot reads the GPU through the daemon's own NVML handle.
func (d *SupervisorDaemon) Snapshot(ctx context.Context) (nvml.Snapshot, error) {
	return d.Sup.Snapshot(ctx)
}

// Status is the Supervisor's status (phase, profile, units, health).
func (d *SupervisorDaemon) Status(ctx context.Context) api.Status { return d.Sup.Status(ctx) }

// Doctor runs the doctor for profile ("" = the active one).
func (d *SupervisorDaemon) Doctor(ctx context.Context, profile string) api.DoctorReport {
	if d.DoctorFn == nil {
		return api.DoctorReport{}
	}
	return d.DoctorFn(ctx, profile)
}

// BenchResults summarises the stored bench results; unreadable files are
// skipped (the store reports them as warnings to its own log).
func (d *SupervisorDaemon) BenchResults() ([]bench.Summary, error) {
	if d.Bench == nil {
		return nil, nil
	}
	rs, _, err := d.Bench.List()
	if err != nil {
		return nil, fmt.Errorf("list bench results in %s: %w", d.Bench.Dir, err)
	}
	out := make([]bench.Summary, 0, len(rs))
	for _, r := range rs {
		out = append(out, bench.Summarize(r))
	}
	return out, nil
}

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
