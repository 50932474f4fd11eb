package systemd

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
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
