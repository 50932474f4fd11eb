package units

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// BackendUnit describes the systemd unit that runs one backend kind.
type BackendUnit struct {
	Backend   Backend
	Name      string   // e.g. gpuhost-vllm.service (rendered) or vllm.service (adopted)
	Adopt     bool     // true: operator's unit, we only add a drop-in
	Exec      []string // command prefix, e.g. ["/usr/local/bin/vllm"] or ["/usr/local/bin/gpuhost","simulate","vllm","--sim-dir","/var/lib/gpuhost/simgpu"]
	EnvFile   string   // absolute path of the environment file gpuhost writes per switch
	User      string   // User=; empty: root (gpuhost's config defaults it to DefaultBackendUser)
	Conflicts []string // the other backend unit name(s)
	// Standby is set when profiles use standby (units.Standby): both
	// backend units may then run at once, one asleep, so Conflicts= is
	// left out and the Supervisor enforces the exclusion itself (at most
	// one unit above its measured standby residual).
	Standby bool
	// ReadWritePaths are the folders the backend writes despite
	// ProtectSystem=strict: model caches, model folders, the simulator's
	// state. Each is optional ('-'): a missing one does not fail the start.
	ReadWritePaths []string
	// Ports are the loopback ports the unit's profiles listen on; each gets
	// a socket under ProxySocketDir (RenderProxyUnits).
	Ports []int
	// SocketUser owns those sockets: gpuhost's own user (empty: root).
	SocketUser string
	// NetworkOpen drops PrivateNetwork= (backends.<kind>.network: open):
	// the backend can reach the network, and its port is on the host's
	// loopback. Fenced (false, the default), the unit sets OfflineEnv.
	NetworkOpen bool
}

// DefaultBackendUser is the unprivileged user the backends run as unless
// the config names another; scripts/install.sh creates it as a system user
// with the home DefaultBackendHome (which holds the model caches).
const DefaultBackendUser = "gpuhost-backend"

// DefaultBackendHome is DefaultBackendUser's home: ~/.cache/huggingface,
// ~/.cache/vllm and ~/.ollama live below it.
const DefaultBackendHome = "/var/lib/gpuhost-backend"

// DropInName is the file name of the drop-in gpuhost adds to an adopted unit.
// The "10-" prefix sorts it before operator drop-ins such as "50-local.conf",
// so the operator can still override it.
const DropInName = "10-gpuhost.conf"

