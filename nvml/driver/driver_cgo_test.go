//go:build cgo

package driver

import (
	"context"
	"errors"
	"fmt"
	"gpuhost/internal/testkit"
	"gpuhost/nvml"
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

const mib = 1 << 20

// fakeGPU is an RTX 4090 built from go-nvml's own generated mocks. Every
// method the wrapper should not call is left nil, so calling it panics.
type fakeGPU struct {
	lib  *mock.Interface
	devs []*mock.Device
}

// new4090s returns a fake NVML with n RTX 4090s on driver 610.43.02 / CUDA 13.
// nvml.Device i uses i*1000 MiB more memory than device 0, so devices can be told
// apart.
func new4090s(n int) *fakeGPU {
	f := &fakeGPU{}
	for i := 0; i < n; i++ {
		f.devs = append(f.devs, new4090Device(i))
	}
	f.lib = &mock.Interface{
		InitFunc:                       func() gonvml.Return { return gonvml.SUCCESS },
		ShutdownFunc:                   func() gonvml.Return { return gonvml.SUCCESS },
		SystemGetDriverVersionFunc:     func() (string, gonvml.Return) { return "610.43.02", gonvml.SUCCESS },
		SystemGetCudaDriverVersionFunc: func() (int, gonvml.Return) { return 13000, gonvml.SUCCESS },
		DeviceGetCountFunc:             func() (int, gonvml.Return) { return len(f.devs), gonvml.SUCCESS },
		ExtensionsFunc: func() gonvml.ExtendedInterface {
			return &mock.ExtendedInterface{LookupSymbolFunc: func(string) error { return nil }}
		},
		DeviceGetHandleByIndexFunc: func(i int) (gonvml.Device, gonvml.Return) {
			if i < 0 || i >= len(f.devs) {
				return nil, gonvml.ERROR_INVALID_ARGUMENT
			}
			return f.devs[i], gonvml.SUCCESS
		},
	}
	return f
}

func new4090Device(i int) *mock.Device {
	used := uint64(1000+1000*i) * mib
	return &mock.Device{
		GetNameFunc: func() (string, gonvml.Return) { return "NVIDIA GeForce RTX 4090", gonvml.SUCCESS },
		GetUUIDFunc: func() (string, gonvml.Return) {
			return fmt.Sprintf("GPU-00000000-0000-0000-0000-00000000000%d", i), gonvml.SUCCESS
		},
		GetMemoryInfoFunc: func() (gonvml.Memory, gonvml.Return) {
			return gonvml.Memory{Total: 24564 * mib, Used: used, Free: 24564*mib - used}, gonvml.SUCCESS
		},
		GetUtilizationRatesFunc: func() (gonvml.Utilization, gonvml.Return) {
			return gonvml.Utilization{Gpu: 97, Memory: 61}, gonvml.SUCCESS
		},
		GetTemperatureFunc: func(s gonvml.TemperatureSensors) (uint32, gonvml.Return) {
			if s != gonvml.TEMPERATURE_GPU {
				return 0, gonvml.ERROR_INVALID_ARGUMENT
			}
			return 64, gonvml.SUCCESS
		},
		GetPowerUsageFunc:         func() (uint32, gonvml.Return) { return 312_456, gonvml.SUCCESS },
		GetEnforcedPowerLimitFunc: func() (uint32, gonvml.Return) { return 450_000, gonvml.SUCCESS },
		GetClockInfoFunc: func(c gonvml.ClockType) (uint32, gonvml.Return) {
			switch c {
			case gonvml.CLOCK_SM:
				return 2520, gonvml.SUCCESS
			case gonvml.CLOCK_MEM:
				return 10251, gonvml.SUCCESS
			}
			return 0, gonvml.ERROR_INVALID_ARGUMENT
		},
		GetMaxClockInfoFunc: func(c gonvml.ClockType) (uint32, gonvml.Return) {
			if c != gonvml.CLOCK_MEM {
				return 0, gonvml.ERROR_INVALID_ARGUMENT
			}
			return 10501, gonvml.SUCCESS
		},
		GetMemoryBusWidthFunc: func() (uint32, gonvml.Return) { return 384, gonvml.SUCCESS },
		GetComputeRunningProcessesFunc: func() ([]gonvml.ProcessInfo, gonvml.Return) {
			return nil, gonvml.SUCCESS
		},
		GetGraphicsRunningProcessesFunc: func() ([]gonvml.ProcessInfo, gonvml.Return) {
			return nil, gonvml.SUCCESS
		},
		GetPciInfoFunc: func() (gonvml.PciInfo, gonvml.Return) {
			var p gonvml.PciInfo
			for k, c := range fmt.Sprintf("00000000:%02X:00.0", i+1) {
				p.BusId[k] = int8(c)
			}
			return p, gonvml.SUCCESS
		},
		GetP2PStatusFunc: func(gonvml.Device, gonvml.GpuP2PCapsIndex) (gonvml.GpuP2PStatus, gonvml.Return) {
			return gonvml.P2P_STATUS_GPU_NOT_SUPPORTED, gonvml.SUCCESS
		},
	}
}

// want4090 is what the wrapper must make of new4090Device(0).
func want4090() nvml.Device {
	return nvml.Device{
		Index: 0, Name: "NVIDIA GeForce RTX 4090", UUID: "GPU-00000000-0000-0000-0000-000000000000", PCIBusID: "00000000:01:00.0",
		MemoryTotalMiB: 24564, MemoryUsedMiB: 1000, MemoryFreeMiB: 23564,
		UtilizationGPU: 97, UtilizationMemory: 61, TemperatureC: 64,
		PowerW: 312.456, PowerLimitW: 450,
		SMClockMHz: 2520, MemClockMHz: 10251, MaxMemClockMHz: 10501, BusWidthBits: 384,
		BandwidthGBs: 1008.096,
		Processes:    []nvml.Process{},
	}
}

// mustOpen wraps the fake in the real wrapper, failing on any panic (a call
// to an unmocked NVML function).
func mustOpen(t *testing.T, f *fakeGPU) *NVML {
	t.Helper()
	n, err := newWithLib(f.lib)
	if err != nil {
		t.Fatalf("newWithLib: %v", err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

func TestNVMLSnapshotValues(t *testing.T) {
	f := new4090s(1)
	n := mustOpen(t, f)
	snap, err := n.Snapshot(context.Background())
	if err != nil {
		t.Fatalf("nvml.Snapshot: %v", err)
	}
	if snap.Backend != "nvml" || snap.DriverVersion != "610.43.02" || snap.CUDADriverVersion != "13.0" {
		t.Errorf("snapshot header = %q %q %q; want nvml 610.43.02 13.0", snap.Backend, snap.DriverVersion, snap.CUDADriverVersion)
	}
	if snap.TakenAt.IsZero() {
		t.Error("TakenAt is zero")
	}
	d, ok := snap.Device0()
	if !ok {
		t.Fatal("no device")
	}
	if want := want4090(); !reflect.DeepEqual(d, want) {
		t.Fatalf("device =\n%+v\nwant\n%+v", d, want)
	}
	if got := len(f.lib.InitCalls()); got != 1 {
		t.Errorf("Init called %d times; want 1", got)
	}
}

func TestNVMLSnapshotMultipleDevices(t *testing.T) {
	n := mustOpen(t, new4090s(3))
	snap, err := n.Snapshot(context.Background())
	if err != nil {
		t.Fatalf("nvml.Snapshot: %v", err)
	}
	if len(snap.Devices) != 3 {
		t.Fatalf("got %d devices; want 3", len(snap.Devices))
	}
	for i, d := range snap.Devices {
		if d.Index != i || d.MemoryUsedMiB != uint64(1000+1000*i) || !strings.HasSuffix(d.UUID, fmt.Sprint(i)) {
			t.Errorf("device %d = index %d, used %d MiB, uuid %s; want index %d, %d MiB", i, d.Index, d.MemoryUsedMiB, d.UUID, i, 1000+1000*i)
		}
	}
}

func TestNVMLNoDevices(t *testing.T) {
	n := mustOpen(t, new4090s(0))
	snap, err := n.Snapshot(context.Background())
	if err != nil {
		t.Fatalf("nvml.Snapshot: %v", err)
	}
	if _, ok := snap.Device0(); ok || snap.Devices == nil {
		t.Fatalf("Devices = %#v; want empty, non-nil (JSON [])", snap.Devices)
	}
}

// TestNVMLInitFailureCallsNothingElse: after a failed Init any NVML call can
// kill the process, so Open must stop there. Every method but Init is nil in
// the mock and would panic if called; the call count is checked too.
func TestNVMLInitFailureCallsNothingElse(t *testing.T) {
	tests := []struct {
		ret      gonvml.Return
		wantHint string
	}{
		{gonvml.ERROR_LIBRARY_NOT_FOUND, "is the NVIDIA driver installed"},
		{gonvml.ERROR_DRIVER_NOT_LOADED, "kernel module is not loaded"},
		{gonvml.ERROR_NO_PERMISSION, "no permission"},
		{gonvml.ERROR_LIB_RM_VERSION_MISMATCH, "reboot"},
		{gonvml.ERROR_UNKNOWN, ""},
	}
	for _, tt := range tests {
		t.Run(gonvml.ErrorString(tt.ret), func(t *testing.T) {
			lib := &mock.Interface{InitFunc: func() gonvml.Return { return tt.ret }}
			var (
				n   *NVML
				err error
			)
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Fatalf("wrapper called NVML after failed Init: %v", p)
					}
				}()
				n, err = newWithLib(lib)
			}()
			if n != nil || err == nil {
				t.Fatalf("newWithLib = %v, %v; want nil and an error", n, err)
			}
			if !errors.Is(err, nvml.ErrUnavailable) || !errors.Is(err, tt.ret) {
				t.Errorf("error %q does not wrap nvml.ErrUnavailable and %v", err, tt.ret)
			}
			if !strings.Contains(err.Error(), gonvml.ErrorString(tt.ret)) || !strings.Contains(err.Error(), tt.wantHint) {
				t.Errorf("error %q; want the NVML error text and hint %q", err, tt.wantHint)
			}
			if got := len(lib.InitCalls()); got != 1 {
				t.Errorf("Init called %d times; want 1", got)
			}
			if got := len(lib.ShutdownCalls()); got != 0 {
				t.Errorf("Shutdown called %d times after failed Init; want 0", got)
			}
			// The nil handle a failed Open returns must be harmless too.
			if _, err := n.Snapshot(context.Background()); !errors.Is(err, nvml.ErrUnavailable) {
				t.Errorf("nvml.Snapshot on nil NVML = %v; want ErrUnavailable", err)
			}
			if err := n.Close(); err != nil {
				t.Errorf("Close on nil NVML = %v; want nil", err)
			}
		})
	}
}

// TestNVMLOptionalFactsNotSupported: consumer cards refuse some queries; the
// snapshot must still succeed with those fields zero and named.
func TestNVMLOptionalFactsNotSupported(t *testing.T) {
	notSupported := gonvml.ERROR_NOT_SUPPORTED
	tests := []struct {
		name       string
		breakIt    func(d *mock.Device)
		zero       func(d *nvml.Device) // zeroes the fields expected to be zero
		factErrors []string
	}{
		{
			name: "utilization",
			breakIt: func(d *mock.Device) {
				d.GetUtilizationRatesFunc = func() (gonvml.Utilization, gonvml.Return) { return gonvml.Utilization{Gpu: 9}, notSupported }
			},
			zero:       func(d *nvml.Device) { d.UtilizationGPU, d.UtilizationMemory = 0, 0 },
			factErrors: []string{"utilization_gpu", "utilization_memory"},
		},
		{
			name: "temperature",
			breakIt: func(d *mock.Device) {
				d.GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) { return 99, notSupported }
			},
			zero:       func(d *nvml.Device) { d.TemperatureC = 0 },
			factErrors: []string{"temperature_c"},
		},
		{
			name: "power",
			breakIt: func(d *mock.Device) {
				d.GetPowerUsageFunc = func() (uint32, gonvml.Return) { return 1, notSupported }
				d.GetEnforcedPowerLimitFunc = func() (uint32, gonvml.Return) { return 1, notSupported }
			},
			zero:       func(d *nvml.Device) { d.PowerW, d.PowerLimitW = 0, 0 },
			factErrors: []string{"power_limit_w", "power_w"},
		},
		{
			name: "clocks",
			breakIt: func(d *mock.Device) {
				d.GetClockInfoFunc = func(gonvml.ClockType) (uint32, gonvml.Return) { return 1, notSupported }
				d.GetMaxClockInfoFunc = func(gonvml.ClockType) (uint32, gonvml.Return) { return 1, notSupported }
			},
			zero: func(d *nvml.Device) {
				d.SMClockMHz, d.MemClockMHz, d.MaxMemClockMHz, d.BandwidthGBs = 0, 0, 0, 0
			},
			factErrors: []string{"max_mem_clock_mhz", "mem_clock_mhz", "sm_clock_mhz"},
		},
		{
			name: "bus width",
			breakIt: func(d *mock.Device) {
				d.GetMemoryBusWidthFunc = func() (uint32, gonvml.Return) { return 1, notSupported }
			},
			zero:       func(d *nvml.Device) { d.BusWidthBits, d.BandwidthGBs = 0, 0 },
			factErrors: []string{"bus_width_bits"},
		},
		{
			name: "processes, no permission",
			breakIt: func(d *mock.Device) {
				d.GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) {
					return []gonvml.ProcessInfo{{Pid: 1, UsedGpuMemory: mib}}, gonvml.ERROR_NO_PERMISSION
				}
				d.GetGraphicsRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) {
					return []gonvml.ProcessInfo{{Pid: 2, UsedGpuMemory: mib}}, gonvml.ERROR_NOT_SUPPORTED
				}
			},
			zero:       func(d *nvml.Device) {},
			factErrors: []string{"processes"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := new4090s(1)
			tt.breakIt(f.devs[0])
			snap, err := mustOpen(t, f).Snapshot(context.Background())
			if err != nil {
				t.Fatalf("nvml.Snapshot failed on an optional fact: %v", err)
			}
			got := snap.Devices[0]
			want := want4090()
			tt.zero(&want)
			want.FactErrors = make(map[string]string)
			for _, k := range tt.factErrors {
				want.FactErrors[k] = gonvml.ErrorString(gonvml.ERROR_NOT_SUPPORTED)
			}
			if tt.name == "processes, no permission" {
				// The first failure's reason is the one kept.
				want.FactErrors["processes"] = gonvml.ErrorString(gonvml.ERROR_NO_PERMISSION)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("device =\n%+v\nwant\n%+v", got, want)
			}
		})
	}
}

