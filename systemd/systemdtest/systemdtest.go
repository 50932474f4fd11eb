// Package systemdtest boots a real, private systemd for tests: the machine's
// own /lib/systemd/systemd as PID 1 of a fresh PID + mount (+ UTS + IPC)
// namespace, with its own /run, /tmp, /var/tmp and unit folder.
//
// Tests of gpuhost's unit control want the real thing (job results,
// Conflicts=, D-Bus signals, the journal) rather than a mock, but must never
// act on the host. The harness therefore protects the host in layers, each of
// which would be enough against the mistake seen once on this project (a
// nested systemd whose systemd-tmpfiles-setup emptied the host's /tmp):
//
//   - private tmpfs on /run, /tmp and /var/tmp, mounted in a namespace whose
//     mounts are all private (checked before anything is mounted), and the
//     test's unit folder bound over /etc/systemd/system;
//   - empty sysinit.target and basic.target, and every unit that boot would
//     pull in (everything under the vendor *.wants/ and *.requires/ folders,
//     tmpfiles, udev, sysctl, remount-fs, binfmt, modules-load, sysusers,
//     firstboot, the shutdown services, ...) masked; system generators masked;
//   - /proc/sys, /sys, /dev and /etc/machine-id read-only inside (device
//     nodes still work; /dev/shm is a private tmpfs); on cgroup v1 and
//     hybrid hosts a private tmpfs at /sys/fs/cgroup (systemd remounts that
//     tmpfs read-only and adds mount points to it, which on the host's own
//     tmpfs would change the host); /dev/console and /dev/kmsg replaced by a
//     log file in the test's temp dir (Log reads it);
//   - the capabilities that reach the shared kernel (modules, clock, raw I/O,
//     network admin, syslog, audit, ...) dropped from the bounding set;
//   - its own cgroup (a fresh leaf below the test process's cgroup), so two
//     harnesses running at once never share unit cgroups, removed on Stop;
//   - a canary file in the host's /tmp, checked on Stop: a failing canary
//     fails the test loudly.
//
// journald runs inside (volatile, in the private /run; no /dev/log), so
// journalctl works for processes that run inside. PID 1 logs to the console
// file (Log) until journald is up and to the journal from then on, as on a
// real machine: UnitEvents reads its job and state messages from there.
//
// If the test binary is killed before its cleanup runs, unshare dies with it
// (PR_SET_PDEATHSIG) and takes the namespace along (--kill-child); the empty
// cgroup and the canary it leaves are swept by the next Start.
//
// The private D-Bus socket (/run/systemd/private) drops peers whose PID it
// cannot see, so every D-Bus client must run inside: use Command (nsenter),
// Systemctl, or RunTest, which re-executes the current test binary inside.
package systemdtest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	// RequireEnv, when set to "1", turns every reason to skip (not root, no
	// systemd, no util-linux tools, no writable cgroup) into a test failure.
	// CI sets it so that the systemd tests can never silently not run.
	RequireEnv = "GPUHOST_REQUIRE_SYSTEMD"

	// InsideEnv is set to "1" in the environment of a test binary that
	// RunTest re-executed inside the namespace. The inside half of a test
	// skips unless Inside reports true.
	InsideEnv = "GPUHOST_SYSTEMDTEST_INSIDE"

	// Target is the empty unit the private systemd boots into. It only wants
	// journald's sockets.
	Target = "gpuhost-test.target"

	// systemdBinary is the manager that is booted. /lib is /usr/lib on merged
	// /usr systems; both spellings work.
	systemdBinary = "/lib/systemd/systemd"

	privateSocket = "/run/systemd/private"

	// bootTimeout bounds the wait for the private manager to finish its
	// initial transaction: 1.5–5 s usually, but 20 s were exceeded on a
	// loaded 2-core machine with the tests running under nice beside a
	// CPU hog. It only bounds a boot that hangs.
	bootTimeout = 90 * time.Second

	// stopTimeout bounds the wait for the namespace to disappear after
	// SIGKILL.
	stopTimeout = 10 * time.Second
)

// requiredTools are the programs the harness runs on the host.
var requiredTools = []string{"unshare", "nsenter", "setpriv", "findmnt", "mount", "umount", "sh", "systemctl"}

// droppedCaps leave the bounding set before systemd is exec'd, so neither
// systemd nor any unit can reach the parts of the kernel the namespaces do
// not isolate: modules, the clock, raw I/O, network configuration (the
// network namespace is shared), the kernel log, audit, suspend.
var droppedCaps = []string{
	"sys_module", "sys_time", "sys_rawio", "net_admin", "syslog", "wake_alarm",
	"block_suspend", "sys_pacct", "audit_control", "audit_read", "mac_admin",
	"mac_override", "sys_tty_config",
}

// vendorUnitDirs are the unit folders systemd reads besides /etc (which the
// harness replaces) and /run (which is private).
var vendorUnitDirs = []string{"/usr/local/lib/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system"}