// Validate reports everything in u that RenderBackendUnit or
// RenderAdoptDropIn cannot express safely in a unit file (all problems, joined).
// Render does not fail; call this first (the config loader and `gpuhost units` do).
func (u BackendUnit) Validate() error {
	var errs []error
	if u.Backend != VLLM && u.Backend != Ollama {
		errs = append(errs, fmt.Errorf("backend unit %q: unknown backend %q", u.Name, u.Backend))
	}
	if err := ValidServiceName(u.Name); err != nil {
		errs = append(errs, fmt.Errorf("backend unit name: %w", err))
	}
	for _, c := range u.Conflicts {
		if err := ValidUnitName(c); err != nil {
			errs = append(errs, fmt.Errorf("backend unit %q: conflicts: %w", u.Name, err))
		} else if c == u.Name {
			errs = append(errs, fmt.Errorf("backend unit %q: cannot conflict with itself", u.Name))
		}
	}
	if !u.Adopt {
		if len(u.Exec) == 0 || u.Exec[0] == "" {
			errs = append(errs, fmt.Errorf("backend unit %q: exec must name the program", u.Name))
		} else if strings.ContainsAny(u.Exec[0][:1], "@-:+!") {
			errs = append(errs, fmt.Errorf("backend unit %q: exec program %q must not start with one of @-:+! (systemd reads those as ExecStart prefixes)", u.Name, u.Exec[0]))
		}
		// QuoteExecWord could escape a control character, but no program
		// path or flag needs one, and refusing it keeps every value that
		// reaches a unit file to one visible line.
		for _, w := range u.Exec {
			if err := unitLine(w); err != nil {
				errs = append(errs, fmt.Errorf("backend unit %q: exec word %q: %w", u.Name, w, err))
			}
		}
		if !filepath.IsAbs(u.EnvFile) || filepath.Clean(u.EnvFile) != u.EnvFile {
			errs = append(errs, fmt.Errorf("backend unit %q: env file %q must be a clean absolute path", u.Name, u.EnvFile))
		} else if err := unitLine(u.EnvFile); err != nil {
			errs = append(errs, fmt.Errorf("backend unit %q: env file %q: %w", u.Name, u.EnvFile, err))
		}
		if u.User != "" {
			if err := ValidUser(u.User); err != nil {
				errs = append(errs, fmt.Errorf("backend unit %q: %w", u.Name, err))
			}
		}
		for _, p := range u.ReadWritePaths {
			if err := listPath(p); err != nil {
				errs = append(errs, fmt.Errorf("backend unit %q: read-write path: %w", u.Name, err))
			}
		}
		for _, p := range u.Ports {
			if p < 1 || p > 65535 {
				errs = append(errs, fmt.Errorf("backend unit %q: port %d is not in 1..65535", u.Name, p))
			}
		}
		if u.SocketUser != "" {
			if err := ValidUser(u.SocketUser); err != nil {
				errs = append(errs, fmt.Errorf("backend unit %q: socket user: %w", u.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// RenderBackendUnit renders the full unit file gpuhost installs for a backend
// it owns. The unit never changes on a switch: ExecStart is the fixed Exec
// prefix followed by `$GPUHOST_ARGS`, which systemd fills from EnvFile.
func RenderBackendUnit(u BackendUnit) string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	w("# %s: written by gpuhost (`gpuhost units`); edits here are overwritten.", u.Name)
	w("# The model and its flags are not in this file: on every switch gpuhost rewrites")
	w("# %s and this unit expands $%s from it.", u.EnvFile, EnvArgs)
	w("[Unit]")
	w("Description=%s", escapeSpecifiers("gpuhost inference backend ("+backendTitle(u.Backend)+")"))
	if len(u.Conflicts) > 0 {
		w("# Never two backends on the GPU: starting this unit stops the other, even from a plain `systemctl start`.")
		w("Conflicts=%s", strings.Join(u.Conflicts, " "))
		w("# Conflicts= alone does not order the jobs: without After= the start of this unit may")
		w("# return while the other is still stopping. With it, the other's stop completes first.")
		w("After=%s", strings.Join(u.Conflicts, " "))
	}
	if u.Standby {
		w("# No Conflicts=: profiles use standby, so the other backend may keep running asleep")
		w("# (vLLM sleep mode, Ollama unloaded) while this one serves. gpuhost enforces that at most")
		w("# one backend holds more GPU memory than its measured standby residual.")
	}
	w("# Ordering only: gpuhost starts this unit on demand, and models may be fetched over the network.")
	w("After=network-online.target")
	w("")
	w("[Service]")
	w("# Type=exec: start fails if the program cannot be executed; readiness is gpuhost's own health check.")
	w("Type=exec")
	w("# '-': a missing file is not an error; gpuhost writes it before every start.")
	w("EnvironmentFile=-%s", escapeSpecifiers(u.EnvFile))
	w("ExecStart=%s $%s", execLine(u.Exec), EnvArgs)
	w("# Stop every process of the backend: vLLM forks engine workers that hold VRAM.")
	w("KillMode=control-group")
	w("TimeoutStopSec=30")
	w("# gpuhost's supervisor decides about restarts; a restart behind its back would race a switch.")
	w("Restart=no")
	writeBackendSandbox(w, u)
	return b.String()
}

// underAny reports whether p is one of dirs or below one of them.
func underAny(p string, dirs ...string) bool {
	for _, d := range dirs {
		if p == d || strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}

// writeBackendSandbox writes the backend's hardening. The model server is
// large third-party code that downloads and runs model files; it gets no
// capabilities, a read-only system, only its caches writable, and the
// system calls of an ordinary service. What stays open is what CUDA and
// the NVIDIA driver need; each such line is listed, with its reason, in the
// unit itself so that an operator tightening it knows what breaks.
func writeBackendSandbox(w func(string, ...any), u BackendUnit) {
	var execPath string
	if len(u.Exec) > 0 {
		execPath = u.Exec[0]
	}
	rw := make([]string, 0, len(u.ReadWritePaths))
	privateTmp, protectHome := "yes", "yes"
	for _, p := range append([]string{execPath}, u.ReadWritePaths...) {
		if underAny(p, "/tmp", "/var/tmp") {
			privateTmp = "no"
		}
		if underAny(p, "/home", "/root", "/run/user") {
			protectHome = "read-only"
		}
	}
	for _, p := range u.ReadWritePaths {
		rw = append(rw, "-"+escapeSpecifiers(p))
	}
	w("")
	w("# --- Sandbox ---")
	if u.User != "" {
		w("# Not root: the default user is created by scripts/install.sh; its home holds the model caches.")
		w("User=%s", u.User)
	}
	w("NoNewPrivileges=yes")
	w("# No capabilities at all, even when User=root: a model server needs none.")
	w("CapabilityBoundingSet=")
	w("AmbientCapabilities=")
	w("ProtectSystem=strict")
	if len(rw) > 0 {
		w("# The only writable folders: model caches and model folders (backends.*.read_write_paths)")
		w("# and, for the simulator, its state. '-': a folder that does not exist yet is no error.")
		w("ReadWritePaths=%s", strings.Join(rw, " "))
	}
	if protectHome == "read-only" {
		w("# read-only, not yes: the program or a writable folder lives under a home directory.")
	}
	w("ProtectHome=%s", protectHome)
	if privateTmp == "no" {
		w("# PrivateTmp=no: the program or a writable folder lives under /tmp or /var/tmp, which a")
		w("# private /tmp would hide.")
	}
	w("PrivateTmp=%s", privateTmp)
	w("ProtectKernelTunables=yes")
	w("ProtectKernelModules=yes")
	w("ProtectKernelLogs=yes")
	w("ProtectControlGroups=yes")
	w("ProtectHostname=yes")
	w("# Other users' processes are hidden; /proc/driver/nvidia stays visible (see ProcSubset= below).")
	w("ProtectProc=invisible")
	w("LockPersonality=yes")
	w("RestrictRealtime=yes")
	w("RestrictSUIDSGID=yes")
	w("RestrictNamespaces=yes")
	w("RemoveIPC=yes")
	w("UMask=0027")
	w("SystemCallArchitectures=native")
	w("# @system-service covers what Python, PyTorch, CUDA and Go need (ioctl on /dev/nvidia*,")
	w("# mmap, NUMA and affinity calls); anything else fails with EPERM instead of killing the server.")
	w("SystemCallFilter=@system-service")
	w("SystemCallErrorNumber=EPERM")
	w("# AF_UNIX: vLLM's engine processes talk over Unix sockets (ZMQ). AF_NETLINK: interface")
	w("# lookups. AF_INET/AF_INET6: the API port and model downloads.")
	w("RestrictAddressFamilies=AF_UNIX AF_NETLINK AF_INET AF_INET6")
	writeBackendNetwork(w, u)
	w("# Deliberately not set (each would break the GPU or the server):")
	w("#   PrivateDevices=, DevicePolicy=, DeviceAllow=: CUDA opens /dev/nvidiactl, /dev/nvidia0,")
	w("#     /dev/nvidia-uvm and /dev/nvidia-caps/*, whose majors differ per driver.")
	w("#   ProtectClock=: it implies DeviceAllow=char-rtc r, which on systemd before v252")
	w("#     switches on the device allow-list and hides /dev/nvidia*.")
	w("#   ProcSubset=pid: the NVIDIA driver library reads /proc/driver/nvidia, PyTorch")
	w("#     /proc/meminfo and /proc/cpuinfo.")
	w("#   MemoryDenyWriteExecute=: the CUDA driver, Triton and PyTorch's inductor JIT-compile")
	w("#     kernels into writable and executable memory.")
	w("#   PrivateUsers=: the server's cache folders belong to its user on the host.")
}

// writeBackendNetwork writes the unit's network fence, or its opening.
func writeBackendNetwork(w func(string, ...any), u BackendUnit) {
	if u.NetworkOpen {
		w("# NOT fenced (backends.%s.network: open): no PrivateNetwork=, so the server can", u.Backend)
		w("# download models, and its API is on the host's loopback, where any local user or")
		w("# a browser page can reach it. `gpuhost doctor` names this opening (units.network).")
		return
	}
	w("# Its own network: the server's 127.0.0.1 is not the host's, so no browser page, LAN")
	w("# host or local user reaches its API (vLLM's sleep and RPC endpoints, Ollama's")
	w("# /api/pull and /api/delete). gpuhost reaches it through the socket units")
	w("# %s-proxy-PORT.socket (socket %s/...), relayed inside this namespace.", strings.TrimSuffix(u.Name, ".service"), ProxySocketDir)
	w("# The price: the server cannot download models; fetch them into its cache first")
	w("# (`gpuhost doctor` checks the cache and names the command).")
	w("PrivateNetwork=yes")
	w("IPAddressAllow=localhost")
	w("IPAddressDeny=any")
	if env := OfflineEnv(u.Backend); len(env) > 0 {
		if u.Backend == VLLM {
			w("# Without a network the server must know it is offline: vLLM resolves its model")
			w("# through the Hugging Face hub at start even when it is cached, and fails or waits on")
			w("# timeouts unless HF_HUB_OFFLINE=1. The environment file repeats these per profile.")
		} else {
			w("# Without a network: no cloud models (served through the local API, answered by")
			w("# ollama.com), no usage reports. The environment file repeats these per profile.")
		}
		words := make([]string, len(env))
		for i, e := range env {
			words[i] = e.String()
		}
		w("Environment=%s", strings.Join(words, " "))
	}
}

// RenderAdoptDropIn renders the drop-in for a unit the operator owns. It adds
// only Conflicts=, the first layer of mutual exclusion; the operator's unit
// file itself is never touched. path is relative to the unit directory
// (e.g. "vllm.service.d/10-gpuhost.conf").
func RenderAdoptDropIn(u BackendUnit) (path string, content string) {
	var b strings.Builder
	fmt.Fprintf(&b, "# Written by gpuhost: adds mutual exclusion with the other GPU backend.\n")
	fmt.Fprintf(&b, "# The operator's %s is untouched; delete this file and run\n", u.Name)
	fmt.Fprintf(&b, "# `systemctl daemon-reload` to undo.\n")
	b.WriteString("[Unit]\n")
	if u.Standby {
		b.WriteString("# No Conflicts=: profiles use standby, so both backends may run, one asleep;\n")
		b.WriteString("# gpuhost enforces that at most one holds more than its standby residual.\n")
	}
	if len(u.Conflicts) > 0 {
		fmt.Fprintf(&b, "Conflicts=%s\n", strings.Join(u.Conflicts, " "))
		// Without ordering, the start could return while the other unit
		// is still stopping; After= makes the stop complete first.
		fmt.Fprintf(&b, "After=%s\n", strings.Join(u.Conflicts, " "))
	}
	return u.Name + ".d/" + DropInName, b.String()
}

// DaemonUnit describes gpuhost.service itself.
type DaemonUnit struct {
	Binary, Config string
	WatchdogSec    int    // <= 0: 30
	User           string // empty: root (needed to manage units without polkit rules)
	// ReadWritePaths are further paths gpuhost must write despite
	// ProtectSystem=strict, e.g. a state_dir other than /var/lib/gpuhost.
	ReadWritePaths []string
	// BindPrivilegedPort keeps CAP_NET_BIND_SERVICE (listen port < 1024).
	BindPrivilegedPort bool
	// Sockets are the backends' proxy socket units (BackendUnit.ProxySocketUnits):
	// gpuhost.service wants them, so they listen whenever gpuhost runs.
	Sockets []string
	// BackendGroups are the backend users' groups gpuhost joins
	// (SupplementaryGroups=): without CAP_DAC_READ_SEARCH even root reads
	// the backend user's 0750 home and its model caches only through the
	// group, and the switch checks that the model is there before a start.
	BackendGroups []string
}

// DefaultWatchdogSec is the watchdog interval when DaemonUnit.WatchdogSec is unset.
const DefaultWatchdogSec = 30

// Validate reports what RenderDaemonUnit cannot express safely.
func (d DaemonUnit) Validate() error {
	var errs []error
	for _, s := range d.Sockets {
		if err := ValidUnitName(s); err != nil {
			errs = append(errs, fmt.Errorf("gpuhost.service: socket: %w", err))
		}
	}
	for _, f := range []struct{ what, p string }{{"binary", d.Binary}, {"config", d.Config}} {
		if !filepath.IsAbs(f.p) {
			errs = append(errs, fmt.Errorf("gpuhost.service: %s %q must be an absolute path", f.what, f.p))
		} else if err := unitLine(f.p); err != nil {
			errs = append(errs, fmt.Errorf("gpuhost.service: %s %q: %w", f.what, f.p, err))
		}
	}
	for _, p := range d.ReadWritePaths {
		if err := listPath(p); err != nil {
			errs = append(errs, fmt.Errorf("gpuhost.service: read-write path: %w", err))
		}
	}
	for _, g := range d.BackendGroups {
		if err := ValidUser(g); err != nil {
			errs = append(errs, fmt.Errorf("gpuhost.service: backend group: %w", err))
		}
	}
	if d.User != "" {
		if err := ValidUser(d.User); err != nil {
			errs = append(errs, fmt.Errorf("gpuhost.service: %w", err))
		}
	}
	return errors.Join(errs...)
}

// RenderDaemonUnit renders gpuhost.service: a Type=notify service with a
// watchdog, sandboxed as far as its jobs allow. The rendered file comments
// each non-obvious choice, including the hardening options deliberately left
// out, because an operator tightening it later must know what breaks.
func RenderDaemonUnit(d DaemonUnit) string {
	var b strings.Builder
	w := func(s string, a ...any) { fmt.Fprintf(&b, s+"\n", a...) }
	w("# gpuhost.service: written by `gpuhost units`; edits here are overwritten.")
	daemonUnitSection(w, d)
	daemonServiceSection(w, d)
	daemonSandbox(w, d)
	daemonNotSet(w)
	if len(d.BackendGroups) > 0 {
		w("# Read access to the backend user's home (0750) and model caches, whose presence a switch")
		w("# checks before it starts a backend; the group is the backend user's (scripts/install.sh).")
		w("SupplementaryGroups=%s", strings.Join(d.BackendGroups, " "))
	}
	if d.User != "" {
		w("# Not root: this user needs polkit rights for org.freedesktop.systemd1.manage-units and")
		w("# write access to the unit directories above.")
		w("User=%s", d.User)
	}
	w("")
	w("[Install]")
	w("WantedBy=multi-user.target")
	return b.String()
}

// daemonUnitSection writes gpuhost.service's [Unit] section.
func daemonUnitSection(w func(string, ...any), d DaemonUnit) {
	w("[Unit]")
	w("Description=gpuhost: GPU inference supervisor (vLLM/Ollama switching, proxy, panel, MCP)")
	w("# The proxy, panel, bot and mail triage need the network; units are controlled over D-Bus.")
	w("Wants=network-online.target")
	w("After=network-online.target dbus.service")
	if len(d.Sockets) > 0 {
		w("# The backends' sockets, their only way in (each backend has a private network).")
		w("Wants=%s", strings.Join(d.Sockets, " "))
		w("After=%s", strings.Join(d.Sockets, " "))
	}
	w("")
}

// daemonServiceSection writes the start of the [Service] section: the
// notify type, the command, the watchdog, restarts and directories.
func daemonServiceSection(w func(string, ...any), d DaemonUnit) {
	watchdog := d.WatchdogSec
	if watchdog <= 0 {
		watchdog = DefaultWatchdogSec
	}
	w("[Service]")
	w("# gpuhost reports READY=1 once it has reconciled state from systemd and NVML, and pings")
	w("# the watchdog from its main loop; only the main process may notify.")
	w("Type=notify")
	w("NotifyAccess=main")
	w("ExecStart=%s", execLine([]string{d.Binary, "serve", "--config", d.Config}))
	w("WatchdogSec=%d", watchdog)
	w("Restart=on-failure")
	w("RestartSec=2")
	w("# The backends are separate units: they keep running while gpuhost restarts, and")
	w("# gpuhost adopts their state again from systemd and NVML when it comes back.")
	w("StateDirectory=gpuhost")
	w("ConfigurationDirectory=gpuhost")
	w("")
}

// daemonSandbox writes the [Service] section's sandboxing: file system,
// kernel, namespaces, address families, capabilities and system calls.
func daemonSandbox(w func(string, ...any), d DaemonUnit) {
	protectHome := "yes"
	for _, p := range []string{d.Binary, d.Config} {
		if strings.HasPrefix(p, "/home/") || strings.HasPrefix(p, "/root/") || strings.HasPrefix(p, "/run/user/") {
			protectHome = "read-only"
		}
	}
	w("# --- Sandbox ---")
	w("NoNewPrivileges=yes")
	w("ProtectSystem=strict")
	w("# gpuhost writes the backend units and the drop-ins of adopted units, then daemon-reloads.")
	w("# '-': /run/systemd/system may be absent; that must not stop gpuhost from starting.")
	rw := []string{"/etc/systemd/system", "-/run/systemd/system"}
	for _, p := range d.ReadWritePaths {
		rw = append(rw, escapeSpecifiers(p))
	}
	w("ReadWritePaths=%s", strings.Join(rw, " "))
	if protectHome == "read-only" {
		w("# read-only, not yes: the binary or config lives under a home directory.")
	}
	w("ProtectHome=%s", protectHome)
	w("PrivateTmp=yes")
	w("ProtectKernelTunables=yes")
	w("ProtectKernelModules=yes")
	w("ProtectKernelLogs=yes")
	w("# Read-only /sys/fs/cgroup is enough: gpuhost reads which unit a GPU process belongs to,")
	w("# and systemd (not gpuhost) writes cgroups.")
	w("ProtectControlGroups=yes")
	w("ProtectHostname=yes")
	w("LockPersonality=yes")
	w("RestrictRealtime=yes")
	w("RestrictSUIDSGID=yes")
	w("RestrictNamespaces=yes")
	w("SystemCallArchitectures=native")
	w("# AF_UNIX: D-Bus to systemd, sd_notify, the journal. AF_NETLINK: Go's net package lists")
	w("# interfaces over netlink. AF_INET/AF_INET6: the HTTP front doors and outbound APIs.")
	w("RestrictAddressFamilies=AF_UNIX AF_NETLINK AF_INET AF_INET6")
	w("RemoveIPC=yes")
	w("UMask=0027")
	w("# Root without root's powers: CAP_SYS_PTRACE only, to read GPUHOST_PROFILE from")
	w("# /proc/<pid>/environ of a backend that runs as another user (which profile really runs,")
	w("# not what the environment file says now). Managing units needs none: systemd authorizes")
	w("# the D-Bus caller by its UID.")
	caps := []string{"CAP_SYS_PTRACE"}
	if d.BindPrivilegedPort {
		caps = append(caps, "CAP_NET_BIND_SERVICE")
		w("# CAP_NET_BIND_SERVICE: listen is on a port below 1024.")
	}
	w("CapabilityBoundingSet=%s", strings.Join(caps, " "))
	w("# The Go runtime, D-Bus, HTTP and NVML (ioctl on /dev/nvidia*) are all within")
	w("# @system-service; of the rest, a blocked call fails with EPERM instead of killing gpuhost.")
	w("SystemCallFilter=@system-service")
	w("SystemCallFilter=~@privileged")
	w("SystemCallErrorNumber=EPERM")
}

// daemonNotSet writes the comment on the hardening options deliberately
// left out, and why.
func daemonNotSet(w func(string, ...any)) {
	w("# Deliberately not set:")
	w("#   PrivateDevices=, DevicePolicy=, DeviceAllow=: NVML opens /dev/nvidiactl, /dev/nvidia0 and")
	w("#     /dev/nvidia-uvm.")
	w("#   ProtectClock=: it implies DeviceAllow=char-rtc r, which on systemd before v252")
	w("#     switches on the device allow-list and hides /dev/nvidia*.")
	w("#   ProtectProc=invisible, ProcSubset=pid: gpuhost reads /proc/<pid>/cmdline and environ of")
	w("#     backend processes owned by other users, and NVML reads /proc/driver/nvidia.")
	w("#   MemoryDenyWriteExecute=: not verified against the closed NVIDIA driver library that")
	w("#     NVML loads.")
	w("#   PrivateUsers=: gpuhost must be the host's root towards systemd's D-Bus API and the")
	w("#     unit folder.")
	w("#   PrivateNetwork=, IPAddressDeny=: gpuhost serves HTTP and calls Telegram, Slack and")
	w("#     the backends.")
}

func backendTitle(b Backend) string {
	switch b {
	case VLLM:
		return "vLLM"
	case Ollama:
		return "Ollama"
	}
	return string(b)
}

// execLine joins words for ExecStart=, quoting each as needed.
func execLine(words []string) string {
	q := make([]string, len(words))
	for i, w := range words {
		q[i] = QuoteExecWord(w)
	}
	return strings.Join(q, " ")
}

// QuoteExecWord quotes one word for a systemd ExecStart= line so that it
// reaches the process unchanged: '%' and '$' are doubled (specifier and
// variable expansion apply even inside quotes), and a word with anything
// beyond plain characters is double-quoted with C escapes. SplitExecStart
// is its inverse. A NUL byte cannot be expressed and is dropped.
func QuoteExecWord(w string) string {
	w = strings.ReplaceAll(w, "\x00", "")
	w = strings.ReplaceAll(w, "%", "%%")
	w = strings.ReplaceAll(w, "$", "$$")
	if w != "" && strings.IndexFunc(w, func(r rune) bool { return !plainRune(r) && r != '%' && r != '$' }) < 0 {
		return w
	}
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(w); {
		r, size := utf8.DecodeRuneInString(w[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, w[i])
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			b.WriteString(w[i : i+size])
		}
		i += size
	}
	b.WriteByte('"')
	return b.String()
}

// SplitExecStart splits an ExecStart= value (as read by ParseUnitFile) into
// the argv systemd would execute, so `gpuhost doctor` can hand an adopted
// unit's command line to ParseVLLMArgv. It strips the executable prefixes
// (@ - : + !), drops the argv[0] override that '@' introduces, unquotes
// '…' and "…", decodes C escapes, and turns %% and $$ into % and $. Other
// %-specifiers and $VAR references are left as written: they are resolved
// only by systemd. It fails on an unterminated quote, a bad escape, a NUL,
// or a second command after a lone ';'.
func SplitExecStart(value string) ([]string, error) {
	if strings.ContainsRune(value, 0) {
		return nil, fmt.Errorf("splitting ExecStart %q: contains a NUL byte", value)
	}
	var words []string
	s := value
	for {
		s = strings.TrimLeft(s, " \t\r\n")
		if s == "" {
			break
		}
		if s[0] == ';' && (len(s) == 1 || strings.ContainsRune(" \t\r\n", rune(s[1]))) {
			return words, fmt.Errorf("splitting ExecStart %q: more than one command (lone ';'), which gpuhost does not read", value)
		}
		word, rest, err := nextExecWord(s)
		if err != nil {
			return words, fmt.Errorf("splitting ExecStart %q: %w", value, err)
		}
		words = append(words, word)
		s = rest
	}
	if len(words) == 0 {
		return nil, fmt.Errorf("splitting ExecStart %q: no command", value)
	}
	first := words[0]
	argv0Override := false
	for first != "" && strings.ContainsRune("@-:+!", rune(first[0])) {
		if first[0] == '@' {
			argv0Override = true
		}
		first = first[1:]
	}
	if first == "" {
		return nil, fmt.Errorf("splitting ExecStart %q: no program after the prefixes", value)
	}
	words[0] = first
	if argv0Override && len(words) > 1 {
		words = append(words[:1], words[2:]...)
	}
	for i, w := range words {
		words[i] = strings.ReplaceAll(strings.ReplaceAll(w, "%%", "%"), "$$", "$")
	}
	return words, nil
}

// nextExecWord reads one word from s (which starts with a non-blank).
func nextExecWord(s string) (word, rest string, err error) {
	var b strings.Builder
	var quote byte
	i := 0
	for i < len(s) {
		c := s[i]
		switch {
		case quote == 0 && (c == ' ' || c == '\t' || c == '\r' || c == '\n'):
			return b.String(), s[i:], nil
		case quote == 0 && (c == '"' || c == '\''):
			quote = c
			i++
		case quote != 0 && c == quote:
			quote = 0
			i++
		case c == '\\':
			r, n, err := cunescapeOne(s[i+1:])
			if err != nil {
				return "", "", err
			}
			b.WriteString(r)
			i += 1 + n
		default:
			b.WriteByte(c)
			i++
		}
	}
	if quote != 0 {
		return "", "", fmt.Errorf("unterminated %c quote", quote)
	}
	return b.String(), "", nil
}

// cunescapeOne decodes the escape after a backslash (as systemd's cunescape
// does) and returns the text and the number of bytes consumed.
func cunescapeOne(s string) (string, int, error) {
	if s == "" {
		return "", 0, errors.New("backslash at end of line")
	}
	simple := map[byte]string{'a': "\a", 'b': "\b", 'f': "\f", 'n': "\n", 'r': "\r", 't': "\t",
		'v': "\v", '\\': "\\", '"': "\"", '\'': "'", 's': " ", ';': ";"}
	if r, ok := simple[s[0]]; ok {
		return r, 1, nil
	}
	hexDigits := func(n int) (uint64, error) {
		if len(s) < 1+n {
			return 0, fmt.Errorf("short \\%c escape", s[0])
		}
		v, err := strconv.ParseUint(s[1:1+n], 16, 32)
		if err != nil {
			return 0, fmt.Errorf("bad \\%c escape %q", s[0], s[:1+n])
		}
		return v, nil
	}
	switch c := s[0]; {
	case c == 'x':
		v, err := hexDigits(2)
		if err != nil {
			return "", 0, err
		}
		if v == 0 {
			return "", 0, errors.New("\\x00 (NUL) is not allowed")
		}
		return string([]byte{byte(v)}), 3, nil
	case c == 'u' || c == 'U':
		n := 4
		if c == 'U' {
			n = 8
		}
		v, err := hexDigits(n)
		if err != nil {
			return "", 0, err
		}
		if v == 0 || v > unicode.MaxRune || !utf8.ValidRune(rune(v)) {
			return "", 0, fmt.Errorf("bad \\%c escape %q", c, s[:1+n])
		}
		return string(rune(v)), 1 + n, nil
	case c >= '0' && c <= '7':
		if len(s) < 3 {
			return "", 0, errors.New("short octal escape")
		}
		v, err := strconv.ParseUint(s[:3], 8, 16)
		if err != nil || v == 0 || v > 255 {
			return "", 0, fmt.Errorf("bad octal escape \\%s", s[:3])
		}
		return string([]byte{byte(v)}), 3, nil
	default:
		return "", 0, fmt.Errorf("unknown escape \\%c", c)
	}
}

// escapeSpecifiers doubles '%' so systemd does not expand specifiers in a
// free-text or path setting.
func escapeSpecifiers(s string) string { return strings.ReplaceAll(s, "%", "%%") }

// unitText rejects what cannot appear in an ExecStart word at all.
func unitText(s string) error {
	if !utf8.ValidString(s) {
		return errors.New("not valid UTF-8")
	}
	if strings.ContainsRune(s, 0) {
		return errors.New("contains a NUL byte")
	}
	return nil
}

// listPath checks a path for a space-separated path list such as
// ReadWritePaths=: absolute, clean, one line, no whitespace, quotes or
// backslashes (the list splits at whitespace and unquotes).
func listPath(p string) error {
	if err := unitLine(p); err != nil {
		return fmt.Errorf("%q: %w", p, err)
	}
	if !filepath.IsAbs(p) || filepath.Clean(p) != p {
		return fmt.Errorf("%q must be a clean absolute path", p)
	}
	if strings.ContainsFunc(p, func(r rune) bool { return unicode.IsSpace(r) || strings.ContainsRune(`"'\`, r) }) {
		return fmt.Errorf("%q must not contain whitespace, quotes or backslashes", p)
	}
	return nil
}

// unitLine rejects what would break a one-line unit file setting.
func unitLine(s string) error {
	if err := unitText(s); err != nil {
		return err
	}
	if strings.ContainsFunc(s, unicode.IsControl) {
		return errors.New("contains a control character (e.g. a newline)")
	}
	if strings.HasSuffix(s, `\`) {
		return errors.New("ends in a backslash, which would continue the line")
	}
	return nil
}

// ValidUnitName follows systemd's unit_name_is_valid closely enough for the
// names gpuhost writes: [A-Za-z0-9:_.\@-], at most 255 bytes, with a suffix.
func ValidUnitName(n string) error {
	if n == "" {
		return errors.New("unit name must not be empty")
	}
	if len(n) > 255 {
		return fmt.Errorf("unit name %q is longer than 255 bytes", n)
	}
	dot := strings.LastIndexByte(n, '.')
	if dot <= 0 || dot == len(n)-1 {
		return fmt.Errorf("unit name %q needs a type suffix such as .service", n)
	}
	for _, r := range n {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune(":_.\\@-", r)) {
			return fmt.Errorf("unit name %q contains %q", n, r)
		}
	}
	return nil
}

// ValidServiceName is ValidUnitName for a plain (not templated) .service
// unit, the only kind gpuhost renders or adopts as a backend.
func ValidServiceName(n string) error {
	if err := ValidUnitName(n); err != nil {
		return err
	}
	if !strings.HasSuffix(n, ".service") {
		return fmt.Errorf("unit name %q must end in .service", n)
	}
	if strings.HasSuffix(n, "@.service") {
		return fmt.Errorf("unit name %q is a template; name an instance or a plain unit", n)
	}
	return nil
}

// ValidUser accepts what useradd accepts by default (NAME_REGEX
// ^[a-z_][a-z0-9_-]*[$]?$, at most 32 bytes, without the trailing '$' of
// machine accounts) and numeric UIDs, which systemd's User= also takes.
func ValidUser(u string) error {
	if u == "" {
		return errors.New("user must not be empty")
	}
	if len(u) > 32 {
		return fmt.Errorf("user %q is longer than 32 bytes", u)
	}
	if strings.Trim(u, "0123456789") == "" {
		if _, err := strconv.ParseUint(u, 10, 32); err != nil || u == "4294967295" || u == "65535" {
			return fmt.Errorf("user %q is not a valid UID", u)
		}
		return nil
	}
	for i, r := range u {
		if !(r >= 'a' && r <= 'z' || r == '_' || i > 0 && (r >= '0' && r <= '9' || r == '-')) {
			return fmt.Errorf("user %q is not a valid user name (useradd: lower-case letters, digits, '_' and '-', not starting with a digit or '-'); it contains %q", u, r)
		}
	}
	return nil
}
