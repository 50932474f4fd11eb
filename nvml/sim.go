package nvml

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Defaults of the simulated GPU: the reference box's RTX 4090 on the driver
// that gpuhost's settings rules are written for.
const (
	DefaultSimName          = "NVIDIA GeForce RTX 4090"
	DefaultSimTotalMiB      = 24564
	DefaultSimBaselineMiB   = 18
	DefaultSimDriverVersion = "610.43.02"
	DefaultSimCUDAVersion   = "13.0"
	// DefaultSimHostMemMiB is the simulated host's RAM (64 GiB), against
	// which the claims' HostMiB count.
	DefaultSimHostMemMiB = 65536
	// SimUUID is the simulated GPU's fixed UUID, recognisably fake.
	SimUUID = "GPU-5a1f4090-0000-4000-8000-000000000000"

	simBusWidthBits   = 384
	simMaxMemClockMHz = 10501
	simIdleSMClock    = 210
	simBusySMClock    = 2520
	simIdleMemClock   = 405
	simPowerLimitW    = 450
	simIdlePowerW     = 17
	simLoadPowerW     = 300 // added at full memory load
	simIdleTempC      = 33
	simLoadTempC      = 37 // added at full memory load
)

// SimConfig describes the simulated GPU. Zero fields take the defaults
// above, so SimConfig{Dir: d} is the reference RTX 4090.
type SimConfig struct {
	// Dir holds the claims (see WriteClaim) of the simulated processes.
	// Empty means none: the GPU stays idle.
	Dir string
	// TotalMiB is the GPU's memory (default 24564).
	TotalMiB uint64
	// BaselineMiB is what an idle GPU shows as used (default 18).
	BaselineMiB uint64
	// DriverVersion (default "610.43.02"), CUDAVersion (default "13.0") and
	// Name (default "NVIDIA GeForce RTX 4090") are reported as given, so
	// tests can simulate an old driver.
	DriverVersion, CUDAVersion, Name string
	// HostMemMiB is the simulated host's RAM (default 65536, 64 GiB); see
	// HostMemAvailableMiB.
	HostMemMiB uint64
	// Devices are the simulated cards, in index order. Empty means one card
	// made of Name and TotalMiB above; a device's zero fields take those.
	Devices []SimDevice
	// P2P makes every pair of simulated cards report working peer-to-peer
	// access. Off, they report P2PGPUNotSupported, as consumer cards such
	// as the RTX 4090 do.
	P2P bool
}

// SimDevice is one simulated card.
type SimDevice struct {
	Name     string
	TotalMiB uint64
}

// SimUUIDFor is the fixed, GPU-looking UUID of simulated device index;
// device 0's is SimUUID. The first group differs per device (as real
// cards' do), so a shortened UUID still tells them apart.
func SimUUIDFor(index int) string {
	return fmt.Sprintf("GPU-5a1f%04x-0000-4000-8000-%012x", (0x4090+index)&0xffff, index)
}

// SimDeviceIndex returns the simulated device index a UUID made by SimUUIDFor
// names; ok is false for any other text.
func SimDeviceIndex(uuid string) (int, bool) {
	i := strings.LastIndexByte(uuid, '-')
	if i < 0 || len(uuid)-i-1 != 12 {
		return 0, false
	}
	n, err := strconv.ParseUint(uuid[i+1:], 16, 31)
	if err != nil || SimUUIDFor(int(n)) != uuid {
		return 0, false
	}
	return int(n), true
}

// simPCIBusID is the PCI address of simulated device index, one bus each.
func simPCIBusID(index int) string {
	return fmt.Sprintf("00000000:%02X:00.0", index+1)
}

// Sim is a simulated box of GPUs (one RTX 4090 by default) for the demo and
// for tests of everything above this package: it behaves like NVML on cards
// whose processes are the live claims in its Dir, each on the devices it
// names. Its figures are deterministic functions of
// the claimed memory. It is safe for concurrent use.
type Sim struct {
	cfg    SimConfig
	mu     sync.Mutex
	closed bool
}

// NewSim returns a simulated GPU; zero fields of cfg take the defaults.
func NewSim(cfg SimConfig) *Sim {
	if cfg.TotalMiB == 0 {
		cfg.TotalMiB = DefaultSimTotalMiB
	}
	if cfg.BaselineMiB == 0 {
		cfg.BaselineMiB = DefaultSimBaselineMiB
	}
	if cfg.DriverVersion == "" {
		cfg.DriverVersion = DefaultSimDriverVersion
	}
	if cfg.CUDAVersion == "" {
		cfg.CUDAVersion = DefaultSimCUDAVersion
	}
	if cfg.Name == "" {
		cfg.Name = DefaultSimName
	}
	if cfg.HostMemMiB == 0 {
		cfg.HostMemMiB = DefaultSimHostMemMiB
	}
	devs := make([]SimDevice, 0, max(len(cfg.Devices), 1))
	devs = append(devs, cfg.Devices...)
	if len(devs) == 0 {
		devs = append(devs, SimDevice{})
	}
	for i := range devs {
		if devs[i].Name == "" {
			devs[i].Name = cfg.Name
		}
		if devs[i].TotalMiB == 0 {
			devs[i].TotalMiB = cfg.TotalMiB
		}
	}
	cfg.Devices = devs
	return &Sim{cfg: cfg}
}