// maskedPatterns name units (globs on the file name in vendorUnitDirs) that
// act on the host's files or the shared kernel when started; they are masked
// in addition to everything under *.wants/, *.requires/ and *.upholds/.
var maskedPatterns = []string{
	"systemd-tmpfiles-*", "systemd-udev*", "systemd-remount-fs.service",
	"systemd-sysctl.service", "systemd-journald-audit.socket", "systemd-journald-dev-log.socket",
	"systemd-journal-flush.service",
	"systemd-binfmt.service", "proc-sys-fs-binfmt_misc.*", "systemd-modules-load.service",
	"systemd-sysusers.service", "systemd-firstboot.service", "systemd-machine-id-commit.service",
	"systemd-random-seed.service", "systemd-hwdb-update.service", "ldconfig.service",
	"systemd-timesyncd.service", "systemd-networkd*", "systemd-resolved.service",
	"systemd-hostnamed.*", "systemd-timedated.*", "systemd-localed.*", "systemd-logind.service",
	"systemd-update-utmp*", "systemd-boot-*", "systemd-pcr*", "systemd-repart.service",
	"systemd-growfs*", "systemd-fsck*", "systemd-quotacheck.service", "quotaon.service",
	"systemd-pstore.service", "systemd-backlight@.service", "systemd-rfkill.*",
	"systemd-hibernate*", "systemd-suspend*", "systemd-hybrid-sleep.service",
	"systemd-poweroff.service", "systemd-reboot.service", "systemd-halt.service",
	"systemd-kexec.service", "systemd-soft-reboot.service", "dbus.service", "dbus.socket",
	"dbus-broker.service", "getty*", "serial-getty@.service", "console-getty.service",
	"container-getty@.service", "cryptsetup*", "veritysetup*", "integritysetup*",
	"dev-hugepages.mount", "dev-mqueue.mount", "sys-kernel-*.mount", "sys-fs-fuse-connections.mount",
}

// keptUnits are the units the harness runs inside although boot would mask
// them: journald, so that journalctl works inside.
// systemd-journald-dev-log.socket stays masked: its Symlinks=/dev/log would
// create the symlink in the host's /dev. Units' stdout and sd_journal reach
// journald through systemd-journald.socket; syslog(3) inside is lost.
var keptUnits = []string{"systemd-journald.service", "systemd-journald.socket"}

// Options describe what the private systemd sees.
type Options struct {
	// Units are unit files (file name → content) written into the unit
	// folder before boot. They override the harness's masks of the same name.
	Units map[string]string

	// Keep lists extra host folders that must be visible inside at the same
	// path. Folders outside /tmp and /var/tmp are visible anyway; folders
	// under them are hidden by the private tmpfs and bound back. The folder
	// of the test binary, the test's temp-dir root, the working directory
	// and its module root are always kept.
	// Folders under /run cannot be kept.
	Keep []string

	// NetAdmin keeps CAP_NET_ADMIN in the bounding set. A unit with
	// PrivateNetwork=yes needs it: systemd brings up loopback in the unit's
	// new network namespace, and without it that namespace has no working
	// 127.0.0.1. The private systemd shares the host's network namespace,
	// so only tests whose units are all the test's own should set it.
	NetAdmin bool
}

// Systemd is one running private systemd.
type Systemd struct {
	// PID is systemd's PID on the host (PID 1 inside the namespace).
	PID int
	// UnitDir is the host folder bound over /etc/systemd/system inside.
	UnitDir string

	t        testing.TB
	logPath  string
	canary   string
	cgroups  []cgroupDir
	cmd      *exec.Cmd
	exited   chan struct{} // closed when unshare has exited
	stopOnce sync.Once
}

// Inside reports whether this test binary is the inside half started by
// RunTest.
func Inside() bool { return os.Getenv(InsideEnv) == "1" }

// Start boots a private systemd and registers its Stop with t.Cleanup. It
// skips t (loudly) when the machine cannot run one, or fails t instead when
// GPUHOST_REQUIRE_SYSTEMD=1. It returns once the manager has finished its
// initial transaction.
func Start(t testing.TB, opts Options) *Systemd {
	t.Helper()
	if reason := unavailable(); reason != "" {
		skipOrFail(t, reason)
	}
	begin := time.Now()

	dir := t.TempDir()
	s := &Systemd{
		t:       t,
		UnitDir: filepath.Join(dir, "units"),
		logPath: filepath.Join(dir, "systemd.log"),
		exited:  make(chan struct{}),
	}
	s.prepareDir(opts.Units)
	keep := hostKeeps(t, dir, opts.Keep)
	s.plantCanary()
	// From here on Stop cleans up whatever exists (it copes with a harness
	// that never started).
	t.Cleanup(s.Stop)

	var err error
	s.cgroups, err = createCgroup()
	if err != nil {
		skipOrFail(t, err.Error())
	}
	s.startUnshare(keep, opts.NetAdmin)

	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	socketAt, err := s.waitBoot(ctx)
	if err != nil {
		t.Fatalf("systemdtest: private systemd did not boot: %v\n--- systemd log ---\n%s", err, s.Log())
	}
	t.Logf("systemdtest: private systemd PID %d booted in %v (D-Bus socket after %v; units in %s)", s.PID,
		time.Since(begin).Round(time.Millisecond), socketAt.Sub(begin).Round(time.Millisecond), s.UnitDir)
	return s
}

// prepareDir creates the unit folder with the base units and units, and
// the log file.
func (s *Systemd) prepareDir(units map[string]string) {
	t := s.t
	t.Helper()
	if err := os.Mkdir(s.UnitDir, 0o755); err != nil {
		t.Fatalf("systemdtest: create unit folder: %v", err)
	}
	if err := s.writeBaseUnits(units); err != nil {
		t.Fatalf("systemdtest: %v", err)
	}
	// The log file is bound over /dev/console and /dev/kmsg inside, so it
	// must exist before boot.
	if err := os.WriteFile(s.logPath, nil, 0o644); err != nil {
		t.Fatalf("systemdtest: create log file: %v", err)
	}
}

