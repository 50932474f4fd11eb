package nvml

import (
	"encoding/json"
	"os"
	"os/exec"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"gpuhost/internal/testkit"
)

func TestDriverMajor(t *testing.T) {
	tests := []struct {
		in      string
		want    int
		wantErr string // substring; "" means success
	}{
		{in: "610.43.02", want: 610},
		{in: "535.183.01", want: 535},
		{in: "580.65", want: 580},
		{in: "580", want: 580},
		{in: " 610.43.02\n", want: 610},
		{in: "0.1", want: 0},
		{in: "", wantErr: "empty"},
		{in: "   ", wantErr: "empty"},
		{in: ".43.02", wantErr: "no major number"},
		{in: "abc", wantErr: `major part "abc" is not a number`},
		{in: "610a.43", wantErr: "is not a number"},
		{in: "-610.1", wantErr: "is not a number"},
		{in: "+610.1", wantErr: "is not a number"},
		{in: "6 10.1", wantErr: "is not a number"},
		{in: "٦١٠.1", wantErr: "is not a number"}, // Arabic-Indic digits
		{in: "99999999999999999999999.1", wantErr: "out of range"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := DriverMajor(tt.in)
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("DriverMajor(%q) = %d, nil; want error containing %q", tt.in, got, tt.wantErr)
				}
				if !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), strconv.Quote(tt.in)) {
					t.Fatalf("DriverMajor(%q) error %q; want it to contain %q and the input", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("DriverMajor(%q) = %d, %v; want %d, nil", tt.in, got, err, tt.want)
			}
		})
	}
}

func FuzzDriverMajor(f *testing.F) {
	for _, s := range []string{"610.43.02", "535.183.01", "", ".", "1.", "abc", "-1", "99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := DriverMajor(s)
		if err != nil {
			if n != 0 {
				t.Fatalf("DriverMajor(%q) = %d with error %v; want 0", s, n, err)
			}
			return
		}
		if n < 0 {
			t.Fatalf("DriverMajor(%q) = %d; negative", s, n)
		}
		major, _, _ := strings.Cut(strings.TrimSpace(s), ".")
		if back, _ := strconv.Atoi(major); back != n {
			t.Fatalf("DriverMajor(%q) = %d; major part is %q", s, n, major)
		}
	})
}

func TestBandwidth(t *testing.T) {
	tests := []struct {
		name          string
		clock, bus    int
		want          float64
		wantApproxGBs int
	}{
		{name: "RTX 4090", clock: 10501, bus: 384, want: 1008.096, wantApproxGBs: 1008},
		{name: "RTX 3090", clock: 9751, bus: 384, want: 936.096, wantApproxGBs: 936},
		{name: "H100 SXM HBM3", clock: 2619, bus: 5120, want: 3352.32, wantApproxGBs: 3352},
		{name: "unknown clock", clock: 0, bus: 384},
		{name: "unknown bus", clock: 10501, bus: 0},
		{name: "negative", clock: -1, bus: 384},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Bandwidth(tt.clock, tt.bus)
			if diff := got - tt.want; diff > 1e-9 || diff < -1e-9 {
				t.Fatalf("Bandwidth(%d, %d) = %v; want %v", tt.clock, tt.bus, got, tt.want)
			}
			if int(got) != tt.wantApproxGBs {
				t.Fatalf("Bandwidth(%d, %d) = %v; want about %d GB/s", tt.clock, tt.bus, got, tt.wantApproxGBs)
			}
		})
	}
}

func TestDevice0(t *testing.T) {
	if d, ok := (Snapshot{}).Device0(); ok || !reflect.DeepEqual(d, Device{}) {
		t.Fatalf("empty snapshot Device0() = %+v, %v; want zero, false", d, ok)
	}
	s := Snapshot{Devices: []Device{{Index: 0, Name: "first"}, {Index: 1, Name: "second"}}}
	if d, ok := s.Device0(); !ok || d.Name != "first" {
		t.Fatalf("Device0() = %+v, %v; want the first device", d, ok)
	}
}

// TestJSONFieldNames pins the wire names other packages and the web panel
// read, so a renamed Go field cannot silently change them.
func TestJSONFieldNames(t *testing.T) {
	s := Snapshot{
		Backend: "sim", DriverVersion: "610.43.02", CUDADriverVersion: "13.0",
		TakenAt: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC),
		Devices: []Device{{
			Processes:  []Process{{PID: 1, UsedMiB: 2, Name: "x"}},
			FactErrors: map[string]string{"power_w": "ERROR_NOT_SUPPORTED"},
		}},
	}
	data, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Top     map[string]json.RawMessage
		Devices []map[string]json.RawMessage `json:"devices"`
	}
	if err := json.Unmarshal(data, &raw.Top); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	var procs []map[string]json.RawMessage
	if err := json.Unmarshal(raw.Devices[0]["processes"], &procs); err != nil {
		t.Fatal(err)
	}
	checkKeys(t, "snapshot", raw.Top, "backend", "driver_version", "cuda_driver_version", "devices", "taken_at")
	checkKeys(t, "device", raw.Devices[0], "index", "name", "uuid", "memory_total_mib", "memory_used_mib",
		"memory_free_mib", "utilization_gpu", "utilization_memory", "temperature_c", "power_w", "power_limit_w",
		"sm_clock_mhz", "mem_clock_mhz", "max_mem_clock_mhz", "bus_width_bits", "bandwidth_gbs", "processes",
		"fact_errors")
	checkKeys(t, "process", procs[0], "pid", "used_mib", "name")

	var back Snapshot
	if err := json.Unmarshal(data, &back); err != nil || !reflect.DeepEqual(back, s) {
		t.Fatalf("JSON round trip = %+v, %v; want %+v", back, err, s)
	}
}

func checkKeys(t *testing.T, what string, m map[string]json.RawMessage, want ...string) {
	t.Helper()
	var got []string
	for k := range m {
		got = append(got, k)
	}
	sort.Strings(got)
	sort.Strings(want)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s JSON keys = %v; want %v", what, got, want)
	}
}

func TestProcessName(t *testing.T) {
	child := startSleeper(t)
	tests := []struct {
		name string
		pid  int
		want string
	}{
		{name: "live child", pid: child.Process.Pid, want: "sleep"},
		{name: "zero", pid: 0, want: ""},
		{name: "negative", pid: -1, want: ""},
		{name: "beyond pid_max", pid: 1 << 30, want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ProcessName(tt.pid); got != tt.want {
				t.Fatalf("ProcessName(%d) = %q; want %q", tt.pid, got, tt.want)
			}
		})
	}
}

// startSleeper starts a real `sleep` child that the test can claim memory
// for; see testkit.StartSleeper.
func startSleeper(t *testing.T) *exec.Cmd { return testkit.StartSleeper(t) }

// isZombie reports whether pid has exited but is not yet reaped.
func isZombie(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s, ok := procState(stat)
	return ok && s == 'Z'
}
