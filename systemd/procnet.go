package systemd

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// TCPListen is the kernel's TCP_LISTEN state as /proc/net/tcp prints it.
const TCPListen = 0x0A

// Socket is one line of /proc/net/tcp or /proc/net/tcp6.
type Socket struct {
	Local netip.AddrPort
	State uint8
	UID   int
	Inode uint64
}

// ParseProcNetTCP parses the text of /proc/net/tcp or /proc/net/tcp6 (the
// header line first, then one socket a line). A line that does not read as
// a socket is an error naming its number; the text comes from the kernel,
// so that means a format we do not know rather than noise to skip.
func ParseProcNetTCP(data []byte) ([]Socket, error) {
	var out []Socket
	for i, line := range bytes.Split(data, []byte{'\n'}) {
		f := strings.Fields(string(line))
		if len(f) == 0 || (i == 0 && f[0] == "sl") {
			continue
		}
		if len(f) < 10 {
			return nil, fmt.Errorf("/proc/net/tcp line %d: %d fields, want at least 10", i+1, len(f))
		}
		local, err := parseHexAddrPort(f[1])
		if err != nil {
			return nil, fmt.Errorf("/proc/net/tcp line %d: local address %q: %w", i+1, f[1], err)
		}
		st, err := strconv.ParseUint(f[3], 16, 8)
		if err != nil {
			return nil, fmt.Errorf("/proc/net/tcp line %d: state %q: %w", i+1, f[3], err)
		}
		uid, err := strconv.ParseUint(f[7], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("/proc/net/tcp line %d: uid %q: %w", i+1, f[7], err)
		}
		inode, err := strconv.ParseUint(f[9], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("/proc/net/tcp line %d: inode %q: %w", i+1, f[9], err)
		}
		out = append(out, Socket{Local: local, State: uint8(st), UID: int(uid), Inode: inode})
	}
	return out, nil
}

// parseHexAddrPort decodes "0100007F:1F90" (IPv4) or the 32-digit IPv6
// form. The kernel prints each 32-bit word of the address as a host-order
// integer, so the bytes of each word come out in native byte order.
func parseHexAddrPort(s string) (netip.AddrPort, error) {
	a, p, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, errors.New("no port")
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("port: %w", err)
	}
	if len(a) != 8 && len(a) != 32 {
		return netip.AddrPort{}, fmt.Errorf("address of %d hex digits, want 8 or 32", len(a))
	}
	raw, err := hex.DecodeString(a)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("address: %w", err)
	}
	for i := 0; i < len(raw); i += 4 {
		w := binary.BigEndian.Uint32(raw[i:])
		binary.NativeEndian.PutUint32(raw[i:], w)
	}
	var addr netip.Addr
	if len(raw) == 4 {
		addr = netip.AddrFrom4([4]byte(raw))
	} else {
		addr = netip.AddrFrom16([16]byte(raw))
	}
	return netip.AddrPortFrom(addr, uint16(port)), nil
}

// ListeningOn returns the listening TCP sockets (IPv4 and IPv6) on port in
// this process's network namespace: from sock_diag, else /proc/net/tcp{,6}.
func ListeningOn(port int) ([]Socket, error) {
	if socks, err := listenersDiag(port); err == nil {
		return socks, nil
	}
	return listeningFromProc("/proc/net", port)
}

// ListeningOnIn is ListeningOn in the network namespace of process pid: a
// backend under systemd has a private one (PrivateNetwork=yes), whose
// listeners neither sock_diag nor /proc/net of this process can see.
// /proc/<pid>/net/tcp{,6} shows that namespace's sockets; their inodes
// are the same as in the holders' fd links, so the rest of the proof
// (which process, which cgroup) is unchanged. In this process's own
// namespace it is ListeningOn.
func ListeningOnIn(pid, port int) ([]Socket, error) {
	if pid <= 0 {
		return ListeningOn(port)
	}
	self, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		return ListeningOn(port)
	}
	theirs, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/net")
	if err != nil {
		// Gone (or not ours to read): no namespace of its own to look
		// into, so the listeners are those this process sees.
		return ListeningOn(port)
	}
	if theirs == self {
		return ListeningOn(port)
	}
	return listeningFromProc("/proc/"+strconv.Itoa(pid)+"/net", port)
}