// hostKeeps lists the host folders to bind back inside: defaultKeeps for
// the test binary, the temp dir dir and the working directory, and extra.
func hostKeeps(t testing.TB, dir string, extra []string) []string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("systemdtest: find the test binary: %v", err)
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatalf("systemdtest: find the working directory: %v", err)
	}
	keep, err := keepDirs(append(defaultKeeps(exe, dir, wd), extra...))
	if err != nil {
		t.Fatalf("systemdtest: %v", err)
	}
	return keep
}

// plantCanary sweeps the canaries of dead runs and writes this run's into
// the host's /tmp (Stop checks it is still there).
func (s *Systemd) plantCanary() {
	t := s.t
	t.Helper()
	sweepStaleCanaries()
	canary, err := os.CreateTemp("/tmp", fmt.Sprintf("%s%d-*", canaryPrefix, os.Getpid()))
	if err != nil {
		t.Fatalf("systemdtest: create the host /tmp canary: %v", err)
	}
	s.canary = canary.Name()
	_, werr := canary.WriteString("if this file vanished, a private systemd touched the host's /tmp\n")
	if cerr := canary.Close(); werr != nil || cerr != nil {
		_ = os.Remove(s.canary)
		t.Fatalf("systemdtest: write the host /tmp canary %s: %v", s.canary, errors.Join(werr, cerr))
	}
}

// startUnshare starts the boot script in fresh namespaces, in s.cgroups,
// with keep bound back inside, its output going to the log file; s.exited
// closes when it exits.
func (s *Systemd) startUnshare(keep []string, netAdmin bool) {
	t := s.t
	t.Helper()
	args := []string{
		"--pid", "--fork", "--kill-child=SIGKILL", "--mount", "--mount-proc",
		"--propagation", "private", "--uts", "--ipc",
		"sh", "-c", bootScript, "gpuhost-systemdtest-boot",
	}
	args = append(args, keep...)
	s.cmd = exec.Command("unshare", args...)
	drop := droppedCaps
	if netAdmin {
		drop = slices.DeleteFunc(slices.Clone(drop), func(c string) bool { return c == "net_admin" })
	}
	procs := make([]string, 0, len(s.cgroups))
	for _, cg := range s.cgroups {
		procs = append(procs, filepath.Join(cg.path, "cgroup.procs"))
	}
	s.cmd.Env = []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"GPUHOST_UNIT_DIR=" + s.UnitDir,
		"GPUHOST_LOG=" + s.logPath,
		"GPUHOST_CGROUP_PROCS=" + strings.Join(procs, " "),
		"GPUHOST_DROP_CAPS=" + "-" + strings.Join(drop, ",-"),
		"GPUHOST_SYSTEMD=" + systemdBinary,
		"GPUHOST_TARGET=" + Target,
	}
	logFile, err := os.OpenFile(s.logPath, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatalf("systemdtest: open log file: %v", err)
	}
	s.cmd.Stdout = logFile
	s.cmd.Stderr = logFile
	// If the test process dies without cleanup, unshare dies with it, and
	// --kill-child takes systemd (and with it the namespace) along.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		logFile.Close()
		s.cmd = nil
		t.Fatalf("systemdtest: start unshare: %v", err)
	}
	logFile.Close()
	go func() {
		_ = s.cmd.Wait()
		close(s.exited)
	}()
}

// unavailable says why this machine cannot run the harness, or "".
func unavailable() string {
	if os.Geteuid() != 0 {
		return "not running as root (namespaces, mounts and cgroups need root)"
	}
	if fi, err := os.Stat(systemdBinary); err != nil || fi.Mode()&0o111 == 0 {
		return fmt.Sprintf("%s is missing or not executable", systemdBinary)
	}
	for _, tool := range requiredTools {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Sprintf("%s not found in PATH (util-linux and systemctl are needed)", tool)
		}
	}
	// systemd would write a fresh /etc/machine-id on the host if the file
	// were missing or empty; refuse rather than allow that.
	id, err := os.ReadFile("/etc/machine-id")
	if err != nil || !machineIDPattern.Match(bytes.TrimSpace(id)) {
		return "/etc/machine-id is missing or invalid (systemd would write one on the host)"
	}
	return ""
}

var machineIDPattern = regexp.MustCompile(`^[0-9a-f]{32}$`)

func skipOrFail(t testing.TB, reason string) {
	t.Helper()
	msg := "!!! SYSTEMD HARNESS UNAVAILABLE — the private-systemd tests DID NOT RUN: " + reason
	if os.Getenv(RequireEnv) == "1" {
		t.Fatal(msg + " (" + RequireEnv + "=1 makes this a failure)")
	}
	t.Skip(msg + " (set " + RequireEnv + "=1 to make this a failure)")
}

// writeBaseUnits writes the empty boot targets, the masks and the caller's
// units into the unit folder.
func (s *Systemd) writeBaseUnits(units map[string]string) error {
	for _, name := range maskedUnitNames() {
		if err := os.Symlink("/dev/null", filepath.Join(s.UnitDir, name)); err != nil {
			return fmt.Errorf("mask %s: %w", name, err)
		}
	}
	base := map[string]string{
		Target: "[Unit]\nDescription=gpuhost test target (private systemd)\n" +
			"Wants=systemd-journald.socket\n",
		"sysinit.target": "[Unit]\nDescription=System Initialization (empty in the gpuhost test harness)\nDefaultDependencies=no\n",
		"basic.target":   "[Unit]\nDescription=Basic System (empty in the gpuhost test harness)\nDefaultDependencies=no\n",
	}
	for name, content := range base {
		if err := s.WriteUnit(name, content); err != nil {
			return err
		}
	}
	names := make([]string, 0, len(units))
	for name := range units {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if err := s.WriteUnit(name, units[name]); err != nil {
			return err
		}
	}
	return nil
}