// TestNVMLOldDriverWithoutBusWidth: a libnvidia-ml without
// nvmlDeviceGetMemoryBusWidth must not be called for it (go-nvml would abort
// the process); the bus width is reported missing instead.
func TestNVMLOldDriverWithoutBusWidth(t *testing.T) {
	f := new4090s(1)
	ext := &mock.ExtendedInterface{LookupSymbolFunc: func(sym string) error {
		if sym == "nvmlDeviceGetMemoryBusWidth" {
			return errors.New("symbol not found")
		}
		return nil
	}}
	f.lib.ExtensionsFunc = func() gonvml.ExtendedInterface { return ext }
	snap, err := mustOpen(t, f).Snapshot(context.Background())
	if err != nil {
		t.Fatalf("nvml.Snapshot: %v", err)
	}
	want := want4090()
	want.BusWidthBits, want.BandwidthGBs = 0, 0
	want.FactErrors = map[string]string{"bus_width_bits": gonvml.ErrorString(gonvml.ERROR_FUNCTION_NOT_FOUND)}
	if got := snap.Devices[0]; !reflect.DeepEqual(got, want) {
		t.Fatalf("device =\n%+v\nwant\n%+v", got, want)
	}
	if got := len(f.devs[0].GetMemoryBusWidthCalls()); got != 0 {
		t.Fatalf("GetMemoryBusWidth called %d times on a driver without it", got)
	}
	if got := len(ext.LookupSymbolCalls()); got != 1 {
		t.Fatalf("LookupSymbol called %d times; want once, at Open", got)
	}
}

