package nvml

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"syscall"
	"testing"
	"time"

	"gpuhost/internal/testkit"
)

// Both backends must fit the interface consumers define over them.
var (
	_ interface {
		Snapshot(context.Context) (Snapshot, error)
		Close() error
	} = (*Sim)(nil)
)

func simSnap(t *testing.T, s *Sim) Device {
	t.Helper()
	snap, err := s.Snapshot(context.Background())
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	d, ok := snap.Device0()
	if !ok || len(snap.Devices) != 1 {
		t.Fatalf("simulated GPU has %d devices; want 1", len(snap.Devices))
	}
	return d
}

func TestSimDefaults(t *testing.T) {
	s := NewSim(SimConfig{Dir: t.TempDir()})
	snap, err := s.Snapshot(context.Background())
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	if snap.Backend != "sim" || snap.DriverVersion != "610.43.02" || snap.CUDADriverVersion != "13.0" || snap.TakenAt.IsZero() {
		t.Errorf("header = %q %q %q %v; want sim 610.43.02 13.0 and a time", snap.Backend, snap.DriverVersion, snap.CUDADriverVersion, snap.TakenAt)
	}
	if major, err := DriverMajor(snap.DriverVersion); err != nil || major != 610 {
		t.Errorf("DriverMajor(sim driver) = %d, %v; want 610", major, err)
	}
	want := Device{
		Index: 0, Name: "NVIDIA GeForce RTX 4090", UUID: SimUUID, PCIBusID: "00000000:01:00.0",
		MemoryTotalMiB: 24564, MemoryUsedMiB: 18, MemoryFreeMiB: 24546,
		TemperatureC: simIdleTempC, PowerW: simIdlePowerW, PowerLimitW: 450,
		SMClockMHz: simIdleSMClock, MemClockMHz: simIdleMemClock, MaxMemClockMHz: 10501, BusWidthBits: 384,
		BandwidthGBs: 1008.096,
		Processes:    []Process{},
	}
	if got := snap.Devices[0]; !reflect.DeepEqual(got, want) {
		t.Fatalf("idle device =\n%+v\nwant\n%+v", got, want)
	}
}

func TestSimConfigOverrides(t *testing.T) {
	tests := []struct {
		name                      string
		cfg                       SimConfig
		wantTotal, wantUsed       uint64
		wantName, wantDrv, wantCU string
	}{
		{name: "old driver", cfg: SimConfig{DriverVersion: "535.183.01", CUDAVersion: "12.2"},
			wantTotal: 24564, wantUsed: 18, wantName: DefaultSimName, wantDrv: "535.183.01", wantCU: "12.2"},
		{name: "3090", cfg: SimConfig{Name: "NVIDIA GeForce RTX 3090", TotalMiB: 24576, BaselineMiB: 300},
			wantTotal: 24576, wantUsed: 300, wantName: "NVIDIA GeForce RTX 3090", wantDrv: DefaultSimDriverVersion, wantCU: DefaultSimCUDAVersion},
		{name: "baseline above total is capped", cfg: SimConfig{TotalMiB: 100, BaselineMiB: 500},
			wantTotal: 100, wantUsed: 100, wantName: DefaultSimName, wantDrv: DefaultSimDriverVersion, wantCU: DefaultSimCUDAVersion},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			snap, err := NewSim(tt.cfg).Snapshot(context.Background())
			if err != nil {
				t.Fatalf("Snapshot: %v", err)
			}
			d := snap.Devices[0]
			if d.MemoryTotalMiB != tt.wantTotal || d.MemoryUsedMiB != tt.wantUsed || d.MemoryFreeMiB != tt.wantTotal-tt.wantUsed ||
				d.Name != tt.wantName || snap.DriverVersion != tt.wantDrv || snap.CUDADriverVersion != tt.wantCU {
				t.Fatalf("got %s %s %s total %d used %d free %d; want %s %s %s total %d used %d",
					d.Name, snap.DriverVersion, snap.CUDADriverVersion, d.MemoryTotalMiB, d.MemoryUsedMiB, d.MemoryFreeMiB,
					tt.wantName, tt.wantDrv, tt.wantCU, tt.wantTotal, tt.wantUsed)
			}
		})
	}
}

