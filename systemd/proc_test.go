package systemd

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"gpuhost/api"
)

func TestParseCmdline(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"/bin/sleep\x001000\x00", []string{"/bin/sleep", "1000"}},
		{"vllm\x00serve\x00--port\x008000\x00", []string{"vllm", "serve", "--port", "8000"}},
		{"a\x00\x00b\x00", []string{"a", "", "b"}},
		{"python3 -m vllm --title-rewritten\x00\x00\x00\x00", []string{"python3 -m vllm --title-rewritten"}},
		{"no-trailing-nul", []string{"no-trailing-nul"}},
		{"", nil},
		{"\x00\x00", nil},
	}
	for _, tt := range tests {
		if got := parseCmdline([]byte(tt.in)); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("parseCmdline(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestCmdlineOf(t *testing.T) {
	// sh stays (the trailing ":" keeps it from exec'ing sleep) with its
	// arguments, one of which has a space.
	cmd := exec.Command("/bin/sh", "-c", "sleep 30; :", "arg with space", "")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	// Right after execve the kernel briefly shows an empty command line.
	var got []string
	for deadline := time.Now().Add(5 * time.Second); ; {
		var err error
		if got, err = CmdlineOf(cmd.Process.Pid); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The trailing empty argument is dropped with the trailing NULs.
	if want := []string{"/bin/sh", "-c", "sleep 30; :", "arg with space"}; !reflect.DeepEqual(got, want) {
		t.Errorf("CmdlineOf = %q, want %q", got, want)
	}
	self, err := CmdlineOf(os.Getpid())
	if err != nil || len(self) == 0 || self[0] != os.Args[0] {
		t.Errorf("CmdlineOf(self) = %q, %v; want argv[0] %q", self, err, os.Args[0])
	}

	for _, pid := range []int{0, -1} {
		if _, err := CmdlineOf(pid); err == nil || !strings.Contains(err.Error(), "not a process ID") {
			t.Errorf("CmdlineOf(%d) = %v", pid, err)
		}
	}
	if _, err := CmdlineOf(1 << 30); err == nil || !strings.Contains(err.Error(), "PID 1073741824") {
		t.Errorf("CmdlineOf(no such process) = %v", err)
	}
	// kthreadd (PID 2 on the host) has an empty command line.
	if data, err := os.ReadFile("/proc/2/comm"); err == nil && strings.TrimSpace(string(data)) == "kthreadd" {
		if _, err := CmdlineOf(2); err == nil || !strings.Contains(err.Error(), "empty") {
			t.Errorf("CmdlineOf(kthreadd) = %v, want an empty-command-line error", err)
		}
	}
}

func FuzzParseCmdline(f *testing.F) {
	f.Add([]byte("a\x00b\x00"))
	f.Add([]byte("\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		argv := parseCmdline(data)
		if joined := strings.Join(argv, "\x00"); joined != strings.TrimRight(string(data), "\x00") {
			t.Errorf("parseCmdline(%q) = %q does not round-trip", data, argv)
		}
	})
}

func TestProcessEnv(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	cmd.Env = []string{"GPUHOST_PROFILE=coder", "EMPTY=", "OTHER=x=y"}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	pid := cmd.Process.Pid
	waitEnv(t, pid, "GPUHOST_PROFILE")
	for _, tt := range []struct {
		key, want string
		ok        bool
	}{
		{"GPUHOST_PROFILE", "coder", true},
		{"EMPTY", "", true},
		{"OTHER", "x=y", true},
		{"GPUHOST", "", false}, // a prefix of a name is not the name
		{"PATH", "", false},
	} {
		if got, ok := ProcessEnv(pid, tt.key); got != tt.want || ok != tt.ok {
			t.Errorf("ProcessEnv(%s) = %q, %v; want %q, %v", tt.key, got, ok, tt.want, tt.ok)
		}
	}
	for _, pid := range []int{0, -1, 1 << 30} {
		if got, ok := ProcessEnv(pid, "PATH"); ok || got != "" {
			t.Errorf("ProcessEnv(%d) = %q, %v", pid, got, ok)
		}
	}
}

// waitEnv waits until a process just started shows its environment (right
// after execve the kernel may briefly show it empty, as its command line).
func waitEnv(t *testing.T, pid int, key string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, ok := ProcessEnv(pid, key); ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("PID %d shows no %s in its environment", pid, key)
		}
	}
}

