package gpu

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"gpuhost/mcp/connector"
	"gpuhost/nvml"
)

func init() { connector.Register("gpu", func() connector.Connector { return &builder{} }) }

// ErrNoDaemon is Build's error outside the daemon: the GPU is read through
// the running appliance (which owns the NVML handle or the simulator), so
// without it the connector has nothing to read and is disabled.
var ErrNoDaemon = errors.New("gpu connector needs the running gpuhost daemon (it reads the GPU through the daemon's NVML handle); start it with `gpuhost serve` or remove mcp.connectors.gpu")

// Daemon is what this connector reads of the running daemon. It is defined
// here, not in the connector contract, so that only this connector links
// package nvml; internal/mcpview's Daemon implements it.
type Daemon interface {
	Snapshot(ctx context.Context) (nvml.Snapshot, error)
}

// snapshotTimeout bounds one NVML snapshot; the driver can hang on a GPU
// that has fallen off the bus, and a tool call must still answer.
const snapshotTimeout = 10 * time.Second

// config is the gpu section; it has no settings, but decoding it still
// rejects a misspelt key.
type config struct{}

type builder struct{}

// Build returns gpu_status and gpu_processes, reading env.Daemon.
func (c *builder) Build(env connector.Env) ([]connector.Tool, error) {
	var cfg config
	if err := connector.DecodeConfig(env, &cfg); err != nil {
		return nil, err
	}
	if env.Daemon == nil {
		return nil, ErrNoDaemon
	}
	d, ok := env.Daemon.(Daemon)
	if !ok {
		return nil, fmt.Errorf("gpu connector: the daemon (%T) cannot read the GPU (no Snapshot method); remove mcp.connectors.gpu", env.Daemon)
	}
	status := mcpgo.NewTool("gpu_status",
		mcpgo.WithDescription("Current GPU snapshot of this inference box, one entry per GPU (NVML index, UUID, PCI bus id): name, driver and CUDA versions, memory used/free/total (MiB), "+
			"utilisation, temperature, power draw and limit, clocks and theoretical memory bandwidth. "+
			"With several GPUs, p2p gives the peer-to-peer status of each pair. "+
			"backend \"sim\" means a simulated GPU. Facts the card cannot report are listed in unavailable."),
		mcpgo.WithReadOnlyHintAnnotation(true),
		mcpgo.WithDestructiveHintAnnotation(false),
		mcpgo.WithOpenWorldHintAnnotation(false),
		mcpgo.WithSchemaAdditionalProperties(false),
	)
	procs := mcpgo.NewTool("gpu_processes",
		mcpgo.WithDescription("Processes holding GPU memory right now: GPU index, PID, process name and MiB used, largest first. "+
			"Use it to see which inference server (or foreign process) occupies VRAM."),
		mcpgo.WithReadOnlyHintAnnotation(true),
		mcpgo.WithDestructiveHintAnnotation(false),
		mcpgo.WithOpenWorldHintAnnotation(false),
		mcpgo.WithSchemaAdditionalProperties(false),
	)
	return []connector.Tool{
		{Def: status, Handler: func(ctx context.Context, _ connector.Args) (any, error) {
			snap, err := snapshot(ctx, d)
			if err != nil {
				return nil, err
			}
			return statusOf(snap), nil
		}},
		{Def: procs, Handler: func(ctx context.Context, _ connector.Args) (any, error) {
			snap, err := snapshot(ctx, d)
			if err != nil {
				return nil, err
			}
			return processesOf(snap), nil
		}},
	}, nil
}

func snapshot(ctx context.Context, d Daemon) (nvml.Snapshot, error) {
	ctx, cancel := context.WithTimeout(ctx, snapshotTimeout)
	defer cancel()
	snap, err := d.Snapshot(ctx)
	if err != nil {
		return nvml.Snapshot{}, fmt.Errorf("reading the GPU snapshot failed: %w (run `gpuhost doctor` on the box for details)", err)
	}
	return snap, nil
}

// Status is gpu_status's result: the snapshot without the process lists
// (gpu_processes has those), so the common question stays short.
type Status struct {
	Backend           string      `json:"backend"`
	DriverVersion     string      `json:"driver_version"`
	CUDADriverVersion string      `json:"cuda_driver_version"`
	TakenAt           time.Time   `json:"taken_at"`
	GPUs              []GPUStatus `json:"gpus"`
	// P2P is the peer-to-peer status of every pair of GPUs as the driver
	// reports it ("ok" or why not); tensor parallelism over a pair without
	// it needs NCCL_P2P_DISABLE=1, which gpuhost sets.
	P2P  []nvml.P2PLink `json:"p2p,omitempty"`
	Note string         `json:"note,omitempty"`
}

