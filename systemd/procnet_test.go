package systemd

import (
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
)

const procNetTCPHeader = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"

func TestParseProcNetTCP(t *testing.T) {
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		t.Skip("the samples are little-endian /proc text")
	}
	tests := []struct {
		name    string
		line    string
		want    Socket
		wantErr string
	}{
		{"ipv4 loopback listen", "   0: 0100007F:4650 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 123456 1 0000000000000000 100 0 0 10 0",
			Socket{Local: netip.MustParseAddrPort("127.0.0.1:18000"), State: TCPListen, UID: 1000, Inode: 123456}, ""},
		{"ipv4 any", "   1: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 42 1 0000000000000000 100 0 0 10 0",
			Socket{Local: netip.MustParseAddrPort("0.0.0.0:8080"), State: TCPListen, Inode: 42}, ""},
		{"ipv4 established", "   2: 0100007F:4650 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 77 1 0000000000000000 20 4 30 10 -1",
			Socket{Local: netip.MustParseAddrPort("127.0.0.1:18000"), State: 1, Inode: 77}, ""},
		{"ipv6 loopback", "   0: 00000000000000000000000001000000:4650 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000   998        0 9 1 0000000000000000 100 0 0 10 0",
			Socket{Local: netip.MustParseAddrPort("[::1]:18000"), State: TCPListen, UID: 998, Inode: 9}, ""},
		{"ipv6 mapped v4", "   0: 0000000000000000FFFF00000100007F:4650 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 10 1 0000000000000000 100 0 0 10 0",
			Socket{Local: netip.MustParseAddrPort("[::ffff:127.0.0.1]:18000"), State: TCPListen, Inode: 10}, ""},
		{"too few fields", "   0: 0100007F:4650 00000000:0000 0A", Socket{}, "fields"},
		{"bad address", "   0: 0100007G:4650 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 1 1", Socket{}, "local address"},
		{"no port", "   0: 0100007F 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 1 1", Socket{}, "no port"},
		{"short address", "   0: 00007F:4650 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 1 1", Socket{}, "hex digits"},
		{"bad inode", "   0: 0100007F:4650 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 x 1", Socket{}, "inode"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseProcNetTCP([]byte(procNetTCPHeader + tt.line + "\n"))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0] != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func FuzzParseProcNetTCP(f *testing.F) {
	f.Add([]byte(procNetTCPHeader + "   0: 0100007F:4650 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 123456 1 0000000000000000 100 0 0 10 0\n"))
	f.Add([]byte(procNetTCPHeader + "   0: 00000000000000000000000001000000:4650 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000   998        0 9 1\n"))
	f.Add([]byte("sl\n\n  :  : : : : : : : : :\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		socks, err := ParseProcNetTCP(data)
		if err != nil {
			return
		}
		for _, s := range socks {
			if !s.Local.IsValid() {
				t.Fatalf("parsed an invalid address from %q: %+v", data, s)
			}
		}
	})
}

func TestParseStatPPID(t *testing.T) {
	tests := []struct {
		in   string
		want int
		err  bool
	}{
		{"1234 (sleep) S 1 1234 1234 0 -1", 1, false},
		{"1234 (my (odd) prog) R 4321 1 1 0", 4321, false},
		{"1234 (a b) c) S 77 1 1", 77, false},
		{"1234 sleep S 1", 0, true},
		{"1234 (x)", 0, true},
		{"1234 (x) S y", 0, true},
	}
	for _, tt := range tests {
		got, err := parseStatPPID([]byte(tt.in))
		if (err != nil) != tt.err || got != tt.want {
			t.Errorf("parseStatPPID(%q) = %d, %v; want %d, error %v", tt.in, got, err, tt.want, tt.err)
		}
	}
}

// TestListenerHolder finds a real listening socket from /proc/net/tcp to
// the process that holds it, and a child's parent chain back to us.
func TestListenerHolder(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	socks, err := ListeningOn(port)
	if err != nil {
		t.Fatal(err)
	}
	if len(socks) != 1 || socks[0].Local.Addr() != netip.MustParseAddr("127.0.0.1") || socks[0].UID != os.Getuid() {
		t.Fatalf("ListeningOn(%d) = %+v, want our one loopback listener", port, socks)
	}
	// sock_diag and /proc/net/tcp agree.
	fromProc, err := listeningFromProc("/proc/net", port)
	if err != nil {
		t.Fatal(err)
	}
	if len(fromProc) != 1 || fromProc[0] != socks[0] {
		t.Fatalf("/proc/net/tcp says %+v, ListeningOn %+v", fromProc, socks)
	}
	fromDiag, err := listenersDiag(port)
	if err != nil {
		t.Fatalf("sock_diag: %v", err)
	}
	if len(fromDiag) != 1 || fromDiag[0] != socks[0] {
		t.Fatalf("sock_diag says %+v, /proc/net/tcp %+v", fromDiag, fromProc)
	}
	ln6, err := net.Listen("tcp6", "[::1]:0")
	if err == nil {
		defer ln6.Close()
		p6 := ln6.Addr().(*net.TCPAddr).Port
		a, errA := listenersDiag(p6)
		b, errB := listeningFromProc("/proc/net", p6)
		if errA != nil || errB != nil || len(a) != 1 || len(b) != 1 || a[0] != b[0] || a[0].Local.Addr() != netip.IPv6Loopback() {
			t.Errorf("IPv6 listener: sock_diag %+v %v, /proc %+v %v", a, errA, b, errB)
		}
	}
	mine, err := SocketInodes(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if !mine[socks[0].Inode] {
		t.Fatalf("our open files lack socket inode %d", socks[0].Inode)
	}
	holders, _, err := SocketHolders(map[uint64]bool{socks[0].Inode: true})
	if err != nil {
		t.Fatal(err)
	}
	if h := holders[socks[0].Inode]; len(h) != 1 || h[0] != os.Getpid() {
		t.Fatalf("holders = %v, want [%d]", h, os.Getpid())
	}
	if c := CommOf(os.Getpid()); c == "?" || c == "" {
		t.Errorf("CommOf(self) = %q", c)
	}

	cmd := exec.Command("/bin/sh", "-c", "sleep 30; :")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if !DescendsFrom(cmd.Process.Pid, os.Getpid()) {
		t.Error("a child does not descend from its parent")
	}
	if DescendsFrom(os.Getpid(), cmd.Process.Pid) {
		t.Error("the parent descends from its child")
	}
	if cg := CgroupOf(os.Getpid()); cg != "" && !InCgroup(cmd.Process.Pid, cg) {
		t.Errorf("child not in its parent's cgroup %s (has %s)", cg, CgroupOf(cmd.Process.Pid))
	}
}
