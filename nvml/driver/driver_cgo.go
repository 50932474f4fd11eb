//go:build cgo

package driver

import (
	"context"
	"fmt"
	"gpuhost/nvml"
	"math"
	"sort"
	"sync"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// library is the part of go-nvml's nvml.Interface that gpuhost uses. Keeping
// it this small documents exactly which driver calls gpuhost makes, and lets
// tests drive the wrapper through go-nvml's own mock package.
type library interface {
	Init() gonvml.Return
	Shutdown() gonvml.Return
	SystemGetDriverVersion() (string, gonvml.Return)
	SystemGetCudaDriverVersion() (int, gonvml.Return)
	DeviceGetCount() (int, gonvml.Return)
	DeviceGetHandleByIndex(index int) (gonvml.Device, gonvml.Return)
	Extensions() gonvml.ExtendedInterface
}

// device is the part of go-nvml's nvml.Device that gpuhost reads.
type device interface {
	GetName() (string, gonvml.Return)
	GetUUID() (string, gonvml.Return)
	GetMemoryInfo() (gonvml.Memory, gonvml.Return)
	GetUtilizationRates() (gonvml.Utilization, gonvml.Return)
	GetTemperature(sensor gonvml.TemperatureSensors) (uint32, gonvml.Return)
	GetPowerUsage() (uint32, gonvml.Return)
	GetEnforcedPowerLimit() (uint32, gonvml.Return)
	GetClockInfo(clock gonvml.ClockType) (uint32, gonvml.Return)
	GetMaxClockInfo(clock gonvml.ClockType) (uint32, gonvml.Return)
	GetMemoryBusWidth() (uint32, gonvml.Return)
	GetComputeRunningProcesses() ([]gonvml.ProcessInfo, gonvml.Return)
	GetGraphicsRunningProcesses() ([]gonvml.ProcessInfo, gonvml.Return)
	GetPciInfo() (gonvml.PciInfo, gonvml.Return)
	GetP2PStatus(other gonvml.Device, index gonvml.GpuP2PCapsIndex) (gonvml.GpuP2PStatus, gonvml.Return)
}

// Compile-time proof that go-nvml's interfaces cover ours, so Open can hand
// the real library to the same code the tests exercise.
var (
	_ library = gonvml.Interface(nil)
	_ device  = gonvml.Device(nil)
)

// NVML reads GPU facts from the NVIDIA driver. It is safe for concurrent use;
// snapshots are serialised. Create it with Open and release it with Close.
type NVML struct {
	mu     sync.Mutex
	lib    library
	closed bool
	// hasBusWidth records whether the loaded libnvidia-ml exports
	// nvmlDeviceGetMemoryBusWidth, which older drivers may lack (the other
	// functions gpuhost calls are far older). go-nvml binds symbols lazily,
	// so calling a missing one would abort the process instead of
	// returning an error.
	hasBusWidth bool
}

// Open initialises NVML. When that fails (no driver, no libnvidia-ml, no
// permission) it returns an error wrapping nvml.ErrUnavailable and the NVML return
// code, and calls no other NVML function: go-nvml resolves symbols lazily, so
// any call into an uninitialised library can kill the process.
func Open() (*NVML, error) {
	return newWithLib(gonvml.New())
}

// newWithLib is Open over any implementation of the NVML API (the real
// library or go-nvml's mock).
func newWithLib(lib library) (*NVML, error) {
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		// Not even Shutdown: nothing may touch NVML after a failed Init.
		return nil, fmt.Errorf("open NVML: init: %w: %w%s", nvml.ErrUnavailable, returnError{ret}, initHint(ret))
	}
	n := &NVML{lib: lib}
	if ext := lib.Extensions(); ext != nil {
		n.hasBusWidth = ext.LookupSymbol(busWidthSymbol) == nil
	}
	return n, nil
}

// busWidthSymbol is looked up before use, see NVML.hasBusWidth.
const busWidthSymbol = "nvmlDeviceGetMemoryBusWidth"