// TestNVMLRequiredFactFails: facts gpuhost cannot work without fail the
// snapshot, with an error that says which and wraps the NVML code.
func TestNVMLRequiredFactFails(t *testing.T) {
	lost := gonvml.ERROR_GPU_IS_LOST
	tests := []struct {
		name    string
		breakIt func(f *fakeGPU)
		wantMsg string
	}{
		{"driver version", func(f *fakeGPU) {
			f.lib.SystemGetDriverVersionFunc = func() (string, gonvml.Return) { return "", lost }
		}, "read driver version"},
		{"cuda version", func(f *fakeGPU) {
			f.lib.SystemGetCudaDriverVersionFunc = func() (int, gonvml.Return) { return 0, lost }
		}, "read CUDA driver version"},
		{"device count", func(f *fakeGPU) {
			f.lib.DeviceGetCountFunc = func() (int, gonvml.Return) { return 0, lost }
		}, "count devices"},
		{"handle", func(f *fakeGPU) {
			f.lib.DeviceGetHandleByIndexFunc = func(int) (gonvml.Device, gonvml.Return) { return nil, lost }
		}, "get handle of device 0"},
		{"name", func(f *fakeGPU) {
			f.devs[0].GetNameFunc = func() (string, gonvml.Return) { return "", lost }
		}, "read name of device 0"},
		{"uuid", func(f *fakeGPU) {
			f.devs[0].GetUUIDFunc = func() (string, gonvml.Return) { return "", lost }
		}, "read UUID of device 0"},
		{"memory", func(f *fakeGPU) {
			f.devs[0].GetMemoryInfoFunc = func() (gonvml.Memory, gonvml.Return) { return gonvml.Memory{}, lost }
		}, "read memory of device 0 (NVIDIA GeForce RTX 4090)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := new4090s(1)
			tt.breakIt(f)
			snap, err := mustOpen(t, f).Snapshot(context.Background())
			if err == nil {
				t.Fatalf("nvml.Snapshot = %+v, nil; want an error", snap)
			}
			if !errors.Is(err, lost) || !strings.Contains(err.Error(), tt.wantMsg) ||
				!strings.Contains(err.Error(), gonvml.ErrorString(lost)) {
				t.Fatalf("error %q; want it to wrap %v and say %q", err, lost, tt.wantMsg)
			}
		})
	}
	t.Run("nil handle", func(t *testing.T) {
		f := new4090s(1)
		f.lib.DeviceGetHandleByIndexFunc = func(int) (gonvml.Device, gonvml.Return) { return nil, gonvml.SUCCESS }
		if _, err := mustOpen(t, f).Snapshot(context.Background()); err == nil || !strings.Contains(err.Error(), "no handle") {
			t.Fatalf("nvml.Snapshot error = %v; want 'no handle'", err)
		}
	})
}