func TestEnvFileValueAndUnitEnv(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vllm.env")
	if err := os.WriteFile(path, []byte("# written by gpuhost\nGPUHOST_ARGS=--port 8000\n  GPUHOST_PROFILE=\"coder\"  \nGPUHOST_PROFILE=second\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, ok := EnvFileValue(path, "GPUHOST_PROFILE"); got != "coder" || !ok {
		t.Errorf("EnvFileValue = %q, %v; want the first line's value, unquoted", got, ok)
	}
	if got, ok := EnvFileValue(path, "GPUHOST_MISSING"); got != "" || ok {
		t.Errorf("EnvFileValue(missing key) = %q, %v", got, ok)
	}
	if got, ok := EnvFileValue(path+".none", "GPUHOST_PROFILE"); got != "" || ok {
		t.Errorf("EnvFileValue(missing file) = %q, %v", got, ok)
	}

	// The process's environment wins over the file; without the variable
	// there (or without a process) the file answers.
	cmd := exec.Command("sleep", "30")
	cmd.Env = []string{"GPUHOST_PROFILE=running"}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	waitEnv(t, cmd.Process.Pid, "GPUHOST_PROFILE")
	if got := UnitEnv(api.UnitStatus{MainPID: cmd.Process.Pid}, path, "GPUHOST_PROFILE"); got != "running" {
		t.Errorf("UnitEnv(running process) = %q, want the process's value", got)
	}
	if got := UnitEnv(api.UnitStatus{MainPID: cmd.Process.Pid}, path, "GPUHOST_ARGS"); got != "--port 8000" {
		t.Errorf("UnitEnv(variable only in the file) = %q", got)
	}
	if got := UnitEnv(api.UnitStatus{}, path, "GPUHOST_PROFILE"); got != "coder" {
		t.Errorf("UnitEnv(no process) = %q, want the file's value", got)
	}
	if got := UnitEnv(api.UnitStatus{}, path+".none", "GPUHOST_PROFILE"); got != "" {
		t.Errorf("UnitEnv(nothing) = %q", got)
	}
}

func TestInUnits(t *testing.T) {
	self := os.Getpid()
	if InUnits(self) {
		t.Error("InUnits with no units is true")
	}
	if !InUnits(self, api.UnitStatus{MainPID: 1 << 30}, api.UnitStatus{MainPID: self}) {
		t.Error("the main process is not in its unit")
	}
	cg := CgroupOf(self)
	if cg == "" {
		t.Skip("no unified cgroup for this process")
	}
	if !InUnits(self, api.UnitStatus{MainPID: 1 << 30, ControlGroup: cg}) {
		t.Errorf("a process in cgroup %s is not in the unit of that cgroup", cg)
	}
	if InUnits(self, api.UnitStatus{MainPID: 1 << 30, ControlGroup: cg + "x"}) {
		t.Errorf("cgroup %sx holds a process of %s", cg, cg)
	}
	if parent := filepath.Dir(cg); parent != "/" && parent != "." {
		if !InUnits(self, api.UnitStatus{ControlGroup: parent}) {
			t.Errorf("a process in %s is not in the unit of the parent cgroup %s", cg, parent)
		}
	}
}

func TestParseMemAvailable(t *testing.T) {
	tests := []struct {
		in      string
		want    uint64
		wantErr string
	}{
		{"MemTotal:       65536000 kB\nMemFree:  100 kB\nMemAvailable:   62914560 kB\n", 61440, ""},
		{"MemAvailable: 1023 kB\n", 0, ""},
		{"MemTotal: 1 kB\n", 0, "no MemAvailable"},
		{"MemAvailable: many kB\n", 0, "MemAvailable \"many\""},
		{"MemAvailable: 12 MB\n", 0, "unexpected MemAvailable line"},
	}
	for _, tt := range tests {
		got, err := parseMemAvailable(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("parseMemAvailable(%q) err = %v, want %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("parseMemAvailable(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		}
	}
	if mib, err := MemAvailableMiB(); err != nil || mib == 0 {
		t.Errorf("MemAvailableMiB on this machine = %d, %v", mib, err)
	}
}

func FuzzParseMemAvailable(f *testing.F) {
	f.Add("MemAvailable:   62914560 kB\n")
	f.Add("MemAvailable: x\n")
	f.Fuzz(func(t *testing.T, s string) { _, _ = parseMemAvailable(s) })
}