// Snapshot reads the live claims and derives the GPU's state from them:
// used memory is the idle baseline plus the claims' MiB (capped at the
// total; their HostMiB is host memory and does not count), the processes are
// the claimants, and utilisation, power, temperature and clocks rise with
// the claimed share of memory. Claims of dead processes
// are removed on the way (see ReadClaims).
func (s *Sim) Snapshot(ctx context.Context) (Snapshot, error) {
	if s == nil {
		return Snapshot{}, fmt.Errorf("simulated GPU snapshot: %w", ErrUnavailable)
	}
	if err := ctx.Err(); err != nil {
		return Snapshot{}, fmt.Errorf("simulated GPU snapshot: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return Snapshot{}, fmt.Errorf("simulated GPU snapshot: %w", ErrClosed)
	}
	taken := time.Now()
	var claims []Claim
	if s.cfg.Dir != "" {
		var err error
		if claims, err = ReadClaims(s.cfg.Dir); err != nil {
			return Snapshot{}, fmt.Errorf("simulated GPU snapshot: %w", err)
		}
	}

	cfg := s.cfg
	snap := Snapshot{
		Backend:           "sim",
		DriverVersion:     cfg.DriverVersion,
		CUDADriverVersion: cfg.CUDAVersion,
		Devices:           make([]Device, 0, len(cfg.Devices)),
		TakenAt:           taken,
	}
	for i, sd := range cfg.Devices {
		snap.Devices = append(snap.Devices, simDevice(cfg, i, sd, claims))
	}
	for a := range cfg.Devices {
		for b := a + 1; b < len(cfg.Devices); b++ {
			st := P2PGPUNotSupported
			if cfg.P2P {
				st = P2POK
			}
			snap.P2P = append(snap.P2P, P2PLink{A: a, B: b, Status: st})
		}
	}
	return snap, nil
}

// simDevice derives simulated device index's state from the claims on it.
func simDevice(cfg SimConfig, index int, sd SimDevice, claims []Claim) Device {
	var claimed uint64
	procs := make([]Process, 0, len(claims))
	for _, c := range claims {
		if !c.On(index) {
			continue
		}
		claimed = satAdd(claimed, c.MiB)
		name := c.Name
		if name == "" {
			name = ProcessName(c.PID)
		}
		procs = append(procs, Process{PID: c.PID, UsedMiB: c.MiB, Name: name})
	}
	used := min(satAdd(cfg.BaselineMiB, claimed), sd.TotalMiB)

	// load is the claimed share of the memory an idle GPU leaves free.
	load := 0.0
	if room := sd.TotalMiB - min(cfg.BaselineMiB, sd.TotalMiB); room > 0 {
		load = math.Min(1, float64(claimed)/float64(room))
	}
	d := Device{
		Index:          index,
		Name:           sd.Name,
		UUID:           SimUUIDFor(index),
		PCIBusID:       simPCIBusID(index),
		MemoryTotalMiB: sd.TotalMiB,
		MemoryUsedMiB:  used,
		MemoryFreeMiB:  sd.TotalMiB - used,
		TemperatureC:   simIdleTempC + int(math.Round(simLoadTempC*load)),
		PowerW:         math.Round((simIdlePowerW+simLoadPowerW*load)*100) / 100,
		PowerLimitW:    simPowerLimitW,
		SMClockMHz:     simIdleSMClock,
		MemClockMHz:    simIdleMemClock,
		MaxMemClockMHz: simMaxMemClockMHz,
		BusWidthBits:   simBusWidthBits,
		BandwidthGBs:   Bandwidth(simMaxMemClockMHz, simBusWidthBits),
		Processes:      procs,
	}
	if len(procs) > 0 {
		// A process holding the GPU keeps it out of its idle state.
		d.UtilizationGPU = 5 + int(math.Round(90*load))
		d.UtilizationMemory = 2 + int(math.Round(60*load))
		d.SMClockMHz = simBusySMClock
		d.MemClockMHz = simMaxMemClockMHz
	}
	return d
}

// HostMemTotalMiB is the simulated host's RAM (SimConfig.HostMemMiB).
func (s *Sim) HostMemTotalMiB() uint64 {
	if s == nil {
		return 0
	}
	return s.cfg.HostMemMiB
}

// HostMemAvailableMiB is the simulated host RAM left: HostMemMiB minus the
// HostMiB of the live claims (dead processes' claims are removed on the way,
// see ReadClaims), never below 0. It is what a simulated vLLM's sleep level 1
// (weights offloaded to host memory) takes away, so a test can check that
// standby does not overcommit the host. The same errors as Snapshot.
func (s *Sim) HostMemAvailableMiB(ctx context.Context) (uint64, error) {
	if s == nil {
		return 0, fmt.Errorf("simulated host memory: %w", ErrUnavailable)
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("simulated host memory: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, fmt.Errorf("simulated host memory: %w", ErrClosed)
	}
	var held uint64
	if s.cfg.Dir != "" {
		claims, err := ReadClaims(s.cfg.Dir)
		if err != nil {
			return 0, fmt.Errorf("simulated host memory: %w", err)
		}
		for _, c := range claims {
			held = satAdd(held, c.HostMiB)
		}
	}
	return s.cfg.HostMemMiB - min(held, s.cfg.HostMemMiB), nil
}

// Close ends the simulator's use; later Snapshots fail with ErrClosed, as
// with the real backend. Claims are left alone: they belong to their
// processes.
func (s *Sim) Close() error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

// satAdd adds without wrapping, so absurd claims saturate instead of making
// a full GPU look empty.
func satAdd(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}