func TestNVMLProcesses(t *testing.T) {
	child := testkit.StartSleeper(t)
	pid := uint32(child.Process.Pid)
	const gonePID = 1 << 30 // above any pid_max, so never a live process
	f := new4090s(1)
	f.devs[0].GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) {
		return []gonvml.ProcessInfo{
			{Pid: gonePID, UsedGpuMemory: 512 * mib},
			{Pid: pid, UsedGpuMemory: 20000 * mib},
		}, gonvml.SUCCESS
	}
	f.devs[0].GetGraphicsRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) {
		return []gonvml.ProcessInfo{
			{Pid: pid, UsedGpuMemory: 20000 * mib},  // same process, graphics context too
			{Pid: 7, UsedGpuMemory: math.MaxUint64}, // NVML_VALUE_NOT_AVAILABLE
		}, gonvml.SUCCESS
	}
	snap, err := mustOpen(t, f).Snapshot(context.Background())
	if err != nil {
		t.Fatalf("nvml.Snapshot: %v", err)
	}
	want := []nvml.Process{
		{PID: 7, UsedMiB: 0, Name: nvml.ProcessName(7)},
		{PID: int(pid), UsedMiB: 20000, Name: "sleep"},
		{PID: gonePID, UsedMiB: 512, Name: ""},
	}
	if got := snap.Devices[0].Processes; !reflect.DeepEqual(got, want) {
		t.Fatalf("processes = %+v; want %+v", got, want)
	}
}

