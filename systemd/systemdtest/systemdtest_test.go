package systemdtest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// hostMounts lists the host's mounts with their mount and superblock options
// (a remount of a shared superblock shows in the latter), and the entries of
// the shared folders systemd likes to write to (/sys/fs/cgroup, /dev, /run),
// to prove that the harness changes none of them.
func hostMounts(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 6 {
			out = append(out, unescapeMountinfo(f[4])+" "+f[5]+" "+f[len(f)-1])
		}
	}
	for _, dir := range []string{"/sys/fs/cgroup", "/dev", "/run", "/run/systemd"} {
		entries, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		for _, e := range entries {
			out = append(out, dir+" entry "+e.Name())
		}
	}
	slices.Sort(out)
	return out
}

// oldCanary creates a file that an age-based /tmp cleanup
// (systemd-tmpfiles) would delete: a year old.
func oldCanary(t *testing.T, dir string) string {
	t.Helper()
	f, err := os.CreateTemp(dir, "gpuhost-systemdtest-test-canary-*")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	t.Cleanup(func() { os.Remove(f.Name()) })
	old := time.Now().Add(-365 * 24 * time.Hour)
	if err := os.Chtimes(f.Name(), old, old); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}

func TestHarnessProtectsHost(t *testing.T) {
	tmpCanary := oldCanary(t, "/tmp")
	varTmpCanary := oldCanary(t, "/var/tmp")
	mountsBefore := hostMounts(t)

	shared := t.TempDir()
	if err := os.WriteFile(filepath.Join(shared, "in"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := Start(t, Options{Units: map[string]string{
		// Default dependencies: pulls sysinit.target and basic.target, as a
		// careless harness would let it pull systemd-tmpfiles-setup.
		"writer.service": "[Service]\nType=oneshot\nExecStart=/bin/sh -c 'cp " + shared + "/in " + shared + "/out'\n",
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if _, err := s.Systemctl(ctx, "start", "writer.service"); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(shared, "out")); err != nil || string(got) != "from the host\n" {
		t.Errorf("a unit could not use a kept test folder: %q, %v", got, err)
	}
	for _, unit := range []string{"systemd-tmpfiles-setup.service", "systemd-tmpfiles-clean.timer", "systemd-sysctl.service", "systemd-remount-fs.service"} {
		if _, err := os.Stat(filepath.Join("/lib/systemd/system", unit)); err != nil {
			continue
		}
		out, _ := s.Systemctl(ctx, "is-enabled", unit)
		if strings.TrimSpace(out) != "masked" {
			t.Errorf("%s is %q inside, want masked", unit, strings.TrimSpace(out))
		}
		out, _ = s.Systemctl(ctx, "is-active", unit)
		if strings.TrimSpace(out) != "inactive" {
			t.Errorf("%s is %q inside, want inactive", unit, strings.TrimSpace(out))
		}
		if _, err := s.Systemctl(ctx, "start", unit); err == nil {
			t.Errorf("starting masked %s inside succeeded", unit)
		}
	}

	// The private /tmp is empty of host files; the host's canary stays.
	if _, err := os.Stat(s.HostPath(tmpCanary)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("host canary visible inside at %s (err %v): /tmp is not private", s.HostPath(tmpCanary), err)
	}
	// Writes to the kernel's sysctls and to /sys fail inside.
	if out, err := s.Command(ctx, "sh", "-c", "echo 512 > /proc/sys/net/unix/max_dgram_qlen").CombinedOutput(); err == nil {
		t.Errorf("writing a sysctl inside succeeded: %s", out)
	}
	// systemd lost the capabilities that reach the shared kernel.
	status, err := os.ReadFile("/proc/" + strconv.Itoa(s.PID) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "CapBnd:"); ok {
			bnd, err := strconv.ParseUint(strings.TrimSpace(rest), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			const capSysModule, capSysTime, capNetAdmin = 16, 25, 12
			for _, c := range []uint{capSysModule, capSysTime, capNetAdmin} {
				if bnd&(1<<c) != 0 {
					t.Errorf("systemd's bounding set %x still has capability %d", bnd, c)
				}
			}
		}
	}
	cg, err := os.ReadFile("/proc/" + strconv.Itoa(s.PID) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(cg), "/gpuhost-test-") {
		t.Errorf("systemd is not in its own cgroup:\n%s", cg)
	}
	cgroups := s.cgroups

	pid := s.PID
	s.Stop()
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("systemd PID %d still exists after Stop (kill -0: %v)", pid, err)
	}
	for _, d := range cgroups {
		if _, err := os.Stat(d.path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup %s left behind (%v)", d.path, err)
		}
	}
	for _, c := range []string{tmpCanary, varTmpCanary} {
		if _, err := os.Stat(c); err != nil {
			t.Errorf("!!! host canary %s vanished: %v", c, err)
		}
	}
	if after := hostMounts(t); !reflect.DeepEqual(mountsBefore, after) {
		t.Errorf("host mount table changed:\nbefore %v\nafter  %v", mountsBefore, after)
	}
}

// TestTwoAtOnce: units of the same name in two harnesses live in different
// cgroups, so stopping one leaves the other running.
func TestTwoAtOnce(t *testing.T) {
	unit := map[string]string{"sleeper.service": "[Service]\nExecStart=/bin/sleep 1000\n"}
	a := Start(t, Options{Units: unit})
	b := Start(t, Options{Units: unit})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, s := range []*Systemd{a, b} {
		if _, err := s.Systemctl(ctx, "start", "sleeper.service"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Systemctl(ctx, "stop", "sleeper.service"); err != nil {
		t.Fatal(err)
	}
	if out, _ := b.Systemctl(ctx, "is-active", "sleeper.service"); strings.TrimSpace(out) != "active" {
		t.Errorf("sleeper.service in the second harness is %q after stopping it in the first", strings.TrimSpace(out))
	}
}

// TestRunTest runs TestInsideHarness inside and checks what it sees.
func TestRunTest(t *testing.T) {
	s := Start(t, Options{})
	s.RunTest(t, "TestInsideHarness")
}

func TestInsideHarness(t *testing.T) {
	if !Inside() {
		t.Skip("inside half of TestRunTest")
	}
	comm, err := os.ReadFile("/proc/1/comm")
	if err != nil || strings.TrimSpace(string(comm)) != "systemd" {
		t.Errorf("PID 1 is %q (%v), want systemd", comm, err)
	}
	if _, err := os.Stat(privateSocket); err != nil {
		t.Errorf("private socket: %v", err)
	}
	var st syscall.Statfs_t
	const tmpfsMagic = 0x01021994
	for _, dir := range []string{"/tmp", "/var/tmp", "/run"} {
		if err := syscall.Statfs(dir, &st); err != nil || st.Type != tmpfsMagic {
			t.Errorf("%s is not a tmpfs inside (type %x, %v)", dir, st.Type, err)
		}
	}
	wd, _ := os.Getwd()
	if _, err := os.Stat(filepath.Join(wd, "systemdtest.go")); err != nil {
		t.Errorf("working directory %q is not the package folder: %v", wd, err)
	}
}

// TestRunTestFromTmpCheckout runs the inside half from a working directory
// under /tmp that is neither the test binary's folder nor a temp dir of the
// test, as go test does for a checkout under /tmp: the private /tmp must not
// hide the package folder or its module root.
func TestRunTestFromTmpCheckout(t *testing.T) {
	root, err := os.MkdirTemp("/tmp", "gpuhost-systemdtest-checkout-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	pkg := filepath.Join(root, "pkg", "sub")
	if err := os.MkdirAll(pkg, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "go.mod"), []byte("module checkout\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(pkg)
	s := Start(t, Options{})
	s.RunTest(t, "TestInsideTmpCheckout", "GPUHOST_SYSTEMDTEST_WANT_WD="+pkg, "GPUHOST_SYSTEMDTEST_WANT_MOD="+root)
}

func TestInsideTmpCheckout(t *testing.T) {
	if !Inside() {
		t.Skip("inside half of TestRunTestFromTmpCheckout")
	}
	want := os.Getenv("GPUHOST_SYSTEMDTEST_WANT_WD")
	if wd, err := os.Getwd(); err != nil || wd != want {
		t.Errorf("working directory inside = %q (%v), want %q", wd, err, want)
	}
	mod := filepath.Join(os.Getenv("GPUHOST_SYSTEMDTEST_WANT_MOD"), "go.mod")
	if data, err := os.ReadFile(mod); err != nil || string(data) != "module checkout\n" {
		t.Errorf("module root's go.mod inside: %q, %v", data, err)
	}
}

func TestDefaultKeeps(t *testing.T) {
	root := t.TempDir()
	pkg := filepath.Join(root, "a", "b")
	if err := os.MkdirAll(pkg, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "go.mod"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	noMod := t.TempDir()
	const exe, tmp = "/x/bin/pkg.test", "/y/TestX123/001"
	base := []string{"/x/bin", "/y/TestX123"}
	tests := []struct {
		name string
		wd   string
		want []string
	}{
		{"package folder and module root", pkg, append(slices.Clone(base), pkg, root)},
		{"module root is the working directory", root, append(slices.Clone(base), root, root)},
		{"no go.mod above", noMod, append(slices.Clone(base), noMod)},
		{"root folder left out", "/", base},
		{"all of /tmp left out", "/tmp", base},
		{"under /run left out", "/run/systemd", base},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := defaultKeeps(exe, tmp, tt.wd); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("defaultKeeps(%q) = %q, want %q", tt.wd, got, tt.want)
			}
		})
	}
}

func TestSignal(t *testing.T) {
	s := Start(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := s.Command(ctx, "sh", "-c", "trap 'exit 7' TERM; while :; do sleep 0.05; done")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if pid, _ := childOf(cmd.Process.Pid); pid != 0 {
			// Wait until sh has set its trap (it has exec'd and forked sleep).
			if grand, _ := childOf(pid); grand != 0 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the program below nsenter did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := s.Signal(cmd, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 7 {
		t.Errorf("program exit = %v, want status 7 from its TERM trap", err)
	}
}

func TestKeepDirs(t *testing.T) {
	if os.Getenv("TMPDIR") != "" && !strings.HasPrefix(os.Getenv("TMPDIR"), "/tmp") {
		t.Skip("TMPDIR is outside /tmp")
	}
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	child := filepath.Join(base, "a", "b")
	if err := os.MkdirAll(child, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(base, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// Not the working directory: a checkout may itself lie under /tmp.
	const elsewhere = "/etc"
	tests := []struct {
		name    string
		in      []string
		want    []string
		wantErr string
	}{
		{"child of kept folder dropped", []string{child, base}, []string{base}, ""},
		{"folders outside /tmp need no bind", []string{elsewhere, "", base}, []string{base}, ""},
		{"duplicates once", []string{base, base + "/"}, []string{base}, ""},
		{"all of /tmp refused", []string{"/tmp"}, nil, "refusing"},
		{"root refused", []string{"/"}, nil, "refusing"},
		{"/run refused", []string{"/run/systemd"}, nil, "/run"},
		{"missing folder", []string{filepath.Join(base, "nope")}, nil, "no such file"},
		{"file is not a folder", []string{file}, nil, "not a folder"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := keepDirs(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("keepDirs(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestMaskedUnitNames(t *testing.T) {
	names := maskedUnitNames()
	for _, kept := range append(slices.Clone(keptUnits), Target, "sysinit.target", "basic.target") {
		if slices.Contains(names, kept) {
			t.Errorf("%s is masked", kept)
		}
	}
	for _, unit := range []string{"systemd-tmpfiles-setup.service", "systemd-tmpfiles-clean.timer", "systemd-sysctl.service", "systemd-udevd.service", "systemd-remount-fs.service", "systemd-sysusers.service", "systemd-journald-dev-log.socket"} {
		if _, err := os.Stat(filepath.Join("/lib/systemd/system", unit)); err != nil {
			continue
		}
		if !slices.Contains(names, unit) {
			t.Errorf("%s is not masked", unit)
		}
	}
}

func TestParseCgroupMounts(t *testing.T) {
	info := `25 30 0:22 / /sys rw,nosuid shared:7 - sysfs sysfs rw
33 25 0:28 / /sys/fs/cgroup ro shared:9 - tmpfs tmpfs ro,mode=755
34 33 0:29 / /sys/fs/cgroup/unified rw shared:10 - cgroup2 cgroup2 rw,nsdelegate
35 33 0:30 / /sys/fs/cgroup/systemd rw shared:11 - cgroup cgroup rw,xattr,name=systemd
36 33 0:31 / /sys/fs/cgroup/cpu,cpuacct rw shared:12 - cgroup cgroup rw,cpu,cpuacct
37 33 0:32 / /sys/fs/cgroup/odd\040name rw - cgroup cgroup rw,pids
garbage line
`
	got := parseCgroupMounts([]byte(info))
	want := []cgroupMount{
		{mountpoint: "/sys/fs/cgroup/unified", v2: true},
		{mountpoint: "/sys/fs/cgroup/systemd", options: []string{"rw", "xattr", "name=systemd"}},
		{mountpoint: "/sys/fs/cgroup/cpu,cpuacct", options: []string{"rw", "cpu", "cpuacct"}},
		{mountpoint: "/sys/fs/cgroup/odd name", options: []string{"rw", "pids"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseCgroupMounts =\n%+v\nwant\n%+v", got, want)
	}
}

func TestParseProcCgroup(t *testing.T) {
	tests := []struct {
		in   string
		want map[string]string
	}{
		{"0::/system.slice/runner.service\n", map[string]string{"": "/system.slice/runner.service"}},
		{"9:name=systemd:/\n4:memory:/a/b\n0::/\n", map[string]string{"name=systemd": "/", "memory": "/a/b", "": "/"}},
		{"1:name=systemd:/with:colon\n", map[string]string{"name=systemd": "/with:colon"}},
		{"junk\n\n", map[string]string{}},
	}
	for _, tt := range tests {
		if got := parseProcCgroup([]byte(tt.in)); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("parseProcCgroup(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestUnescapeMountinfo(t *testing.T) {
	tests := map[string]string{
		`/plain`:          "/plain",
		`/a\040b`:         "/a b",
		`/tab\011x\134y`:  "/tab\tx\\y",
		`/short\04`:       `/short\04`,
		`/not\999octal`:   `/not\999octal`,
		`/trailing\`:      `/trailing\`,
		`\040\040`:        "  ",
		`/mixed\040\x41`:  `/mixed \x41`,
		`/utf8\303\251e`:  "/utf8\u00e9e",
		`/back\134\040sp`: `/back\ sp`,
	}
	for in, want := range tests {
		if got := unescapeMountinfo(in); got != want {
			t.Errorf("unescapeMountinfo(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPassed(t *testing.T) {
	tests := []struct {
		out  string
		want bool
	}{
		{"=== RUN   TestX\n--- PASS: TestX (0.00s)\nPASS\n", true},
		{"=== RUN   TestX\n--- SKIP: TestX (0.00s)\nPASS\n", false},
		{"testing: warning: no tests to run\nPASS\n", false},
		{"--- PASS: TestXY (0.00s)\n", false},
		{"    --- PASS: TestX (0.00s)\n", true},
		{"--- FAIL: TestX (0.00s)\n", false},
	}
	for _, tt := range tests {
		if got := passed([]byte(tt.out), "TestX"); got != tt.want {
			t.Errorf("passed(%q) = %v, want %v", tt.out, got, tt.want)
		}
	}
}

func FuzzParseCgroupMounts(f *testing.F) {
	f.Add([]byte("34 33 0:29 / /sys/fs/cgroup/unified rw shared:10 - cgroup2 cgroup2 rw\n"))
	f.Add([]byte("35 33 0:30 / /sys/fs/cgroup/a\\040b rw - cgroup cgroup rw,name=systemd\n"))
	f.Add([]byte(" - cgroup\n - - - \n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, m := range parseCgroupMounts(data) {
			if m.v2 && m.options != nil {
				t.Errorf("v2 mount with v1 options: %+v", m)
			}
		}
	})
}

func FuzzParseProcCgroup(f *testing.F) {
	f.Add([]byte("9:name=systemd:/\n0::/x\n"))
	f.Add([]byte("::::\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		for k, v := range parseProcCgroup(data) {
			if strings.Contains(k, "\n") || strings.Contains(v, "\n") {
				t.Errorf("newline in parsed entry %q: %q", k, v)
			}
		}
	})
}

func FuzzUnescapeMountinfo(f *testing.F) {
	f.Add(`/a\040b`)
	f.Add(`\`)
	f.Add(`\0`)
	f.Fuzz(func(t *testing.T, s string) {
		got := unescapeMountinfo(s)
		if len(got) > len(s) {
			t.Errorf("unescaping %q grew it to %q", s, got)
		}
		if !strings.Contains(s, `\`) && got != s {
			t.Errorf("unescaping %q without escapes changed it to %q", s, got)
		}
	})
}

func TestPidGone(t *testing.T) {
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	deadPID := dead.Process.Pid
	own := os.Getpid()
	tests := []struct {
		name string
		want bool
	}{
		{canaryPrefix + strconv.Itoa(deadPID) + "-123", true},
		{canaryPrefix + strconv.Itoa(own) + "-123", false},
		{canaryPrefix + "notapid-1", false},
		{canaryPrefix + "0-1", false},
		{canaryPrefix + "-5", false},
		{"other-" + strconv.Itoa(deadPID), false},
	}
	for _, tt := range tests {
		if got := pidGone(tt.name, canaryPrefix); got != tt.want {
			t.Errorf("pidGone(%q) = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestSweepStaleCanaries(t *testing.T) {
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join("/tmp", canaryPrefix+strconv.Itoa(dead.Process.Pid)+"-test")
	live := filepath.Join("/tmp", canaryPrefix+strconv.Itoa(os.Getpid())+"-test")
	for _, f := range []string{stale, live} {
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(f) })
	}
	sweepStaleCanaries()
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale canary %s kept (%v)", stale, err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("live canary %s removed: %v", live, err)
	}
}