// maskedUnitNames lists the unit names to mask, from the vendor unit folders
// of this machine.
func maskedUnitNames() []string {
	set := map[string]bool{}
	for _, dir := range vendorUnitDirs {
		for _, pattern := range []string{"*.wants/*", "*.requires/*", "*.upholds/*"} {
			matches, _ := filepath.Glob(filepath.Join(dir, pattern))
			for _, m := range matches {
				set[filepath.Base(m)] = true
			}
		}
		for _, pattern := range maskedPatterns {
			matches, _ := filepath.Glob(filepath.Join(dir, pattern))
			for _, m := range matches {
				set[filepath.Base(m)] = true
			}
		}
	}
	for _, name := range keptUnits {
		delete(set, name)
	}
	for _, name := range []string{Target, "sysinit.target", "basic.target"} {
		delete(set, name)
	}
	names := make([]string, 0, len(set))
	for name := range set {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// defaultKeeps lists the folders every harness keeps visible inside: the
// test binary's folder, the root of the test's temp dirs, the working
// directory (the package folder under go test: RunTest's inside half runs
// there and reads its testdata) and the module root above it (the files of
// other packages). A checkout under /tmp would otherwise be hidden by the
// private /tmp. A working directory the private mounts cannot keep (/, /tmp
// itself, anything under /run) is left out: commands inside then run in /.
func defaultKeeps(exe, tempDir, wd string) []string {
	keep := []string{filepath.Dir(exe), filepath.Dir(tempDir)}
	for _, d := range []string{wd, moduleRoot(wd)} {
		if d == "" || d == "/" || d == "/tmp" || d == "/var/tmp" || d == "/run" || isUnder(d, "/run") {
			continue
		}
		keep = append(keep, d)
	}
	return keep
}

// moduleRoot returns the nearest folder at or above dir that holds a go.mod,
// or "".
func moduleRoot(dir string) string {
	if dir == "" {
		return ""
	}
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		if fi, err := os.Stat(filepath.Join(d, "go.mod")); err == nil && fi.Mode().IsRegular() {
			return d
		}
		if d == filepath.Dir(d) {
			return ""
		}
	}
}

// keepDirs resolves the folders to keep and returns those that the private
// tmpfs would hide (under /tmp or /var/tmp), parents before children, with
// children of kept folders dropped (they are visible through the parent).
func keepDirs(dirs []string) ([]string, error) {
	var hidden []string
	for _, d := range dirs {
		if d == "" {
			continue
		}
		abs, err := filepath.Abs(d)
		if err != nil {
			return nil, fmt.Errorf("keep %q: %w", d, err)
		}
		real, err := filepath.EvalSymlinks(abs)
		if err != nil {
			return nil, fmt.Errorf("keep %q: %w", d, err)
		}
		fi, err := os.Stat(real)
		if err != nil {
			return nil, fmt.Errorf("keep %q: %w", d, err)
		}
		if !fi.IsDir() {
			return nil, fmt.Errorf("keep %q: not a folder", d)
		}
		switch {
		case real == "/" || real == "/tmp" || real == "/var/tmp" || real == "/run":
			return nil, fmt.Errorf("keep %q: refusing to expose all of %s to the private systemd", d, real)
		case isUnder(real, "/run"):
			return nil, fmt.Errorf("keep %q: folders under /run cannot be kept (the private /run replaces it)", d)
		case isUnder(real, "/tmp") || isUnder(real, "/var/tmp"):
			hidden = append(hidden, real)
		}
	}
	sort.Slice(hidden, func(i, j int) bool { return len(hidden[i]) < len(hidden[j]) })
	var out []string
	for _, d := range hidden {
		covered := slices.ContainsFunc(out, func(p string) bool { return d == p || isUnder(d, p) })
		if !covered {
			out = append(out, d)
		}
	}
	return out, nil
}

func isUnder(p, dir string) bool { return strings.HasPrefix(p, dir+"/") }

// bootScript runs as PID 1 of the new namespaces, before systemd. Each step
// fails the boot (set -e) rather than continue with the host exposed.
// Arguments: the folders to keep visible under /tmp and /var/tmp.
const bootScript = `set -eu
fail() { echo "gpuhost-systemdtest boot: $*" >&2; exit 1; }
# mount -n: the first mounts run while /run is still the host's, where
# mount(8) would otherwise keep its utab.
# Nothing mounted below may propagate to the host.
if grep -q ' shared:' /proc/self/mountinfo; then fail "a mount is still shared with the host"; fi
for f in $GPUHOST_CGROUP_PROCS; do echo $$ > "$f" || fail "cannot join cgroup $f"; done
mount -n -t tmpfs -o mode=0755,nosuid,nodev,size=256m gpuhost-test-run /run
mkdir -p /run/gpuhost-test/keep
i=0
for d in "$@"; do
	mkdir "/run/gpuhost-test/keep/$i"
	mount -n --bind "$d" "/run/gpuhost-test/keep/$i"
	i=$((i+1))
done
mount -n -t tmpfs -o mode=1777,nosuid,nodev,size=1g gpuhost-test-tmp /tmp
mount -n -t tmpfs -o mode=1777,nosuid,nodev,size=256m gpuhost-test-vartmp /var/tmp
[ "$(findmnt -n -o SOURCE --mountpoint /tmp | tail -n 1)" = gpuhost-test-tmp ] || fail "/tmp is not the private tmpfs"
[ "$(findmnt -n -o SOURCE --mountpoint /var/tmp | tail -n 1)" = gpuhost-test-vartmp ] || fail "/var/tmp is not the private tmpfs"
i=0
for d in "$@"; do
	mkdir -p "$d"
	mount -n --bind "/run/gpuhost-test/keep/$i" "$d"
	umount -n "/run/gpuhost-test/keep/$i"
	rmdir "/run/gpuhost-test/keep/$i"
	i=$((i+1))
done
mount -n --bind "$GPUHOST_UNIT_DIR" /etc/systemd/system
mount -n --bind "$GPUHOST_LOG" /dev/console
mount -n --bind "$GPUHOST_LOG" /dev/kmsg
# /dev is the host's devtmpfs: nothing inside may add entries to it (socket
# units' Symlinks=, such as journald's /dev/log, would). Device nodes stay
# usable on a read-only mount; /dev/shm gets a private tmpfs.
mount -n -t tmpfs -o mode=1777,nosuid,nodev,size=256m gpuhost-test-shm /dev/shm
mount -n -o remount,bind,ro /dev
mount -n --bind /etc/machine-id /etc/machine-id
mount -n -o remount,bind,ro /etc/machine-id
mount -n --bind /proc/sys /proc/sys
mount -n -o remount,bind,ro /proc/sys
# On cgroup v1/hybrid hosts /sys/fs/cgroup is a tmpfs holding the hierarchies.
# systemd creates mount points and symlinks in it and then remounts its
# superblock read-only, which a bind mount would share with the host: give the
# namespace a tmpfs of its own with the host's hierarchies moved into it.
if [ "$(findmnt -n -o FSTYPE --mountpoint /sys/fs/cgroup | tail -n 1)" = tmpfs ]; then
	mkdir /run/gpuhost-test/cgroup
	for m in $(findmnt -n -r -o TARGET -R /sys/fs/cgroup | tail -n +2); do
		n=${m#/sys/fs/cgroup/}
		case $n in */*) continue ;; esac
		mkdir "/run/gpuhost-test/cgroup/$n"
		mount -n --rbind "$m" "/run/gpuhost-test/cgroup/$n"
	done
	mount -n -t tmpfs -o mode=0755,nosuid,nodev,noexec,size=4m gpuhost-test-cgroup /sys/fs/cgroup
	for d in /run/gpuhost-test/cgroup/*; do
		[ -d "$d" ] || continue
		mkdir "/sys/fs/cgroup/${d##*/}"
		mount -n --move "$d" "/sys/fs/cgroup/${d##*/}"
		rmdir "$d"
	done
	rmdir /run/gpuhost-test/cgroup
	[ "$(findmnt -n -o SOURCE --mountpoint /sys/fs/cgroup | tail -n 1)" = gpuhost-test-cgroup ] || fail "/sys/fs/cgroup is not the private tmpfs"
fi
mount -n -o remount,bind,ro /sys
mkdir -p /run/systemd/system-generators /run/systemd/journald.conf.d /run/systemd/system.conf.d
for g in /usr/local/lib/systemd/system-generators/* /usr/lib/systemd/system-generators/* /lib/systemd/system-generators/*; do
	if [ -e "$g" ]; then ln -sf /dev/null "/run/systemd/system-generators/${g##*/}"; fi
done
printf '[Journal]\nStorage=volatile\nReadKMsg=no\nForwardToKMsg=no\nForwardToConsole=no\nForwardToWall=no\nForwardToSyslog=no\n' >/run/systemd/journald.conf.d/gpuhost-test.conf
printf '[Manager]\nShowStatus=no\nDefaultCPUAccounting=no\nDefaultIOAccounting=no\nDefaultIPAccounting=no\nDefaultBlockIOAccounting=no\nDefaultMemoryAccounting=no\nDefaultTasksAccounting=no\n' >/run/systemd/system.conf.d/gpuhost-test.conf
exec setpriv --bounding-set "$GPUHOST_DROP_CAPS" \
	env -i container=gpuhost-test PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
	"$GPUHOST_SYSTEMD" --system --unit="$GPUHOST_TARGET" --log-target=journal-or-kmsg --log-color=no --show-status=no
`

// waitBoot finds systemd's PID and waits until its initial transaction is
// done. It returns when the private socket appeared.
func (s *Systemd) waitBoot(ctx context.Context) (time.Time, error) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for s.PID == 0 {
		pid, err := childOf(s.cmd.Process.Pid)
		if err != nil {
			return time.Time{}, err
		}
		s.PID = pid
		if pid != 0 {
			break
		}
		select {
		case <-s.exited:
			return time.Time{}, errors.New("unshare exited before systemd started")
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("no child of unshare (PID %d) appeared: %w", s.cmd.Process.Pid, ctx.Err())
		case <-tick.C:
		}
	}
	// Until the boot script has exec'd systemd, the namespace's /run may
	// still be the host's (with the host manager's socket in it on a
	// systemd host), so look for the socket only once PID 1 is systemd.
	comm := fmt.Sprintf("/proc/%d/comm", s.PID)
	var socketAt time.Time
	for {
		if c, err := os.ReadFile(comm); err == nil && strings.TrimSpace(string(c)) == "systemd" {
			if _, err := os.Stat(s.HostPath(privateSocket)); err == nil {
				socketAt = time.Now()
				break
			}
		}
		select {
		case <-s.exited:
			return time.Time{}, errors.New("systemd exited during boot")
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("%s did not appear: %w", privateSocket, ctx.Err())
		case <-tick.C:
		}
	}
	out, err := s.Systemctl(ctx, "is-system-running", "--wait")
	state := strings.TrimSpace(out)
	if state == "running" {
		return socketAt, nil
	}
	failed, _ := s.Systemctl(ctx, "list-units", "--failed", "--no-legend", "--plain")
	return time.Time{}, fmt.Errorf("system state %q (%v); failed units:\n%s", state, err, failed)
}