func TestMergeProcesses(t *testing.T) {
	p := func(pid uint32, m uint64) gonvml.ProcessInfo {
		return gonvml.ProcessInfo{Pid: pid, UsedGpuMemory: m * mib}
	}
	const gone = 1 << 30
	tests := []struct {
		name              string
		compute, graphics []gonvml.ProcessInfo
		want              []nvml.Process
	}{
		{name: "none", want: []nvml.Process{}},
		{name: "compute only", compute: []gonvml.ProcessInfo{p(gone+2, 5), p(gone+1, 3)},
			want: []nvml.Process{{PID: gone + 1, UsedMiB: 3}, {PID: gone + 2, UsedMiB: 5}}},
		{name: "graphics only", graphics: []gonvml.ProcessInfo{p(gone, 100)},
			want: []nvml.Process{{PID: gone, UsedMiB: 100}}},
		{name: "same pid in both keeps larger, not sum", compute: []gonvml.ProcessInfo{p(gone, 100)},
			graphics: []gonvml.ProcessInfo{p(gone, 120)}, want: []nvml.Process{{PID: gone, UsedMiB: 120}}},
		{name: "duplicate within one list", compute: []gonvml.ProcessInfo{p(gone, 7), p(gone, 3)},
			want: []nvml.Process{{PID: gone, UsedMiB: 7}}},
		{name: "not available is zero", compute: []gonvml.ProcessInfo{{Pid: gone, UsedGpuMemory: math.MaxUint64}},
			want: []nvml.Process{{PID: gone, UsedMiB: 0}}},
		{name: "sub-MiB rounds down", compute: []gonvml.ProcessInfo{{Pid: gone, UsedGpuMemory: mib - 1}},
			want: []nvml.Process{{PID: gone, UsedMiB: 0}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := mergeProcesses(tt.compute, tt.graphics); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("mergeProcesses = %+v; want %+v", got, tt.want)
			}
		})
	}
}