// TestSimFollowsRealProcess claims memory for a real child process and kills
// it with SIGKILL, as a crashing inference server would die. Memory must
// come back while the child is still a zombie (the driver frees memory at
// exit, not at reaping) and after it is reaped, and the stale claim file
// must be gone.
func TestSimFollowsRealProcess(t *testing.T) {
	for _, reapFirst := range []bool{false, true} {
		name := "zombie"
		if reapFirst {
			name = "reaped"
		}
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			s := NewSim(SimConfig{Dir: dir})
			child := startSleeper(t)
			pid := child.Process.Pid
			if err := WriteClaim(dir, Claim{PID: pid, MiB: 20000, Name: "vllm-sim"}); err != nil {
				t.Fatal(err)
			}

			d := simSnap(t, s)
			if d.MemoryUsedMiB != 18+20000 || d.MemoryFreeMiB != 24564-18-20000 {
				t.Fatalf("with claim: used %d free %d MiB; want 20018 and 4546", d.MemoryUsedMiB, d.MemoryFreeMiB)
			}
			if want := []Process{{PID: pid, UsedMiB: 20000, Name: "vllm-sim"}}; !reflect.DeepEqual(d.Processes, want) {
				t.Fatalf("processes = %+v; want %+v", d.Processes, want)
			}
			if d.UtilizationGPU == 0 || d.PowerW <= simIdlePowerW || d.TemperatureC <= simIdleTempC || d.SMClockMHz != simBusySMClock {
				t.Fatalf("busy GPU looks idle: %+v", d)
			}

			if err := child.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			if reapFirst {
				_ = child.Wait() // "signal: killed"
			} else {
				testkit.Eventually(t, 10*time.Second, func() bool { return isZombie(pid) }, "child to become a zombie")
			}
			d = simSnap(t, s)
			if d.MemoryUsedMiB != 18 || len(d.Processes) != 0 || d.UtilizationGPU != 0 {
				t.Fatalf("after SIGKILL: used %d MiB, processes %+v, util %d; want baseline 18, none, 0",
					d.MemoryUsedMiB, d.Processes, d.UtilizationGPU)
			}
			if _, err := os.Stat(claimPath(dir, pid)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("stale claim file still there: %v", err)
			}
			if !reapFirst {
				if !isZombie(pid) {
					t.Fatal("the test meant to check a zombie, but the child is no longer one")
				}
				_ = child.Wait()
			}
		})
	}
}

func TestSimProcessNameFallsBackToComm(t *testing.T) {
	dir := t.TempDir()
	child := startSleeper(t)
	if err := WriteClaim(dir, Claim{PID: child.Process.Pid, MiB: 1}); err != nil {
		t.Fatal(err)
	}
	d := simSnap(t, NewSim(SimConfig{Dir: dir}))
	if len(d.Processes) != 1 || d.Processes[0].Name != "sleep" {
		t.Fatalf("processes = %+v; want one named sleep", d.Processes)
	}
}