// childOf returns the PID of the (only) child of pid, or 0 if it has none
// yet.
func childOf(pid int) (int, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err == nil {
		fields := strings.Fields(string(data))
		if len(fields) == 0 {
			return 0, nil
		}
		return strconv.Atoi(fields[0])
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("read children of PID %d: %w", pid, err)
	}
	// Kernels without CONFIG_PROC_CHILDREN: scan /proc for the parent.
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, fmt.Errorf("scan /proc for children of PID %d: %w", pid, err)
	}
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, err := parentOf(child); err == nil && ppid == pid {
			return child, nil
		}
	}
	return 0, nil
}

// parentOf reads the parent PID from /proc/<pid>/stat (the field after the
// parenthesised command name, which may itself contain spaces and ')').
func parentOf(pid int) (int, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse /proc/%d/stat: no ')'", pid)
	}
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 2 {
		return 0, fmt.Errorf("parse /proc/%d/stat: too few fields", pid)
	}
	return strconv.Atoi(fields[1])
}

// Command returns a command that runs name inside the namespace (nsenter
// --pid --mount), in the test process's working directory if that is visible
// inside, else in /. cmd.Dir has no effect. Signals to cmd.Process reach
// nsenter, not the program; when nsenter dies the program is killed
// (PR_SET_PDEATHSIG). Use Signal to signal the program itself.
func (s *Systemd) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	wd, err := os.Getwd()
	if err != nil {
		wd = "/"
	}
	full := []string{
		"--target", strconv.Itoa(s.PID), "--pid", "--mount", "--",
		"setpriv", "--pdeathsig", "KILL", "--",
		"sh", "-c", `cd -- "$1" 2>/dev/null || cd /; shift; exec "$@"`, "gpuhost-systemdtest-run", wd, name,
	}
	return exec.CommandContext(ctx, "nsenter", append(full, args...)...)
}

