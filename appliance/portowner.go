package appliance

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"gpuhost/api"
	"gpuhost/systemd"
)

// A health answer on the profile's port proves only that something answers
// there. Another program on that port (a second gpuhost demo, a hand-started
// server) would pass the ready and verify steps while the unit itself failed
// to bind, so both steps also trace the listening socket to the process
// holding it: its inode from /proc/net/tcp{,6}, the holder from the
// socket:[inode] links in /proc/<pid>/fd, and the holder must run in the
// unit's cgroup (systemd) or descend from its main process (the process
// runner, which has no cgroups). Under systemd the listener is looked up in
// the network namespace of the unit's main process (PrivateNetwork=yes),
// and the daemon reaches that port only through the unit's socket, which
// systemd created 0600 for the daemon's user under /run/gpuhost: the
// answer on the socket and the listener in the unit's namespace are the
// same proof as before, one hop further in.

// PortOwnerError says that a listening socket on a profile's port belongs
// to a process outside the unit.
type PortOwnerError struct {
	Port    int
	Unit    string
	Holders []PortHolder
}

// PortHolder is a process (or, when its PID cannot be read, a user) holding
// a listening socket.
type PortHolder struct {
	PID  int    `json:"pid,omitempty"`
	Comm string `json:"comm,omitempty"`
	UID  int    `json:"uid"`
	Addr string `json:"addr"`
}

func (h PortHolder) String() string {
	if h.PID == 0 {
		return fmt.Sprintf("a process of uid %d (its PID is not readable) on %s", h.UID, h.Addr)
	}
	return fmt.Sprintf("PID %d (%s) on %s", h.PID, h.Comm, h.Addr)
}

func (e *PortOwnerError) Error() string {
	var hs []string
	for _, h := range e.Holders {
		hs = append(hs, h.String())
	}
	return fmt.Sprintf("port %d is held by %s, not by %s: another program answers on the profile's port",
		e.Port, strings.Join(hs, ", "), e.Unit)
}

// errPortUnproven is returned while the listener on the port cannot be
// traced yet (nothing listens, or it closed between two reads).
var errPortUnproven = errors.New("listener not traced to a process")

// unitOwns reports whether pid is part of the unit: its main process, a
// process in its cgroup, or (without a cgroup) a descendant of its main
// process.
func unitOwns(st api.UnitStatus, pid int) bool {
	if pid <= 0 {
		return false
	}
	if pid == st.MainPID {
		return true
	}
	if st.ControlGroup != "" {
		return systemd.InCgroup(pid, st.ControlGroup)
	}
	return systemd.DescendsFrom(pid, st.MainPID)
}

// provePortOwner checks that every listening socket on port is held by the
// unit described by st, and says which process holds it. It returns a
// *PortOwnerError when another program holds one, and an error wrapping
// errPortUnproven when it cannot tell yet.
func provePortOwner(port int, st api.UnitStatus) (string, error) {
	// In the unit's network namespace: under systemd the backend has a
	// private one, where only its own processes (and its socket relay,
	// which listens on no TCP port) live.
	socks, err := systemd.ListeningOnIn(st.MainPID, port)
	if err != nil {
		return "", fmt.Errorf("trace the listener on port %d: %w", port, err)
	}
	if len(socks) == 0 {
		return "", fmt.Errorf("%w: nothing listens on port %d", errPortUnproven, port)
	}
	// The unit's own processes first: usually one look at the main process
	// settles it, without reading every process's open files.
	// The cgroup's other processes are read only when the main process
	// does not hold every listener.
	owner := map[uint64]int{}
	look := func(pid int) (all bool) {
		held, err := systemd.SocketInodes(pid)
		all = true
		for _, s := range socks {
			if err == nil && held[s.Inode] && owner[s.Inode] == 0 {
				owner[s.Inode] = pid
			}
			all = all && owner[s.Inode] != 0
		}
		return all
	}
	if st.MainPID <= 0 || !look(st.MainPID) {
		if st.ControlGroup != "" {
			for _, pid := range systemd.CgroupProcs(st.ControlGroup) {
				if pid > 0 && pid != st.MainPID && look(pid) {
					break
				}
			}
		}
	}
	unknown := map[uint64]bool{}
	for _, s := range socks {
		if owner[s.Inode] == 0 {
			unknown[s.Inode] = true
		}
	}
	var foreign []PortHolder
	if len(unknown) > 0 {
		holders, denied, err := systemd.SocketHolders(unknown)
		if err != nil {
			return "", fmt.Errorf("trace the listener on port %d: %w", port, err)
		}
		for _, s := range socks {
			if !unknown[s.Inode] {
				continue
			}
			pids := holders[s.Inode]
			for _, pid := range pids {
				if unitOwns(st, pid) {
					owner[s.Inode] = pid
				}
			}
			if owner[s.Inode] != 0 {
				continue
			}
			for _, pid := range pids {
				foreign = append(foreign, PortHolder{PID: pid, Comm: systemd.CommOf(pid), UID: s.UID, Addr: s.Local.String()})
			}
			if len(pids) > 0 {
				continue
			}
			// No readable process holds it. Without the right to read other
			// users' open files the socket's owner uid is all we have: the
			// unit's uid is a weaker proof, any other uid is foreign.
			if denied == 0 {
				return "", fmt.Errorf("%w: no process holds the listener on %s (closed meanwhile?)", errPortUnproven, s.Local)
			}
			if uid, ok := uidOf(st.MainPID); ok && uid == s.UID {
				owner[s.Inode] = st.MainPID
				continue
			}
			foreign = append(foreign, PortHolder{UID: s.UID, Addr: s.Local.String()})
		}
	}
	if len(foreign) > 0 {
		return "", &PortOwnerError{Port: port, Unit: st.Name, Holders: foreign}
	}
	var parts []string
	for _, s := range socks {
		pid := owner[s.Inode]
		parts = append(parts, fmt.Sprintf("%s by PID %d (%s)", s.Local, pid, systemd.CommOf(pid)))
	}
	return "listening on " + strings.Join(parts, ", "), nil
}

// uidOf returns the owner uid of process pid.
func uidOf(pid int) (int, bool) {
	if pid <= 0 {
		return 0, false
	}
	fi, err := os.Stat("/proc/" + strconv.Itoa(pid))
	if err != nil {
		return 0, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Uid), true
}
