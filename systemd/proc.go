package systemd

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"gpuhost/api"
)

// CmdlineOf returns the argv of process pid from /proc/<pid>/cmdline, so a
// live backend's flags can be checked against its profile. Trailing NULs are
// dropped (programs that rewrite their title pad with them, which also hides
// trailing empty arguments). A kernel thread or a zombie has no command line;
// that is an error, and so is the moment right after execve, in which the
// kernel shows an empty command line: callers that check a process they just
// started should retry briefly.
func CmdlineOf(pid int) ([]string, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("read command line of PID %d: not a process ID", pid)
	}
	path := "/proc/" + strconv.Itoa(pid) + "/cmdline"
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read command line of PID %d: %w", pid, err)
	}
	argv := parseCmdline(data)
	if len(argv) == 0 {
		return nil, fmt.Errorf("read command line of PID %d: %s is empty (kernel thread or exited process)", pid, path)
	}
	return argv, nil
}

// parseCmdline splits a NUL-separated command line.
func parseCmdline(data []byte) []string {
	data = bytes.TrimRight(data, "\x00")
	if len(data) == 0 {
		return nil
	}
	parts := bytes.Split(data, []byte{0})
	argv := make([]string, len(parts))
	for i, p := range parts {
		argv[i] = string(p)
	}
	return argv
}

// ProcessEnv returns the value of variable key in the environment process
// pid was started with (/proc/<pid>/environ), and whether it is set there.
// That environment is fixed at execve, so it tells what a running backend
// really got, whatever happened to the files it was configured from since.
// Reading another user's process needs CAP_SYS_PTRACE (or root); without it
// the variable reads as unset.
func ProcessEnv(pid int, key string) (string, bool) {
	if pid <= 0 {
		return "", false
	}
	env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return "", false
	}
	prefix := []byte(key + "=")
	for _, kv := range bytes.Split(env, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, prefix); ok {
			return string(v), true
		}
	}
	return "", false
}

// EnvFileValue returns the value of key in an EnvironmentFile= of a unit
// (KEY=value lines; surrounding quotes are dropped), and whether the file
// sets it. It is what the unit's next start will get.
func EnvFileValue(path, key string) (string, bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), key+"="); ok {
			return strings.Trim(v, `"'`), true
		}
	}
	return "", false
}

// UnitEnv tells the value of key a running unit was started with: the one
// in its main process's environment (the truth, see ProcessEnv), else the
// one in envFile (what it will run with after a restart, and all there is
// for a unit whose process cannot be read). It is "" when neither says.
// The Supervisor reads a backend's GPUHOST_PROFILE this way, so a daemon
// restart finds out which profile the running backend serves.
func UnitEnv(st api.UnitStatus, envFile, key string) string {
	if v, ok := ProcessEnv(st.MainPID, key); ok {
		return v
	}
	v, _ := EnvFileValue(envFile, key)
	return v
}

// InUnits reports whether pid is the main process of one of the units or
// runs in one's cgroup (or below it). The Supervisor asks it of every GPU
// process while it waits for a stopped backend's VRAM, and the doctor to
// find GPU memory held outside the backends: a process counts as the
// unit's without walking its ancestry, which keeps a poll cheap. (A
// runner without cgroups reports only the main process.)
func InUnits(pid int, sts ...api.UnitStatus) bool {
	if len(sts) == 0 {
		return false
	}
	cg := CgroupOf(pid)
	for _, st := range sts {
		if pid == st.MainPID {
			return true
		}
		if st.ControlGroup != "" && cg != "" && (cg == st.ControlGroup || strings.HasPrefix(cg, st.ControlGroup+"/")) {
			return true
		}
	}
	return false
}

// MemAvailableMiB is the kernel's estimate of memory available for new
// work without swapping (MemAvailable in /proc/meminfo), which decides
// whether a sleeping vLLM may offload its weights to host RAM.
func MemAvailableMiB() (uint64, error) {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("read host memory: %w", err)
	}
	return parseMemAvailable(string(data))
}

// parseMemAvailable reads "MemAvailable:  123456 kB" from meminfo text.
func parseMemAvailable(meminfo string) (uint64, error) {
	for line := range strings.SplitSeq(meminfo, "\n") {
		rest, ok := strings.CutPrefix(line, "MemAvailable:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("read host memory: unexpected MemAvailable line %q", line)
		}
		kb, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("read host memory: MemAvailable %q: %w", f[0], err)
		}
		return kb / 1024, nil
	}
	return 0, errors.New("read host memory: no MemAvailable in /proc/meminfo")
}