// TestSimLoadIsMonotonic: more claimed memory never makes the GPU look less
// busy, and the same claims always give the same figures.
func TestSimLoadIsMonotonic(t *testing.T) {
	dir := t.TempDir()
	s := NewSim(SimConfig{Dir: dir})
	self := os.Getpid()
	var prev Device
	for i, m := range []uint64{1, 1000, 8000, 16000, 24546, 30000, math.MaxUint64} {
		if err := WriteClaim(dir, Claim{PID: self, MiB: m, Name: "test"}); err != nil {
			t.Fatal(err)
		}
		d := simSnap(t, s)
		if again := simSnap(t, s); !reflect.DeepEqual(d, again) {
			t.Fatalf("claim %d MiB: two snapshots differ:\n%+v\n%+v", m, d, again)
		}
		if d.MemoryUsedMiB > d.MemoryTotalMiB || d.MemoryUsedMiB+d.MemoryFreeMiB != d.MemoryTotalMiB {
			t.Fatalf("claim %d MiB: used %d + free %d != total %d", m, d.MemoryUsedMiB, d.MemoryFreeMiB, d.MemoryTotalMiB)
		}
		if d.UtilizationGPU > 100 || d.UtilizationMemory > 100 || d.PowerW > d.PowerLimitW {
			t.Fatalf("claim %d MiB: implausible %+v", m, d)
		}
		if i > 0 && (d.MemoryUsedMiB < prev.MemoryUsedMiB || d.UtilizationGPU < prev.UtilizationGPU ||
			d.UtilizationMemory < prev.UtilizationMemory || d.PowerW < prev.PowerW || d.TemperatureC < prev.TemperatureC) {
			t.Fatalf("claim %d MiB looks less busy than the smaller claim:\n%+v\nbefore:\n%+v", m, d, prev)
		}
		prev = d
	}
	if prev.MemoryUsedMiB != 24564 || prev.UtilizationGPU != 95 || prev.TemperatureC != simIdleTempC+simLoadTempC {
		t.Fatalf("full GPU = used %d util %d temp %d; want 24564, 95, %d", prev.MemoryUsedMiB, prev.UtilizationGPU, prev.TemperatureC, simIdleTempC+simLoadTempC)
	}
}

func TestSimSumsClaims(t *testing.T) {
	dir := t.TempDir()
	a, b := startSleeper(t), startSleeper(t)
	for _, c := range []Claim{{PID: a.Process.Pid, MiB: 1000, Name: "a"}, {PID: b.Process.Pid, MiB: 2500, Name: "b"}} {
		if err := WriteClaim(dir, c); err != nil {
			t.Fatal(err)
		}
	}
	d := simSnap(t, NewSim(SimConfig{Dir: dir, BaselineMiB: 100}))
	if d.MemoryUsedMiB != 3600 || len(d.Processes) != 2 {
		t.Fatalf("used %d MiB with processes %+v; want 3600 and two", d.MemoryUsedMiB, d.Processes)
	}
}