// Signal sends sig to the program that cmd (from Command) runs inside the
// namespace, e.g. SIGTERM to test a graceful shutdown.
func (s *Systemd) Signal(cmd *exec.Cmd, sig syscall.Signal) error {
	if cmd.Process == nil {
		return errors.New("signal: command not started")
	}
	pid, err := childOf(cmd.Process.Pid)
	if err != nil {
		return fmt.Errorf("signal: find the program below nsenter PID %d: %w", cmd.Process.Pid, err)
	}
	if pid == 0 {
		return fmt.Errorf("signal: nsenter PID %d has no child (not started or already exited)", cmd.Process.Pid)
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("signal: send %v to PID %d: %w", sig, pid, err)
	}
	return nil
}

// Systemctl runs systemctl inside with args and returns its combined output.
// Without a deadline in ctx it gives up after 30 s.
func (s *Systemd) Systemctl(ctx context.Context, args ...string) (string, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
	}
	out, err := s.Command(ctx, "systemctl", args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("systemctl %s (inside PID %d): %w: %s", strings.Join(args, " "), s.PID, err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

// WriteUnit writes a unit file into UnitDir (temp file, fsync, rename), which
// replaces a mask of the same name. Call daemon-reload afterwards.
func (s *Systemd) WriteUnit(name, content string) error {
	if name == "" || name != filepath.Base(name) || name == "." || name == ".." || strings.ContainsRune(name, 0) {
		return fmt.Errorf("write unit %q: not a plain file name", name)
	}
	f, err := os.CreateTemp(s.UnitDir, ".tmp-"+name+"-*")
	if err != nil {
		return fmt.Errorf("write unit %s: %w", name, err)
	}
	tmp := f.Name()
	_, err = f.WriteString(content)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp, 0o644)
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(s.UnitDir, name))
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write unit %s into %s: %w", name, s.UnitDir, err)
	}
	return nil
}

// SocketPath is the private D-Bus socket of the manager, as a path inside the
// namespace. Only clients inside can use it.
func (s *Systemd) SocketPath() string { return privateSocket }

// HostPath turns a path inside the namespace into one the host can read
// (through /proc/<PID>/root).
func (s *Systemd) HostPath(p string) string {
	return filepath.Join("/proc", strconv.Itoa(s.PID), "root", path.Clean("/"+p))
}

// Log returns what systemd and journald wrote to their console and kernel log
// (both are a file in the test's temp dir): PID 1's messages until journald
// was up (boot), journald's own, and anything the boot script printed.
func (s *Systemd) Log() string {
	data, err := os.ReadFile(s.logPath)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", s.logPath, err)
	}
	return string(data)
}