func TestNVMLSnapshotHonoursContext(t *testing.T) {
	f := new4090s(1)
	n := mustOpen(t, f)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := n.Snapshot(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("nvml.Snapshot with cancelled ctx = %v; want context.Canceled", err)
	}
	if got := len(f.lib.SystemGetDriverVersionCalls()) + len(f.lib.DeviceGetCountCalls()); got != 0 {
		t.Fatalf("cancelled nvml.Snapshot made %d NVML calls; want 0", got)
	}
}

func TestNVMLClose(t *testing.T) {
	f := new4090s(1)
	n, err := newWithLib(f.lib)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := n.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if got := len(f.lib.ShutdownCalls()); got != 1 {
		t.Fatalf("Shutdown called %d times; want 1", got)
	}
	if _, err := n.Snapshot(context.Background()); !errors.Is(err, nvml.ErrClosed) {
		t.Fatalf("nvml.Snapshot after Close = %v; want ErrClosed", err)
	}
	if got := len(f.lib.SystemGetDriverVersionCalls()); got != 0 {
		t.Fatalf("nvml.Snapshot after Close called NVML %d times", got)
	}

	t.Run("shutdown error", func(t *testing.T) {
		f := new4090s(1)
		f.lib.ShutdownFunc = func() gonvml.Return { return gonvml.ERROR_UNKNOWN }
		n, err := newWithLib(f.lib)
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Close(); !errors.Is(err, gonvml.ERROR_UNKNOWN) || !strings.Contains(err.Error(), "shutdown") {
			t.Fatalf("Close = %v; want a shutdown error wrapping ERROR_UNKNOWN", err)
		}
		if err := n.Close(); err != nil {
			t.Fatalf("second Close = %v; want nil (already closed)", err)
		}
	})
}

