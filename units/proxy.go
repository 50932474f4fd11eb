package units

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// A backend's own API has no authentication worth the name: vLLM's
// --api-key covers /v1 only, its sleep and RPC endpoints answer any origin,
// and Ollama lets every loopback origin drive /api/pull and /api/delete.
// Binding loopback keeps the LAN out but not a browser page or another
// local user. So under systemd each rendered backend runs in its own
// network namespace (PrivateNetwork=yes: its 127.0.0.1 is its own), and
// the only way in is a unix socket that systemd creates for gpuhost's user
// alone (SocketMode=0600) and hands to systemd-socket-proxyd, which runs
// inside the backend's namespace (JoinsNamespaceOf=) and relays each
// connection to the backend's loopback port. gpuhost dials that socket
// wherever it used to dial 127.0.0.1:PORT (backend.Dialer).

// ProxySocketDir holds the backends' sockets. systemd creates it for the
// .socket units (mode 0755); the sockets themselves are 0600.
const ProxySocketDir = "/run/gpuhost"

// SocketProxyd is systemd's relay from a socket to an address. /lib is
// where Debian's systemd 252 has it; with merged /usr it is the same file
// as /usr/lib/systemd/systemd-socket-proxyd.
const SocketProxyd = "/lib/systemd/systemd-socket-proxyd"

// proxyBase is the name stem of the proxy units of unit's port.
func proxyBase(unit string, port int) string {
	return strings.TrimSuffix(unit, ".service") + "-proxy-" + strconv.Itoa(port)
}

// ProxySocketUnit is the name of the .socket unit that exposes port of the
// backend unit (e.g. gpuhost-vllm-proxy-8000.socket).
func ProxySocketUnit(unit string, port int) string { return proxyBase(unit, port) + ".socket" }

// ProxySocketPath is where the daemon reaches port of the backend unit.
func ProxySocketPath(unit string, port int) string {
	return ProxySocketDir + "/" + strings.TrimSuffix(unit, ".service") + "-" + strconv.Itoa(port) + ".sock"
}

// ProxySocketUnits lists the .socket units of u's ports, in port order:
// gpuhost.service wants them, so they listen whenever gpuhost runs.
func (u BackendUnit) ProxySocketUnits() []string {
	if u.Adopt {
		return nil
	}
	var names []string
	for _, p := range sortedPorts(u.Ports) {
		names = append(names, ProxySocketUnit(u.Name, p))
	}
	return names
}

func sortedPorts(ports []int) []int {
	ps := slices.Clone(ports)
	slices.Sort(ps)
	return slices.Compact(ps)
}

// Rendered is one rendered file: its name under the unit folder and its text.
type Rendered struct{ Name, Content string }

// RenderProxyUnits renders, for every port of the backend unit u, the
// socket unit gpuhost dials and the relay service it activates. An adopted
// unit gets none: its network is the operator's.
func RenderProxyUnits(u BackendUnit) []Rendered {
	if u.Adopt {
		return nil
	}
	var files []Rendered
	for _, port := range sortedPorts(u.Ports) {
		files = append(files,
			Rendered{ProxySocketUnit(u.Name, port), renderProxySocket(u, port)},
			Rendered{proxyBase(u.Name, port) + ".service", renderProxyService(u, port)})
	}
	return files
}

func renderProxySocket(u BackendUnit, port int) string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	w("# %s: written by gpuhost (`gpuhost units`); edits here are overwritten.", ProxySocketUnit(u.Name, port))
	w("# The only way into %s's port %d: the backend has a private network, so", u.Name, port)
	w("# its 127.0.0.1:%d is not the host's; only this socket's owner may connect.", port)
	w("[Unit]")
	w("Description=%s", escapeSpecifiers(fmt.Sprintf("gpuhost: socket to %s port %d", u.Name, port)))
	w("")
	w("[Socket]")
	w("ListenStream=%s", ProxySocketPath(u.Name, port))
	owner := u.SocketUser
	if owner == "" {
		owner = "root"
	}
	w("# gpuhost's own user; nobody else (no browser, no other local user) can open it.")
	w("SocketUser=%s", owner)
	w("SocketGroup=root")
	w("SocketMode=0600")
	w("DirectoryMode=0755")
	w("# A connection starts the relay, never the backend: gpuhost decides when that runs.")
	w("Accept=no")
	return b.String()
}

func renderProxyService(u BackendUnit, port int) string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	sock := ProxySocketUnit(u.Name, port)
	w("# %s.service: written by gpuhost (`gpuhost units`); edits here are overwritten.", proxyBase(u.Name, port))
	w("[Unit]")
	w("Description=%s", escapeSpecifiers(fmt.Sprintf("gpuhost: relay from %s to %s port %d", sock, u.Name, port)))
	w("Requires=%s", sock)
	w("After=%s", sock)
	if u.NetworkOpen {
		w("# The backend's network is open (backends.%s.network: open): 127.0.0.1:%d is the", u.Backend, port)
		w("# host's loopback, where the backend listens.")
	} else {
		w("# Runs inside the backend's network namespace, where 127.0.0.1:%d is the backend.", port)
		w("# Whichever of the two starts first creates the namespace; the other joins it.")
		w("JoinsNamespaceOf=%s", u.Name)
	}
	w("")
	w("[Service]")
	w("ExecStart=%s 127.0.0.1:%d", SocketProxyd, port)
	if !u.NetworkOpen {
		w("PrivateNetwork=yes")
		w("# Inside the namespace only loopback exists; the filter says so once more.")
	}
	w("IPAddressAllow=localhost")
	w("IPAddressDeny=any")
	w("DynamicUser=yes")
	w("NoNewPrivileges=yes")
	w("CapabilityBoundingSet=")
	w("AmbientCapabilities=")
	w("ProtectSystem=strict")
	w("ProtectHome=yes")
	w("PrivateDevices=yes")
	w("ProtectKernelTunables=yes")
	w("ProtectKernelModules=yes")
	w("ProtectKernelLogs=yes")
	w("ProtectControlGroups=yes")
	w("ProtectClock=yes")
	w("ProtectHostname=yes")
	w("ProtectProc=invisible")
	w("ProcSubset=pid")
	w("LockPersonality=yes")
	w("MemoryDenyWriteExecute=yes")
	w("RestrictRealtime=yes")
	w("RestrictSUIDSGID=yes")
	w("RestrictNamespaces=yes")
	w("SystemCallArchitectures=native")
	w("SystemCallFilter=@system-service")
	w("SystemCallFilter=~@privileged @resources")
	w("RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6")
	w("UMask=0077")
	return b.String()
}