// RunTest re-executes the current test binary inside the namespace, running
// only the top-level test named test with InsideEnv=1 and env added, and
// fails t with the child's output unless that test ran and passed. Use it for
// D-Bus clients, which must run inside.
func (s *Systemd) RunTest(t testing.TB, test string, env ...string) {
	t.Helper()
	timeout := 2 * time.Minute
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if deadline, ok := d.Deadline(); ok && time.Until(deadline) < timeout {
			timeout = time.Until(deadline)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("inside test %s: find the test binary: %v", test, err)
	}
	cmd := s.Command(ctx, exe,
		"-test.run=^"+regexp.QuoteMeta(test)+"$", "-test.v=true", "-test.count=1",
		"-test.timeout="+timeout.String())
	// Under go test -cover the parent merges the counter files of every
	// process that wrote into its coverage folder (which is next to the test
	// binary, so kept visible inside): the inside half counts too.
	if f := flag.Lookup("test.gocoverdir"); f != nil && f.Value.String() != "" {
		cmd.Args = append(cmd.Args, "-test.gocoverdir="+f.Value.String())
	}
	cmd.Env = append(append(os.Environ(), InsideEnv+"=1"), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("inside test %s failed: %v\n--- output ---\n%s", test, err, out)
	}
	if !passed(out, test) {
		t.Fatalf("inside test %s did not run and pass (skipped or not found)\n--- output ---\n%s", test, out)
	}
	t.Logf("inside test %s passed:\n%s", test, out)
}

// passed reports whether go test -v output shows test itself passing.
func passed(out []byte, test string) bool {
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "--- PASS: "+test+" (") {
			return true
		}
	}
	return false
}

// Stop kills the namespace (SIGKILL to systemd, PID 1 inside, takes every
// process in it along), removes its cgroup and checks the host /tmp canary.
// It is registered with t.Cleanup by Start; calling it earlier is fine.
func (s *Systemd) Stop() {
	s.stopOnce.Do(func() {
		if s.cmd != nil && s.cmd.Process != nil {
			// Kill systemd and let unshare reap it: unshare's wait returns only
			// once every process of the namespace is gone. Without a systemd
			// PID, killing unshare kills its child (--kill-child).
			if s.PID > 0 {
				_ = syscall.Kill(s.PID, syscall.SIGKILL)
			} else {
				_ = s.cmd.Process.Kill()
			}
			select {
			case <-s.exited:
			case <-time.After(stopTimeout):
				_ = s.cmd.Process.Kill()
				s.t.Errorf("systemdtest: the namespace of PID %d did not end within %v of SIGKILL", s.PID, stopTimeout)
			}
		}
		s.removeCgroups()
		if s.canary != "" {
			if _, err := os.Stat(s.canary); err != nil {
				s.t.Errorf("!!! HOST /tmp WAS TOUCHED: the canary %s vanished while the private systemd ran (%v). "+
					"The harness's isolation failed; check the masks and mounts in systemdtest before running again.", s.canary, err)
			} else if err := os.Remove(s.canary); err != nil {
				s.t.Errorf("systemdtest: remove canary %s: %v", s.canary, err)
			}
		}
	})
}

func (s *Systemd) removeCgroups() {
	for _, err := range removeCgroupTrees(s.cgroups) {
		s.t.Errorf("systemdtest: %v", err)
	}
}

const (
	canaryPrefix = "gpuhost-systemdtest-canary-"
	cgroupPrefix = "gpuhost-test-"
)

// pidGone reports whether the PID in a name like prefix<pid>-... belongs to
// no running process (the test binary that made it was killed before its
// cleanup ran).
func pidGone(name, prefix string) bool {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return false
	}
	digits, _, _ := strings.Cut(rest, "-")
	pid, err := strconv.Atoi(digits)
	if err != nil || pid <= 0 {
		return false
	}
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

// sweepStaleCanaries removes canaries of killed test binaries: nobody is
// left to check them.
func sweepStaleCanaries() {
	matches, _ := filepath.Glob(filepath.Join("/tmp", canaryPrefix+"*"))
	for _, m := range matches {
		if pidGone(filepath.Base(m), canaryPrefix) {
			_ = os.Remove(m)
		}
	}
}

// sweepStaleCgroups removes the (empty) cgroups of harnesses whose test
// binary was killed; their namespaces died with it. Only rmdir is used.
func sweepStaleCgroups(parent string) {
	matches, _ := filepath.Glob(filepath.Join(parent, cgroupPrefix+"*"))
	for _, m := range matches {
		if pidGone(filepath.Base(m), cgroupPrefix) {
			_ = removeTree(m, 0)
		}
	}
}

// cgroupDir is a cgroup folder the harness created and must remove.
type cgroupDir struct {
	path    string // e.g. /sys/fs/cgroup/systemd/gpuhost-test-123-ab12
	created []string
}

// cgroupMount is one mounted cgroup hierarchy.
type cgroupMount struct {
	mountpoint string
	v2         bool
	options    []string // super options of a v1 hierarchy (controllers, name=)
}