// initHint tells the operator the usual cause of an Init failure.
func initHint(ret gonvml.Return) string {
	switch ret {
	case gonvml.ERROR_LIBRARY_NOT_FOUND:
		return " (libnvidia-ml.so.1 not found: is the NVIDIA driver installed?)"
	case gonvml.ERROR_DRIVER_NOT_LOADED:
		return " (the NVIDIA kernel module is not loaded)"
	case gonvml.ERROR_NO_PERMISSION:
		return " (no permission to open /dev/nvidia*)"
	case gonvml.ERROR_LIB_RM_VERSION_MISMATCH:
		return " (user-space library and kernel module differ: reboot after a driver update)"
	}
	return ""
}

// returnError carries an NVML return code as an error. Its text comes from
// nvml.ErrorString (the driver's own wording once the library is loaded) and
// it unwraps to the code, so errors.Is(err, nvml.ERROR_NOT_SUPPORTED) works.
type returnError struct{ ret gonvml.Return }

func (e returnError) Error() string { return gonvml.ErrorString(e.ret) }
func (e returnError) Unwrap() error { return e.ret }

// Snapshot reads every GPU's facts. Driver version, CUDA version, device
// count, and each device's name, UUID and memory are required: if one fails
// the snapshot fails. Other facts are optional: a card that cannot report
// them (NOT_SUPPORTED on consumer cards, NO_PERMISSION for processes of other
// users) leaves them zero and names them in nvml.Device.FactErrors. ctx is checked
// before starting and between devices; a single NVML call cannot be
// interrupted.
func (n *NVML) Snapshot(ctx context.Context) (nvml.Snapshot, error) {
	if n == nil {
		return nvml.Snapshot{}, fmt.Errorf("NVML snapshot: %w", nvml.ErrUnavailable)
	}
	if err := ctx.Err(); err != nil {
		return nvml.Snapshot{}, fmt.Errorf("NVML snapshot: %w", err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nvml.Snapshot{}, fmt.Errorf("NVML snapshot: %w", nvml.ErrClosed)
	}
	if err := ctx.Err(); err != nil { // may have expired while waiting for the lock
		return nvml.Snapshot{}, fmt.Errorf("NVML snapshot: %w", err)
	}
	snap := nvml.Snapshot{Backend: "nvml", TakenAt: time.Now()}

	driver, ret := n.lib.SystemGetDriverVersion()
	if ret != gonvml.SUCCESS {
		return nvml.Snapshot{}, fmt.Errorf("NVML snapshot: read driver version: %w", returnError{ret})
	}
	snap.DriverVersion = driver
	cuda, ret := n.lib.SystemGetCudaDriverVersion()
	if ret != gonvml.SUCCESS {
		return nvml.Snapshot{}, fmt.Errorf("NVML snapshot: read CUDA driver version: %w", returnError{ret})
	}
	snap.CUDADriverVersion = cudaVersionString(cuda)
	count, ret := n.lib.DeviceGetCount()
	if ret != gonvml.SUCCESS {
		return nvml.Snapshot{}, fmt.Errorf("NVML snapshot: count devices: %w", returnError{ret})
	}

	snap.Devices = make([]nvml.Device, 0, max(count, 0))
	handles := make([]gonvml.Device, 0, max(count, 0))
	for i := 0; i < count; i++ {
		if err := ctx.Err(); err != nil {
			return nvml.Snapshot{}, fmt.Errorf("NVML snapshot: before device %d: %w", i, err)
		}
		h, ret := n.lib.DeviceGetHandleByIndex(i)
		if ret != gonvml.SUCCESS {
			return nvml.Snapshot{}, fmt.Errorf("NVML snapshot: get handle of device %d: %w", i, returnError{ret})
		}
		if h == nil {
			return nvml.Snapshot{}, fmt.Errorf("NVML snapshot: get handle of device %d: NVML returned no handle", i)
		}
		d, err := readDevice(i, h, n.hasBusWidth)
		if err != nil {
			return nvml.Snapshot{}, fmt.Errorf("NVML snapshot: %w", err)
		}
		snap.Devices = append(snap.Devices, d)
		handles = append(handles, h)
	}
	snap.P2P = readP2P(handles)
	return snap, nil
}

// p2pCaps are the capabilities NCCL's peer-to-peer transport needs: a pair
// counts as P2POK only when both are OK.
var p2pCaps = []gonvml.GpuP2PCapsIndex{gonvml.P2P_CAPS_INDEX_READ, gonvml.P2P_CAPS_INDEX_WRITE}

// readP2P asks the driver for the peer-to-peer status of every pair of
// devices (nvmlDeviceGetP2PStatus). A pair whose status cannot be read is
// P2PUnknown with the reason, never a failed snapshot: P2P only matters for
// tensor parallelism, and unknown is treated as missing there.
func readP2P(handles []gonvml.Device) []nvml.P2PLink {
	var out []nvml.P2PLink
	for a := range handles {
		for b := a + 1; b < len(handles); b++ {
			l := nvml.P2PLink{A: a, B: b, Status: nvml.P2POK}
			for _, c := range p2pCaps {
				st, ret := handles[a].GetP2PStatus(handles[b], c)
				if ret != gonvml.SUCCESS {
					l.Status, l.Err = nvml.P2PUnknown, gonvml.ErrorString(ret)
					break
				}
				if st != gonvml.P2P_STATUS_OK {
					l.Status = p2pStatusName(st)
					break
				}
			}
			out = append(out, l)
		}
	}
	return out
}

// p2pStatusName maps NVML's P2P status to nvml's names.
func p2pStatusName(st gonvml.GpuP2PStatus) string {
	switch st {
	case gonvml.P2P_STATUS_OK:
		return nvml.P2POK
	case gonvml.P2P_STATUS_CHIPSET_NOT_SUPPORTED:
		return nvml.P2PChipsetNotSupported
	case gonvml.P2P_STATUS_GPU_NOT_SUPPORTED:
		return nvml.P2PGPUNotSupported
	case gonvml.P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED:
		return nvml.P2PTopologyNotSupported
	case gonvml.P2P_STATUS_DISABLED_BY_REGKEY:
		return nvml.P2PDisabledByRegkey
	case gonvml.P2P_STATUS_NOT_SUPPORTED:
		return nvml.P2PNotSupported
	}
	return nvml.P2PUnknown
}

// busID turns NVML's NUL-terminated C string into Go text.
func busID(raw [32]int8) string {
	b := make([]byte, 0, len(raw))
	for _, c := range raw {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

// readDevice reads one GPU's facts; see nvml.Snapshot for which are required.
func readDevice(index int, h device, hasBusWidth bool) (nvml.Device, error) {
	d := nvml.Device{Index: index}
	var ret gonvml.Return

	if d.Name, ret = h.GetName(); ret != gonvml.SUCCESS {
		return nvml.Device{}, fmt.Errorf("read name of device %d: %w", index, returnError{ret})
	}
	if d.UUID, ret = h.GetUUID(); ret != gonvml.SUCCESS {
		return nvml.Device{}, fmt.Errorf("read UUID of device %d: %w", index, returnError{ret})
	}
	mem, ret := h.GetMemoryInfo()
	if ret != gonvml.SUCCESS {
		return nvml.Device{}, fmt.Errorf("read memory of device %d (%s): %w", index, d.Name, returnError{ret})
	}
	d.MemoryTotalMiB = bytesToMiB(mem.Total)
	d.MemoryUsedMiB = bytesToMiB(mem.Used)
	d.MemoryFreeMiB = bytesToMiB(mem.Free)

	// ok records an optional fact's failure and reports whether it was read.
	ok := func(field string, ret gonvml.Return) bool {
		if ret == gonvml.SUCCESS {
			return true
		}
		if d.FactErrors == nil {
			d.FactErrors = make(map[string]string)
		}
		if _, seen := d.FactErrors[field]; !seen { // the first reason is kept
			d.FactErrors[field] = gonvml.ErrorString(ret)
		}
		return false
	}
	if u, ret := h.GetUtilizationRates(); ok("utilization_gpu", ret) {
		d.UtilizationGPU, d.UtilizationMemory = int(u.Gpu), int(u.Memory)
	} else {
		d.FactErrors["utilization_memory"] = d.FactErrors["utilization_gpu"]
	}
	// GetTemperature is deprecated in NVML 13 but, unlike GetTemperatureV,
	// exists in every driver gpuhost may meet (535 included).
	if t, ret := h.GetTemperature(gonvml.TEMPERATURE_GPU); ok("temperature_c", ret) {
		d.TemperatureC = int(t)
	}
	if mw, ret := h.GetPowerUsage(); ok("power_w", ret) {
		d.PowerW = float64(mw) / 1000
	}
	if mw, ret := h.GetEnforcedPowerLimit(); ok("power_limit_w", ret) {
		d.PowerLimitW = float64(mw) / 1000
	}
	if pci, ret := h.GetPciInfo(); ok("pci_bus_id", ret) {
		d.PCIBusID = busID(pci.BusId)
	}
	if c, ret := h.GetClockInfo(gonvml.CLOCK_SM); ok("sm_clock_mhz", ret) {
		d.SMClockMHz = int(c)
	}
	if c, ret := h.GetClockInfo(gonvml.CLOCK_MEM); ok("mem_clock_mhz", ret) {
		d.MemClockMHz = int(c)
	}
	if c, ret := h.GetMaxClockInfo(gonvml.CLOCK_MEM); ok("max_mem_clock_mhz", ret) {
		d.MaxMemClockMHz = int(c)
	}
	if !hasBusWidth {
		ok("bus_width_bits", gonvml.ERROR_FUNCTION_NOT_FOUND)
	} else if w, ret := h.GetMemoryBusWidth(); ok("bus_width_bits", ret) {
		d.BusWidthBits = int(w)
	}
	d.BandwidthGBs = nvml.Bandwidth(d.MaxMemClockMHz, d.BusWidthBits)

	compute, ret := h.GetComputeRunningProcesses()
	if !ok("processes", ret) {
		compute = nil
	}
	graphics, ret := h.GetGraphicsRunningProcesses()
	if !ok("processes", ret) {
		graphics = nil
	}
	d.Processes = mergeProcesses(compute, graphics)
	return d, nil
}

// mergeProcesses joins NVML's compute and graphics process lists. A process
// with both a CUDA and a graphics context appears in both lists with the
// same memory, so it is kept once, with the larger figure, not the sum. The
// result is sorted by PID so that snapshots compare equal when nothing moved.
func mergeProcesses(lists ...[]gonvml.ProcessInfo) []nvml.Process {
	used := make(map[uint32]uint64)
	for _, list := range lists {
		for _, p := range list {
			mib := uint64(0)
			if p.UsedGpuMemory != math.MaxUint64 { // NVML_VALUE_NOT_AVAILABLE
				mib = bytesToMiB(p.UsedGpuMemory)
			}
			if prev, seen := used[p.Pid]; !seen || mib > prev {
				used[p.Pid] = mib
			}
		}
	}
	out := make([]nvml.Process, 0, len(used))
	for pid, mib := range used {
		out = append(out, nvml.Process{PID: int(pid), UsedMiB: mib, Name: nvml.ProcessName(int(pid))})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PID < out[j].PID })
	return out
}

// Close shuts NVML down. Later Snapshots fail with nvml.ErrClosed without
// touching the driver; a second Close does nothing.
func (n *NVML) Close() error {
	if n == nil {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	n.closed = true
	if ret := n.lib.Shutdown(); ret != gonvml.SUCCESS {
		return fmt.Errorf("close NVML: shutdown: %w", returnError{ret})
	}
	return nil
}

// cudaVersionString turns NVML's CUDA driver version integer (1000 × major +
// 10 × minor, e.g. 13000 or 12040) into "13.0" or "12.4".
func cudaVersionString(v int) string {
	if v <= 0 {
		return ""
	}
	return fmt.Sprintf("%d.%d", v/1000, (v%1000)/10)
}

// bytesToMiB converts a byte count to whole MiB, rounding down like nvidia-smi.
func bytesToMiB(b uint64) uint64 { return b / (1 << 20) }