// GPUStatus is one GPU's readings.
type GPUStatus struct {
	Index             int     `json:"index"`
	Name              string  `json:"name"`
	UUID              string  `json:"uuid,omitempty"`
	PCIBusID          string  `json:"pci_bus_id,omitempty"`
	MemoryUsedMiB     uint64  `json:"memory_used_mib"`
	MemoryFreeMiB     uint64  `json:"memory_free_mib"`
	MemoryTotalMiB    uint64  `json:"memory_total_mib"`
	MemoryUsedPercent float64 `json:"memory_used_percent"`
	UtilizationGPU    int     `json:"utilization_gpu_percent"`
	UtilizationMemory int     `json:"utilization_memory_percent"`
	TemperatureC      int     `json:"temperature_c"`
	PowerW            float64 `json:"power_w"`
	PowerLimitW       float64 `json:"power_limit_w"`
	SMClockMHz        int     `json:"sm_clock_mhz"`
	MemClockMHz       int     `json:"mem_clock_mhz"`
	MaxMemClockMHz    int     `json:"max_mem_clock_mhz"`
	BandwidthGBs      float64 `json:"bandwidth_gbs"`
	Processes         int     `json:"process_count"`
	// Unavailable names the readings the card could not give (their value
	// above is zero and must not be read as a measurement).
	Unavailable map[string]string `json:"unavailable,omitempty"`
}

func statusOf(s nvml.Snapshot) Status {
	out := Status{Backend: s.Backend, DriverVersion: s.DriverVersion, CUDADriverVersion: s.CUDADriverVersion,
		TakenAt: s.TakenAt, GPUs: []GPUStatus{}, P2P: s.P2P}
	for _, d := range s.Devices {
		g := GPUStatus{Index: d.Index, Name: d.Name, UUID: d.UUID, PCIBusID: d.PCIBusID,
			MemoryUsedMiB: d.MemoryUsedMiB, MemoryFreeMiB: d.MemoryFreeMiB, MemoryTotalMiB: d.MemoryTotalMiB,
			UtilizationGPU: d.UtilizationGPU, UtilizationMemory: d.UtilizationMemory, TemperatureC: d.TemperatureC,
			PowerW: d.PowerW, PowerLimitW: d.PowerLimitW, SMClockMHz: d.SMClockMHz, MemClockMHz: d.MemClockMHz,
			MaxMemClockMHz: d.MaxMemClockMHz, BandwidthGBs: d.BandwidthGBs, Processes: len(d.Processes),
			Unavailable: d.FactErrors}
		if d.MemoryTotalMiB > 0 {
			g.MemoryUsedPercent = float64(d.MemoryUsedMiB*1000/d.MemoryTotalMiB) / 10
		}
		out.GPUs = append(out.GPUs, g)
	}
	if len(out.GPUs) == 0 {
		out.Note = "the driver reports no GPU"
	}
	return out
}

// Processes is gpu_processes's result.
type Processes struct {
	Backend   string    `json:"backend"`
	TakenAt   time.Time `json:"taken_at"`
	Processes []Process `json:"processes"`
	TotalMiB  uint64    `json:"total_used_mib"`
}

// Process is one process holding GPU memory.
type Process struct {
	GPU     int    `json:"gpu"`
	PID     int    `json:"pid"`
	Name    string `json:"name"`
	UsedMiB uint64 `json:"used_mib"`
}

func processesOf(s nvml.Snapshot) Processes {
	out := Processes{Backend: s.Backend, TakenAt: s.TakenAt, Processes: []Process{}}
	for _, d := range s.Devices {
		for _, p := range d.Processes {
			name := p.Name
			if name == "" {
				name = "(unreadable)"
			}
			out.Processes = append(out.Processes, Process{GPU: d.Index, PID: p.PID, Name: name, UsedMiB: p.UsedMiB})
			out.TotalMiB += p.UsedMiB
		}
	}
	sort.SliceStable(out.Processes, func(i, j int) bool {
		a, b := out.Processes[i], out.Processes[j]
		if a.UsedMiB != b.UsedMiB {
			return a.UsedMiB > b.UsedMiB
		}
		return a.PID < b.PID
	})
	return out
}