func TestSimErrors(t *testing.T) {
	t.Run("cancelled context", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := NewSim(SimConfig{}).Snapshot(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("Snapshot = %v; want context.Canceled", err)
		}
	})
	t.Run("closed", func(t *testing.T) {
		s := NewSim(SimConfig{})
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Snapshot(context.Background()); !errors.Is(err, ErrClosed) {
			t.Fatalf("Snapshot after Close = %v; want ErrClosed", err)
		}
	})
	t.Run("claims dir is a file", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "claims")
		if err := os.WriteFile(file, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := NewSim(SimConfig{Dir: file}).Snapshot(context.Background())
		if err == nil || !errors.Is(err, syscall.ENOTDIR) {
			t.Fatalf("Snapshot = %v; want an ENOTDIR error naming the dir", err)
		}
	})
	t.Run("missing dir is idle", func(t *testing.T) {
		d := simSnap(t, NewSim(SimConfig{Dir: filepath.Join(t.TempDir(), "not-yet")}))
		if d.MemoryUsedMiB != DefaultSimBaselineMiB {
			t.Fatalf("used %d; want baseline", d.MemoryUsedMiB)
		}
	})
	t.Run("nil sim", func(t *testing.T) {
		var s *Sim
		if _, err := s.Snapshot(context.Background()); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Snapshot on nil = %v", err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

func TestSatAdd(t *testing.T) {
	tests := []struct{ a, b, want uint64 }{
		{1, 2, 3}, {math.MaxUint64, 1, math.MaxUint64}, {math.MaxUint64 - 1, 1, math.MaxUint64}, {0, 0, 0},
	}
	for _, tt := range tests {
		if got := satAdd(tt.a, tt.b); got != tt.want {
			t.Errorf("satAdd(%d, %d) = %d; want %d", tt.a, tt.b, got, tt.want)
		}
	}
}

// pidString is a helper for claim file names in tests.
func pidString(pid int) string { return strconv.Itoa(pid) }

// Host memory is the configured RAM minus the live claims' HostMiB; it does
// not touch the GPU's figures, and a dead process's host claim goes with it.
func TestSimHostMem(t *testing.T) {
	tests := []struct {
		name      string
		cfgMiB    uint64
		claims    []Claim // PID 0 is this process, -1 a child that is killed
		wantTotal uint64
		wantAvail uint64
		wantUsed  uint64 // GPU
	}{
		{name: "no claims", wantTotal: DefaultSimHostMemMiB, wantAvail: DefaultSimHostMemMiB, wantUsed: DefaultSimBaselineMiB},
		{name: "VRAM only", claims: []Claim{{MiB: 20000}}, wantTotal: 65536, wantAvail: 65536, wantUsed: 20018},
		{name: "asleep with weights offloaded", claims: []Claim{{MiB: 512, HostMiB: 14000}},
			wantTotal: 65536, wantAvail: 65536 - 14000, wantUsed: 530},
		{name: "configured size", cfgMiB: 16384, claims: []Claim{{MiB: 0, HostMiB: 4000}},
			wantTotal: 16384, wantAvail: 12384, wantUsed: 18},
		{name: "overcommitted saturates at zero", cfgMiB: 1000, claims: []Claim{{HostMiB: 4000}},
			wantTotal: 1000, wantAvail: 0, wantUsed: 18},
		{name: "dead process releases its host memory", claims: []Claim{{PID: -1, MiB: 100, HostMiB: 9000}},
			wantTotal: 65536, wantAvail: 65536, wantUsed: 18},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, c := range tt.claims {
				switch c.PID {
				case 0:
					c.PID = os.Getpid()
				case -1:
					child := startSleeper(t)
					c.PID = child.Process.Pid
					if err := WriteClaim(dir, c); err != nil {
						t.Fatal(err)
					}
					_ = child.Process.Kill()
					_ = child.Wait()
					continue
				}
				if err := WriteClaim(dir, c); err != nil {
					t.Fatal(err)
				}
			}
			s := NewSim(SimConfig{Dir: dir, HostMemMiB: tt.cfgMiB})
			if got := s.HostMemTotalMiB(); got != tt.wantTotal {
				t.Errorf("HostMemTotalMiB = %d; want %d", got, tt.wantTotal)
			}
			got, err := s.HostMemAvailableMiB(context.Background())
			if err != nil || got != tt.wantAvail {
				t.Errorf("HostMemAvailableMiB = %d, %v; want %d", got, err, tt.wantAvail)
			}
			if d := simSnap(t, s); d.MemoryUsedMiB != tt.wantUsed {
				t.Errorf("GPU used %d MiB; want %d (host memory must not count)", d.MemoryUsedMiB, tt.wantUsed)
			}
		})
	}
	t.Run("errors", func(t *testing.T) {
		var nilSim *Sim
		if _, err := nilSim.HostMemAvailableMiB(context.Background()); !errors.Is(err, ErrUnavailable) {
			t.Errorf("nil sim: %v", err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := NewSim(SimConfig{}).HostMemAvailableMiB(ctx); !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled: %v", err)
		}
		s := NewSim(SimConfig{})
		_ = s.Close()
		if _, err := s.HostMemAvailableMiB(context.Background()); !errors.Is(err, ErrClosed) {
			t.Errorf("closed: %v", err)
		}
		if got, err := NewSim(SimConfig{}).HostMemAvailableMiB(context.Background()); err != nil || got != DefaultSimHostMemMiB {
			t.Errorf("no dir = %d, %v; want all free", got, err)
		}
	})
}