// listeningFromProc is ListeningOn from dir/tcp{,6} (dir: /proc/net or
// /proc/<pid>/net).
func listeningFromProc(dir string, port int) ([]Socket, error) {
	var out []Socket
	for _, path := range []string{dir + "/tcp", dir + "/tcp6"} {
		data, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) && path == dir+"/tcp6" {
			continue // IPv6 disabled
		}
		if err != nil {
			return nil, fmt.Errorf("list listening sockets: %w", err)
		}
		socks, err := ParseProcNetTCP(data)
		if err != nil {
			return nil, fmt.Errorf("list listening sockets in %s: %w", path, err)
		}
		for _, s := range socks {
			if s.State == TCPListen && int(s.Local.Port()) == port {
				out = append(out, s)
			}
		}
	}
	return out, nil
}

// SocketInodes returns the inodes of the sockets process pid holds open.
func SocketInodes(pid int) (map[uint64]bool, error) {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list open files of PID %d: %w", pid, err)
	}
	out := map[uint64]bool{}
	for _, e := range ents {
		link, err := os.Readlink(dir + "/" + e.Name())
		if err != nil {
			continue // closed meanwhile
		}
		if n, ok := socketInode(link); ok {
			out[n] = true
		}
	}
	return out, nil
}

// socketInode reads the inode from a "socket:[12345]" fd link.
func socketInode(link string) (uint64, bool) {
	rest, ok := strings.CutPrefix(link, "socket:[")
	if !ok {
		return 0, false
	}
	rest, ok = strings.CutSuffix(rest, "]")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(rest, 10, 64)
	return n, err == nil
}

// SocketHolders scans every process for the given socket inodes and returns
// the PIDs holding each one, and how many processes' open files could not
// be read (other users' processes, when not root).
func SocketHolders(inodes map[uint64]bool) (map[uint64][]int, int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, 0, fmt.Errorf("list processes: %w", err)
	}
	holders := map[uint64][]int{}
	denied := 0
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		held, err := SocketInodes(pid)
		if err != nil {
			if errors.Is(err, fs.ErrPermission) {
				denied++
			}
			continue
		}
		for n := range inodes {
			if held[n] {
				holders[n] = append(holders[n], pid)
			}
		}
	}
	return holders, denied, nil
}

// CommOf returns the program name of pid (/proc/<pid>/comm), or "?".
func CommOf(pid int) string {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(data))
}

// ParentOf returns the parent PID of pid from /proc/<pid>/stat.
func ParentOf(pid int) (int, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("read parent of PID %d: %w", pid, err)
	}
	return parseStatPPID(data)
}

// parseStatPPID reads field 4 of /proc/<pid>/stat. The program name (field
// 2) is in parentheses and may itself hold spaces and parentheses, so the
// fields are counted from the last ')'.
func parseStatPPID(data []byte) (int, error) {
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, errors.New("stat: no ')' after the program name")
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 2 {
		return 0, errors.New("stat: too few fields")
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return 0, fmt.Errorf("stat: parent PID %q: %w", f[1], err)
	}
	return ppid, nil
}

// DescendsFrom reports whether pid is ancestor or one of its descendants.
func DescendsFrom(pid, ancestor int) bool {
	if ancestor <= 0 {
		return false
	}
	for i := 0; i < 64 && pid > 1; i++ {
		if pid == ancestor {
			return true
		}
		ppid, err := ParentOf(pid)
		if err != nil {
			return false
		}
		pid = ppid
	}
	return false
}

// CgroupOf returns the unified-hierarchy cgroup path of pid, or "".
func CgroupOf(pid int) string {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "0::"); ok {
			return rest
		}
	}
	return ""
}

// InCgroup reports whether pid runs in cgroup cg or below it.
func InCgroup(pid int, cg string) bool {
	if cg == "" {
		return false
	}
	got := CgroupOf(pid)
	return got != "" && (got == cg || strings.HasPrefix(got, strings.TrimSuffix(cg, "/")+"/"))
}

// CgroupProcs lists the processes of cgroup cg and its sub-cgroups from
// the unified hierarchy under /sys/fs/cgroup (best effort: an unreadable
// or vanished cgroup yields fewer PIDs, never an error).
func CgroupProcs(cg string) []int {
	if cg == "" || strings.Contains(cg, "..") {
		return nil
	}
	root := filepath.Join("/sys/fs/cgroup", cg)
	var out []int
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		data, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
		if err != nil {
			return nil
		}
		for _, f := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
				out = append(out, pid)
			}
		}
		return nil
	})
	return out
}
