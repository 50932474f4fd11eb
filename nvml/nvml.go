// Package nvml is gpuhost's source of GPU facts: driver and CUDA versions,
// memory, utilisation, temperature, power, clocks, memory bandwidth and the
// processes that hold GPU memory.
//
// Two backends produce the same Snapshot: NVML (the real driver, through
// github.com/NVIDIA/go-nvml; needs cgo) and Sim (a simulated RTX 4090 whose
// used memory follows the claims that simulated inference servers write, see
// WriteClaim; a claim's HostMiB counts against the simulated host RAM that
// Sim.HostMemAvailableMiB reports instead). Consumers define their own small
// interface over Snapshot and Close and take either.
package nvml

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ErrUnavailable means the real GPU backend cannot be used on this machine or
// in this build (no driver, no libnvidia-ml, no GPU, built without cgo).
// Callers test for it with errors.Is to fall back to the simulator or to
// report "no GPU" instead of failing.
var ErrUnavailable = errors.New("NVML unavailable")

// ErrClosed is returned by Snapshot after Close, because a closed NVML handle
// must never reach the driver again.
var ErrClosed = errors.New("GPU backend closed")

// Snapshot is everything gpuhost knows about the GPUs at one instant. It is a
// plain value so that it can be cached, compared and sent as JSON.
type Snapshot struct {
	// Backend is "nvml" for the real driver or "sim" for the simulator, so
	// that every consumer can tell the operator which one they are seeing.
	Backend string `json:"backend"`
	// DriverVersion is the kernel driver version, e.g. "610.43.02".
	DriverVersion string `json:"driver_version"`
	// CUDADriverVersion is the newest CUDA version the driver supports,
	// e.g. "13.0" (NVML reports 13000).
	CUDADriverVersion string   `json:"cuda_driver_version"`
	Devices           []Device `json:"devices"`
	// P2P is the peer-to-peer status of every pair of devices (A < B), as
	// the driver reports it. Tensor parallelism over a pair without working
	// P2P must tell NCCL not to use it, so placement reads it from here
	// rather than guessing from the card's name. Empty with fewer than two
	// devices.
	P2P []P2PLink `json:"p2p,omitempty"`
	// TakenAt is when the snapshot was started.
	TakenAt time.Time `json:"taken_at"`
}

// Device holds the facts about one GPU. Optional facts the card cannot report
// (NVML_ERROR_NOT_SUPPORTED and the like) are zero and named in FactErrors.
type Device struct {
	Index int    `json:"index"`
	Name  string `json:"name"`
	// UUID is the driver's stable name of the card ("GPU-…"). Backends are
	// pinned by it, because CUDA's default device order (fastest first)
	// differs from NVML's PCI order, so an index can name another card.
	UUID string `json:"uuid"`
	// PCIBusID is the card's PCI address ("00000000:01:00.0"), the order
	// NVML and nvidia-smi number devices in; empty when unreadable.
	PCIBusID       string `json:"pci_bus_id,omitempty"`
	MemoryTotalMiB uint64 `json:"memory_total_mib"`
	MemoryUsedMiB  uint64 `json:"memory_used_mib"`
	MemoryFreeMiB  uint64 `json:"memory_free_mib"`
	// UtilizationGPU and UtilizationMemory are percentages over the
	// driver's last sample period.
	UtilizationGPU    int     `json:"utilization_gpu"`
	UtilizationMemory int     `json:"utilization_memory"`
	TemperatureC      int     `json:"temperature_c"`
	PowerW            float64 `json:"power_w"`
	PowerLimitW       float64 `json:"power_limit_w"`
	SMClockMHz        int     `json:"sm_clock_mhz"`
	MemClockMHz       int     `json:"mem_clock_mhz"`
	MaxMemClockMHz    int     `json:"max_mem_clock_mhz"`
	BusWidthBits      int     `json:"bus_width_bits"`
	// BandwidthGBs is the theoretical memory bandwidth, see Bandwidth. Decode
	// speed on one GPU is bounded by it, which is why gpuhost reports it.
	BandwidthGBs float64   `json:"bandwidth_gbs"`
	Processes    []Process `json:"processes"`
	// FactErrors names the optional facts that could not be read, keyed by
	// their JSON field name, with the reason (e.g. "power_w":
	// "ERROR_NOT_SUPPORTED"), so that a zero is never mistaken for a reading.
	FactErrors map[string]string `json:"fact_errors,omitempty"`
}

// Process is one process that holds memory on a GPU. Knowing them is how
// gpuhost detects a foreign process on its GPU and waits for VRAM release.
type Process struct {
	PID     int    `json:"pid"`
	UsedMiB uint64 `json:"used_mib"`
	// Name is the process's /proc/<pid>/comm, empty if unreadable.
	Name string `json:"name"`
}