// createCgroup makes a fresh cgroup for the private systemd in each hierarchy
// systemd tracks processes in (the unified one on cgroup v2; name=systemd and,
// on hybrid systems, the unified one on v1), below the test process's own.
// systemd roots its tree at the cgroup it starts in, so units of two
// harnesses never share a cgroup, and the host's tree is never touched.
func createCgroup() ([]cgroupDir, error) {
	mounts, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("read /proc/self/cgroup: %w", err)
	}
	paths := parseProcCgroup(own)

	var targets []string
	var base string
	if p, ok := paths["name=systemd"]; ok {
		base = p
		for _, m := range mounts {
			if !m.v2 && slices.Contains(m.options, "name=systemd") {
				targets = append(targets, m.mountpoint)
			}
		}
		if len(targets) == 0 {
			return nil, errors.New("the name=systemd cgroup hierarchy is not mounted")
		}
		for _, m := range mounts {
			if m.v2 {
				targets = append(targets, m.mountpoint)
			}
		}
	} else if p, ok := paths[""]; ok {
		base = p
		for _, m := range mounts {
			if m.v2 {
				targets = append(targets, m.mountpoint)
			}
		}
		if len(targets) == 0 {
			return nil, errors.New("no cgroup v2 hierarchy is mounted")
		}
		targets = targets[:1]
	} else {
		return nil, errors.New("cannot tell this process's cgroup from /proc/self/cgroup")
	}

	suffix := make([]byte, 4)
	if _, err := rand.Read(suffix); err != nil {
		return nil, fmt.Errorf("random cgroup name: %w", err)
	}
	for _, mp := range targets {
		sweepStaleCgroups(filepath.Join(mp, base))
	}
	rel := path.Join(base, fmt.Sprintf("%s%d-%s", cgroupPrefix, os.Getpid(), hex.EncodeToString(suffix)))
	var dirs []cgroupDir
	for _, mp := range targets {
		dir, err := mkdirRecorded(filepath.Join(mp, rel))
		if err != nil {
			removeCgroupTrees(dirs)
			return nil, fmt.Errorf("cannot create a cgroup for the private systemd (read-only cgroupfs?): %w", err)
		}
		dirs = append(dirs, dir)
	}
	return dirs, nil
}

// mkdirRecorded is MkdirAll that remembers which folders it made.
func mkdirRecorded(p string) (cgroupDir, error) {
	dir := cgroupDir{path: p}
	var missing []string
	for q := p; ; q = filepath.Dir(q) {
		if _, err := os.Stat(q); err == nil {
			break
		}
		missing = append(missing, q)
		if q == "/" || q == "." {
			break
		}
	}
	for i := len(missing) - 1; i >= 0; i-- {
		if err := os.Mkdir(missing[i], 0o755); err != nil {
			return dir, err
		}
		dir.created = append(dir.created, missing[i])
	}
	return dir, nil
}

// removeCgroupTrees removes the harness's cgroups bottom-up, in every mounted
// hierarchy (systemd may have used v1 controllers at the same relative path).
// It only ever calls rmdir, which cgroupfs refuses for non-empty cgroups.
func removeCgroupTrees(dirs []cgroupDir) []error {
	var errs []error
	mounts, _ := cgroupMounts()
	for _, d := range dirs {
		var roots []string
		for _, m := range mounts {
			if rel, err := filepath.Rel(m.mountpoint, d.path); err == nil && !strings.HasPrefix(rel, "..") {
				for _, other := range mounts {
					roots = append(roots, filepath.Join(other.mountpoint, rel))
				}
				break
			}
		}
		if len(roots) == 0 {
			roots = []string{d.path}
		}
		slices.Sort(roots)
		roots = slices.Compact(roots)
		for _, root := range roots {
			if err := removeTree(root, 3*time.Second); err != nil {
				errs = append(errs, err)
			}
		}
		for i := len(d.created) - 2; i >= 0; i-- {
			_ = os.Remove(d.created[i]) // parents we made; may be shared, so best effort
		}
	}
	return errs
}

// removeTree rmdirs root and the cgroups below it, deepest first, retrying
// "busy" (processes still exiting) for up to patience.
func removeTree(root string, patience time.Duration) error {
	if _, err := os.Stat(root); err != nil {
		return nil
	}
	var dirs []string
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	deadline := time.Now().Add(patience)
	for i := len(dirs) - 1; i >= 0; i-- {
		for {
			err := syscall.Rmdir(dirs[i])
			if err == nil || errors.Is(err, syscall.ENOENT) {
				break
			}
			if errors.Is(err, syscall.EBUSY) && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			return fmt.Errorf("remove cgroup %s: %w", dirs[i], err)
		}
	}
	return nil
}

// cgroupMounts lists the mounted cgroup hierarchies.
func cgroupMounts() ([]cgroupMount, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read /proc/self/mountinfo: %w", err)
	}
	return parseCgroupMounts(data), nil
}

// parseCgroupMounts picks the cgroup and cgroup2 mounts out of a mountinfo
// file.
func parseCgroupMounts(mountinfo []byte) []cgroupMount {
	var out []cgroupMount
	for _, line := range strings.Split(string(mountinfo), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		left := strings.Fields(pre)
		right := strings.Fields(post)
		if len(left) < 5 || len(right) < 3 {
			continue
		}
		mp := unescapeMountinfo(left[4])
		switch right[0] {
		case "cgroup2":
			out = append(out, cgroupMount{mountpoint: mp, v2: true})
		case "cgroup":
			out = append(out, cgroupMount{mountpoint: mp, options: strings.Split(right[2], ",")})
		}
	}
	return out
}

// unescapeMountinfo undoes the octal escapes (\040 for space, ...) of
// mountinfo paths.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// parseProcCgroup maps each hierarchy of a /proc/<pid>/cgroup file to the
// process's path in it: "" for the unified hierarchy, "name=systemd" for
// systemd's v1 hierarchy, the controller list for the others.
func parseProcCgroup(data []byte) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		out[parts[1]] = parts[2]
	}
	return out
}
