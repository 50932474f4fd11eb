package config

import (
	"fmt"
	"path/filepath"
	"time"
)

// maxSimGPUs bounds gpu.sim.devices: a box, not a cluster.
const maxSimGPUs = 16

// GPUConfig selects the GPU facts source and the VRAM-release rules.
type GPUConfig struct {
	Backend string `yaml:"backend"` // nvml | sim
	SimDir  string `yaml:"sim_dir"` // The simulated GPU's shared claims (gpu.backend sim; default state_dir/simgpu).
	// Sim describes the simulated box (gpu.backend sim).
	Sim SimGPUConfig `yaml:"sim"`
	// IdleBaselineMiB is the used memory with no backend running; 0 means
	// "measure it at start-up when no backend runs".
	IdleBaselineMiB uint64 `yaml:"idle_baseline_mib"`
	// ReleaseToleranceMiB is how far above the baseline used memory may stay
	// and still count as released (drivers keep a little for contexts).
	ReleaseToleranceMiB uint64   `yaml:"release_tolerance_mib"`
	ReleaseTimeout      Duration `yaml:"release_timeout"` // How long a switch waits for the old backend's VRAM to be released (default 60s).
	// StandbyWatchInterval is how often the Supervisor checks that every
	// backend in standby holds no more than its measured residual.
	StandbyWatchInterval Duration `yaml:"standby_watch_interval"`
	// VerifyInterval is how long the active backend may go unverified while idle before the watcher runs the wake check's known prompt on it (default 30s; 0s turns it off). A hand level-2 sleep and wake between two looks leaves an engine that says it is awake and answers wrong; only a generation shows it.
	VerifyInterval *Duration `yaml:"verify_interval"`
}

// VerifyEvery is gpu.verify_interval as a duration: 0 when off.
func (g GPUConfig) VerifyEvery() time.Duration {
	if g.VerifyInterval == nil {
		return 0
	}
	return g.VerifyInterval.D()
}

// SimGPUConfig is the simulated box of gpu.backend sim: its cards.
type SimGPUConfig struct {
	// Devices are the simulated cards in NVML index order (default one RTX
	// 4090, 24564 MiB).
	Devices []SimGPUDevice `yaml:"devices"`
	// P2P makes the simulated cards report working peer-to-peer access
	// (default false: not supported, as between consumer cards).
	P2P bool `yaml:"p2p"`
}

// SimGPUDevice is one simulated card.
type SimGPUDevice struct {
	Name      string `yaml:"name"`       // The card's name as NVML reports it (default NVIDIA GeForce RTX 4090).
	MemoryMiB uint64 `yaml:"memory_mib"` // Its memory (default 24564).
}

// gpuDefaults fills in the gpu: section (sim_dir is below state_dir, whose
// default is set first).
func (c *Config) gpuDefaults() {
	if c.GPU.Backend == "" {
		c.GPU.Backend = "nvml"
	}
	if c.GPU.SimDir == "" {
		c.GPU.SimDir = filepath.Join(c.StateDir, "simgpu")
	}
	if c.GPU.ReleaseToleranceMiB == 0 {
		c.GPU.ReleaseToleranceMiB = 512
	}
	if c.GPU.StandbyWatchInterval == 0 {
		c.GPU.StandbyWatchInterval = Duration(2 * time.Second)
	}
	if c.GPU.VerifyInterval == nil {
		d := Duration(30 * time.Second)
		c.GPU.VerifyInterval = &d
	}
	if c.GPU.ReleaseTimeout == 0 {
		c.GPU.ReleaseTimeout = Duration(60 * time.Second)
	}
}

// gpuValidate checks the gpu: section.
func (c *Config) gpuValidate(add func(key, format string, args ...any)) {
	switch c.GPU.Backend {
	case "nvml", "sim":
	default:
		add("gpu.backend", "%q is not one of nvml, sim", c.GPU.Backend)
	}
	if c.GPU.Backend == "sim" {
		if err := unitPath(c.GPU.SimDir); err != nil {
			add("gpu.sim_dir", "%v", err)
		}
	}
	if n := len(c.GPU.Sim.Devices); n > maxSimGPUs {
		add("gpu.sim.devices", "at most %d simulated GPUs, got %d", maxSimGPUs, n)
	}
	for i, d := range c.GPU.Sim.Devices {
		if d.MemoryMiB != 0 && d.MemoryMiB < 1024 {
			add(fmt.Sprintf("gpu.sim.devices[%d].memory_mib", i), "must be at least 1024 MiB (or 0 for 24564), got %d", d.MemoryMiB)
		}
	}
}