// P2P statuses as NVML names them (nvmlGpuP2PStatus_t), lower-case. Only
// P2POK means peers can read and write each other's memory directly.
const (
	P2POK                   = "ok"
	P2PChipsetNotSupported  = "chipset_not_supported"
	P2PGPUNotSupported      = "gpu_not_supported"
	P2PTopologyNotSupported = "ioh_topology_not_supported"
	P2PDisabledByRegkey     = "disabled_by_regkey"
	P2PNotSupported         = "not_supported"
	P2PUnknown              = "unknown"
)

// P2PLink is the peer-to-peer status between devices A and B (indices,
// A < B): Status is P2POK only when both directions can read and write.
type P2PLink struct {
	A      int    `json:"a"`
	B      int    `json:"b"`
	Status string `json:"status"`
	// Err is why the status could not be read (Status is then P2PUnknown).
	Err string `json:"error,omitempty"`
}

// OK reports whether the pair has working peer-to-peer access.
func (l P2PLink) OK() bool { return l.Status == P2POK }

// Device0 returns the first GPU, the one a profile without a GPU placement
// runs on; ok is false when there is no GPU.
func (s Snapshot) Device0() (Device, bool) {
	if len(s.Devices) == 0 {
		return Device{}, false
	}
	return s.Devices[0], true
}

// Device returns the GPU with NVML index i; ok is false when there is none.
func (s Snapshot) Device(i int) (Device, bool) {
	for _, d := range s.Devices {
		if d.Index == i {
			return d, true
		}
	}
	return Device{}, false
}

// P2PBetween returns the peer-to-peer status of devices a and b in either
// order; ok is false when the snapshot does not know it (a device missing,
// or a == b).
func (s Snapshot) P2PBetween(a, b int) (P2PLink, bool) {
	if a > b {
		a, b = b, a
	}
	for _, l := range s.P2P {
		if l.A == a && l.B == b {
			return l, true
		}
	}
	return P2PLink{}, false
}

// P2PMissing returns the pairs among indices whose peer-to-peer status is
// not P2POK (unknown counts as missing: NCCL must not rely on what NVML did
// not confirm), in index order. Empty for fewer than two devices.
func (s Snapshot) P2PMissing(indices []int) []P2PLink {
	var out []P2PLink
	for i := 0; i < len(indices); i++ {
		for j := i + 1; j < len(indices); j++ {
			l, ok := s.P2PBetween(indices[i], indices[j])
			if !ok {
				a, b := min(indices[i], indices[j]), max(indices[i], indices[j])
				l = P2PLink{A: a, B: b, Status: P2PUnknown, Err: "not reported by the GPU backend"}
			}
			if !l.OK() {
				out = append(out, l)
			}
		}
	}
	return out
}

// DriverMajor returns the major number of an NVIDIA driver version
// ("610.43.02" → 610). Settings rules compare it (CUDA 13 needs ≥ 580), so
// anything that is not digits before the first dot is an error rather than a
// guess.
func DriverMajor(version string) (int, error) {
	v := strings.TrimSpace(version)
	if v == "" {
		return 0, fmt.Errorf("parse NVIDIA driver version %q: empty", version)
	}
	major, _, _ := strings.Cut(v, ".")
	if major == "" {
		return 0, fmt.Errorf("parse NVIDIA driver version %q: no major number before the first dot", version)
	}
	for _, r := range major {
		if r < '0' || r > '9' {
			return 0, fmt.Errorf("parse NVIDIA driver version %q: major part %q is not a number", version, major)
		}
	}
	n, err := strconv.Atoi(major)
	if err != nil {
		return 0, fmt.Errorf("parse NVIDIA driver version %q: major part %q: %w", version, major, err)
	}
	return n, nil
}

// Bandwidth is the theoretical memory bandwidth in GB/s (10^9 bytes per
// second) from the maximum memory clock and the bus width as NVML reports
// them: MHz × 2 (double data rate) × bits / 8 / 1000. An RTX 4090 (10501 MHz,
// 384 bit) gives 1008 GB/s. Unknown (non-positive) inputs give 0.
func Bandwidth(maxMemClockMHz, busWidthBits int) float64 {
	if maxMemClockMHz <= 0 || busWidthBits <= 0 {
		return 0
	}
	return float64(maxMemClockMHz) * 2 * float64(busWidthBits) / 8 / 1000
}

// ProcessName returns the command name of pid from /proc/<pid>/comm, or "" when
// the process is gone or not visible (another PID namespace, hidepid).
func ProcessName(pid int) string {
	if pid <= 0 {
		return ""
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return ""
	}
	return strings.TrimRight(string(b), "\n")
}
