// Package mcpview is the MCP connectors' read-only view of the running
// daemon: the gpu and inference connectors each define the small Daemon
// interface they read, and Daemon here implements both over the
// Supervisor, so neither the connectors nor the Supervisor import each
// other. internal/assemble hands it to the MCP server; tests that run a
// connector against a real Supervisor use it too. It decides nothing; it
// only forwards.
package mcpview

import (
	"context"
	"fmt"

	"gpuhost/api"
	"gpuhost/bench"
	"gpuhost/nvml"
)

// Daemon adapts the running appliance to the Daemon interfaces of the
// gpu and inference connectors (each defines the few methods it reads;
// mcpview_test.go checks Daemon has them), so the assembly hands
// both over in one value. It exposes reads only: the Supervisor's Switch is
// deliberately not reachable.
type Daemon struct {
	// Sup is the daemon's Box (or, in tests, one lane's Supervisor).
	Sup Core
	// DoctorFn runs the doctor (the same function the API uses).
	DoctorFn api.DoctorFunc
	// Bench is the results store (nil: no results).
	Bench *bench.Store
}

// Core is what the views read of the appliance: *appliance.Box and
// *appliance.Supervisor both satisfy it.
type Core interface {
	Snapshot(ctx context.Context) (nvml.Snapshot, error)
	Status(ctx context.Context) api.Status
}

// Snapshot reads the GPU through the daemon's own NVML handle.
func (d *Daemon) Snapshot(ctx context.Context) (nvml.Snapshot, error) {
	return d.Sup.Snapshot(ctx)
}

// Status is the Supervisor's status (phase, profile, units, health).
func (d *Daemon) Status(ctx context.Context) api.Status { return d.Sup.Status(ctx) }

// Doctor runs the doctor for profile ("" = the active one).
func (d *Daemon) Doctor(ctx context.Context, profile string) api.DoctorReport {
	if d.DoctorFn == nil {
		return api.DoctorReport{}
	}
	return d.DoctorFn(ctx, profile)
}

// BenchResults summarises the stored bench results; unreadable files are
// skipped (the store reports them as warnings to its own log).
func (d *Daemon) BenchResults() ([]bench.Summary, error) {
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