// TestNVMLConcurrentUse runs snapshots from many goroutines while the handle
// is closed; with -race this checks the locking, and it checks that no
// snapshot reaches NVML after Shutdown.
func TestNVMLConcurrentUse(t *testing.T) {
	f := new4090s(2)
	var mu sync.Mutex
	shutdown := false
	f.lib.ShutdownFunc = func() gonvml.Return {
		mu.Lock()
		defer mu.Unlock()
		shutdown = true
		return gonvml.SUCCESS
	}
	f.lib.SystemGetDriverVersionFunc = func() (string, gonvml.Return) {
		mu.Lock()
		defer mu.Unlock()
		if shutdown {
			t.Error("NVML used after Shutdown")
		}
		return "610.43.02", gonvml.SUCCESS
	}
	n, err := newWithLib(f.lib)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 25; i++ {
				snap, err := n.Snapshot(context.Background())
				switch {
				case errors.Is(err, nvml.ErrClosed):
					return
				case err != nil:
					t.Errorf("nvml.Snapshot: %v", err)
					return
				case len(snap.Devices) != 2:
					t.Errorf("got %d devices; want 2", len(snap.Devices))
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := n.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	wg.Wait()
	if got := len(f.lib.ShutdownCalls()); got != 1 {
		t.Fatalf("Shutdown called %d times; want 1", got)
	}
}

// TestOpenRealLibrary runs the real Open against whatever this machine has.
// Without an NVIDIA driver (CI) it must fail cleanly with nvml.ErrUnavailable
// instead of crashing; with one it must produce a plausible snapshot.
func TestOpenRealLibrary(t *testing.T) {
	n, err := Open()
	if err != nil {
		if !errors.Is(err, nvml.ErrUnavailable) {
			t.Fatalf("Open = %v; want an error wrapping ErrUnavailable", err)
		}
		t.Logf("no NVML here: %v", err)
		return
	}
	defer func() {
		if err := n.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	snap, err := n.Snapshot(context.Background())
	if err != nil {
		t.Fatalf("nvml.Snapshot on real NVML: %v", err)
	}
	if _, err := nvml.DriverMajor(snap.DriverVersion); err != nil {
		t.Errorf("real driver version: %v", err)
	}
	for _, d := range snap.Devices {
		if d.MemoryTotalMiB == 0 || d.Name == "" || !strings.HasPrefix(d.UUID, "GPU-") {
			t.Errorf("implausible device %+v", d)
		}
	}
	t.Logf("real NVML snapshot: %+v", snap)
}

// The real backend satisfies the same small interface consumers define over
// the simulator.
var _ interface {
	Snapshot(context.Context) (nvml.Snapshot, error)
	Close() error
} = (*NVML)(nil)

func TestCUDAVersionString(t *testing.T) {
	tests := map[int]string{13000: "13.0", 12040: "12.4", 12090: "12.9", 11080: "11.8", 13010: "13.1", 0: "", -5: ""}
	for in, want := range tests {
		if got := cudaVersionString(in); got != want {
			t.Errorf("cudaVersionString(%d) = %q; want %q", in, got, want)
		}
	}
}
