package systemd

import (
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"
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
