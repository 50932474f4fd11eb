// Package packaging holds the Debian package's nfpm configuration and
// maintainer scripts (built by `make deb`) and their test.
package packaging

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// requireEnv, when "1", turns every reason to skip into a failure (CI).
const requireEnv = "GPUHOST_REQUIRE_DEB"

func skipOrFail(t *testing.T, reason string) {
	t.Helper()
	if os.Getenv(requireEnv) == "1" {
		t.Fatalf("%s=1 but: %s", requireEnv, reason)
	}
	t.Skipf("SKIP (set %s=1 to make this a failure): %s", requireEnv, reason)
}

// throwAwayRoot runs in a private mount namespace: an overlay whose lower
// layer is the host's / and whose upper layer is a tmpfs, so everything
// dpkg and the maintainer scripts write vanishes with the namespace and the
// host's files, users and dpkg database are never touched. /run is a
// private tmpfs with /run/systemd/system (so the scripts talk to
// "systemd"), and systemctl is a stub that records its arguments: no
// manager sees the units; the file-based verbs (preset, enable, mask, ...)
// go to the real systemctl with --root=/, which only edits files in the
// throw-away root. A container's policy-rc.d (which would veto every
// stop) is removed there. After each step it copies what the test checks
// into $2/<step>/.
const throwAwayRoot = `set -eu
t=$1 out=$2 deb=$3
mount -t tmpfs tmpfs "$t"
mkdir "$t/u" "$t/w" "$t/m"
mount -t overlay overlay -o "lowerdir=/,upperdir=$t/u,workdir=$t/w" "$t/m"
r=$t/m
mount -t proc proc "$r/proc"
mount --bind /dev "$r/dev"
mount -t tmpfs tmpfs "$r/run"
mount -t tmpfs tmpfs "$r/tmp"
mkdir -p "$r/run/systemd/system"
cp "$deb" "$r/tmp/gpuhost.deb"
rm -f "$r/usr/sbin/policy-rc.d"
real=$(readlink -f "$r/usr/bin/systemctl")
cp "$real" "$r/usr/bin/systemctl.real"
rm -f "$r/usr/bin/systemctl" "$r/bin/systemctl"
cat > "$r/usr/bin/systemctl" <<'STUB'
#!/bin/sh
echo "$*" >> /tmp/systemctl.log
for a in "$@"; do
	case "$a" in
	preset|enable|disable|reenable|is-enabled|mask|unmask|--version) exec /usr/bin/systemctl.real --root=/ "$@" ;;
	is-active) exit 3 ;;
	esac
done
exit 0
STUB
chmod 0755 "$r/usr/bin/systemctl"
: > "$r/tmp/systemctl.log"
snap() {
	mkdir -p "$out/$1"
	for p in /usr/bin/gpuhost /etc/gpuhost/gpuhost.yaml /etc/gpuhost/api-token /var/lib/gpuhost /var/lib/gpuhost/state.json \
		/var/lib/gpuhost-backend /usr/lib/systemd/system/gpuhost.service \
		/etc/systemd/system/multi-user.target.wants/gpuhost.service /etc/systemd/system/gpuhost.service \
		/etc/systemd/system/gpuhost-vllm.service /etc/systemd/system/gpuhost-vllm-proxy-8000.socket \
		/etc/systemd/system/gpuhost-ollama-proxy-11434.service /etc/systemd/system/other.service; do
		if [ -L "$r$p" ]; then echo "$p link $(readlink "$r$p")"; elif [ -e "$r$p" ]; then echo "$p exists"; else echo "$p missing"; fi
	done > "$out/$1/paths"
	chroot "$r" getent passwd gpuhost-backend > "$out/$1/passwd" || true
	chroot "$r" dpkg-query -W -f '${db:Status-Status}\n' gpuhost > "$out/$1/status" 2>/dev/null || true
	cp "$r/tmp/systemctl.log" "$out/$1/systemctl.log"
	: > "$r/tmp/systemctl.log"
}
chroot "$r" dpkg -i /tmp/gpuhost.deb > "$out/install.log" 2>&1
snap install
# An operator's edit, then the same package again (an upgrade to dpkg).
echo '# edited by the operator' >> "$r/etc/gpuhost/gpuhost.yaml"
chroot "$r" dpkg -i /tmp/gpuhost.deb > "$out/upgrade.log" 2>&1
snap upgrade
cp "$r/etc/gpuhost/gpuhost.yaml" "$out/upgrade/gpuhost.yaml"
mkdir -p "$out/install/render" "$out/install/packaged"
chroot "$r" /usr/bin/gpuhost units render --binary /usr/bin/gpuhost --dir /tmp/render
cp "$r"/tmp/render/* "$out/install/render/"
cp "$r"/usr/lib/systemd/system/gpuhost* "$out/install/packaged/"
# What ` + "`gpuhost units install`" + ` leaves, a state file, an operator's own unit and token.
chroot "$r" /usr/bin/gpuhost units render --binary /usr/bin/gpuhost --dir /etc/systemd/system
echo '{}' > "$r/var/lib/gpuhost/state.json"
echo secret > "$r/etc/gpuhost/api-token"
printf '[Service]\nExecStart=/bin/true\n' > "$r/etc/systemd/system/other.service"
chroot "$r" dpkg -r gpuhost > "$out/remove.log" 2>&1
snap remove
chroot "$r" dpkg -P gpuhost > "$out/purge.log" 2>&1
snap purge
`

// shared holds the package both tests use, built once per test binary
// (a cgo build takes minutes on a loaded 2-core machine).
var shared struct {
	once sync.Once
	dir  string // DEB_DIR of the build, removed by TestMain
	deb  string
	err  error
}

// sharedVersion is the shared build's version; the installed-box journey
// upgrades from it to a newer one.
const sharedVersion = "0.0.0+test1"

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.dir != "" {
		os.RemoveAll(filepath.Dir(shared.dir))
	}
	os.Exit(code)
}

// builtDeb runs `make deb` once (version sharedVersion) and returns the
// package and its DEB_DIR, which holds the packaged binary as gpuhost.
func builtDeb(t *testing.T, ctx context.Context) (deb, dir string) {
	t.Helper()
	shared.once.Do(func() {
		tmp, err := os.MkdirTemp("", "gpuhost-deb-")
		if err != nil {
			shared.err = err
			return
		}
		shared.dir = filepath.Join(tmp, "deb")
		shared.deb, shared.err = makeDeb(ctx, shared.dir, sharedVersion)
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.deb, shared.dir
}

// makeDeb runs `make deb` with the version (and further make variables)
// into dir and returns the package.
func makeDeb(ctx context.Context, dir, version string, vars ...string) (string, error) {
	root, err := filepath.Abs("..")
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "make", append([]string{"deb", "DEB_DIR=" + dir, "DEB_VERSION=" + version}, vars...)...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("make deb DEB_VERSION=%s: %w\n%s", version, err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(dir, "gpuhost_*.deb"))
	if len(debs) != 1 {
		return "", fmt.Errorf("make deb left %d packages in %s, want 1", len(debs), dir)
	}
	return debs[0], nil
}

// TestDebPackage builds the package with `make deb`, checks it with
// dpkg-deb and lintian (no errors, no warnings beyond the overrides), and
// installs, upgrades (the same package again), removes and purges it in a
// throw-away root (see throwAwayRoot).
func TestDebPackage(t *testing.T) {
	if os.Getuid() != 0 {
		skipOrFail(t, "needs root (a mount namespace with an overlay root)")
	}
	for _, tool := range []string{"make", "gcc", "dpkg", "dpkg-deb", "lintian", "unshare", "chroot", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			skipOrFail(t, tool+" not found (apt-get install lintian dpkg-dev util-linux)")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	deb, debDir := builtDeb(t, ctx)

	// Control data and contents.
	if got := strings.TrimSpace(run("dpkg-deb", "--info", deb, "conffiles")); got != "/etc/gpuhost/gpuhost.yaml" {
		t.Errorf("conffiles = %q, want /etc/gpuhost/gpuhost.yaml", got)
	}
	info := run("dpkg-deb", "--info", deb)
	for _, w := range []string{"Package: gpuhost", "Depends: libc6, systemd, passwd", " postinst ", " prerm ", " postrm "} {
		if !strings.Contains(info, w) {
			t.Errorf("dpkg-deb --info lacks %q:\n%s", w, info)
		}
	}
	contents := run("dpkg-deb", "--contents", deb)
	for _, w := range []string{"-rwxr-xr-x root/root", "./usr/bin/gpuhost\n", "-rw-r----- root/root", "./etc/gpuhost/gpuhost.yaml\n",
		"./usr/share/doc/gpuhost/copyright\n", "./usr/share/lintian/overrides/gpuhost\n"} {
		if !strings.Contains(contents, w) {
			t.Errorf("dpkg-deb --contents lacks %q:\n%s", w, contents)
		}
	}
	renderDir := filepath.Join(dir, "rendered")
	rendered := renderedUnits(t, ctx, filepath.Join(debDir, "gpuhost"), renderDir)
	checkPackagedUnits(t, ctx, deb, filepath.Join(dir, "extracted"), renderDir, rendered)

	// lintian: errors and warnings fail (the accepted ones are overridden
	// in packaging/lintian-overrides); info tags are listed.
	lint := exec.CommandContext(ctx, "lintian", "--fail-on", "error,warning", "--info", deb)
	lout, err := lint.CombinedOutput()
	if err != nil {
		t.Errorf("lintian: %v\n%s", err, lout)
	}
	t.Logf("lintian:\n%s", lout)

	// Install, render, remove, purge in a throw-away root.
	out := filepath.Join(dir, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	ns := filepath.Join(dir, "ns")
	if err := os.Mkdir(ns, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "unshare", "--mount", "--propagation", "private", "sh", "-c", throwAwayRoot, "sh", ns, out, deb)
	if o, err := cmd.CombinedOutput(); err != nil {
		logs := ""
		for _, f := range []string{"install.log", "remove.log", "purge.log"} {
			b, _ := os.ReadFile(filepath.Join(out, f))
			logs += "\n--- " + f + "\n" + string(b)
		}
		t.Fatalf("throw-away root: %v\n%s%s", err, o, logs)
	}
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(out, p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}

	// `gpuhost units render` on the installed config gives the packaged units.
	installed, _ := os.ReadDir(filepath.Join(out, "install", "packaged"))
	if len(installed) != len(rendered) {
		t.Errorf("installed %d gpuhost units, the renderer writes %d: %v", len(installed), len(rendered), rendered)
	}
	for _, u := range rendered {
		if r, p := read("install/render/"+u), read("install/packaged/"+u); r != p {
			t.Errorf("%s: `gpuhost units render` of the installed config differs from the packaged unit", u)
		}
	}

	want := map[string][]string{
		"upgrade": {"/usr/bin/gpuhost exists", "/etc/systemd/system/multi-user.target.wants/gpuhost.service link "},
		"install": {"/usr/bin/gpuhost exists", "/etc/gpuhost/gpuhost.yaml exists", "/var/lib/gpuhost exists",
			"/var/lib/gpuhost-backend exists", "/usr/lib/systemd/system/gpuhost.service exists",
			// /lib or /usr/lib (the same folder on merged-/usr systems).
			"/etc/systemd/system/multi-user.target.wants/gpuhost.service link ",
			"/etc/systemd/system/gpuhost.service missing"},
		"remove": {"/usr/bin/gpuhost missing", "/etc/gpuhost/gpuhost.yaml exists", "/etc/gpuhost/api-token exists",
			"/var/lib/gpuhost/state.json exists", "/var/lib/gpuhost-backend exists",
			"/usr/lib/systemd/system/gpuhost.service missing",
			"/etc/systemd/system/gpuhost.service link /dev/null", "/etc/systemd/system/gpuhost-vllm.service missing",
			"/etc/systemd/system/gpuhost-vllm-proxy-8000.socket missing", "/etc/systemd/system/gpuhost-ollama-proxy-11434.service missing",
			"/etc/systemd/system/other.service exists"},
		"purge": {"/etc/gpuhost/gpuhost.yaml missing", "/etc/gpuhost/api-token missing", "/var/lib/gpuhost missing",
			"/var/lib/gpuhost-backend exists", "/etc/systemd/system/multi-user.target.wants/gpuhost.service missing",
			"/etc/systemd/system/gpuhost.service missing", "/etc/systemd/system/other.service exists"},
	}
	for step, lines := range want {
		paths := read(step + "/paths")
		for _, l := range lines {
			// A want ending in a space is a line prefix, the others whole lines.
			if !strings.Contains(paths, l+"\n") && !(strings.HasSuffix(l, " ") && strings.Contains(paths, l)) {
				t.Errorf("after %s: want %q; have:\n%s", step, l, paths)
			}
		}
		// The backend user stays through purge (Debian keeps system users).
		if pw := read(step + "/passwd"); !strings.HasPrefix(pw, "gpuhost-backend:") || !strings.Contains(pw, ":/var/lib/gpuhost-backend:/usr/sbin/nologin") {
			t.Errorf("after %s: backend user = %q", step, pw)
		}
	}
	// An upgrade keeps the operator's config and restarts only a running gpuhost.
	if c := read("upgrade/gpuhost.yaml"); !strings.HasSuffix(c, "# edited by the operator\n") {
		t.Errorf("upgrade lost the operator's edit of the conffile")
	}
	if up := read("upgrade/systemctl.log"); !strings.Contains(up, "try-restart gpuhost.service") || !strings.Contains(up, "daemon-reload") {
		t.Errorf("upgrade: want a daemon-reload and a try-restart of gpuhost; systemctl calls:\n%s", up)
	}
	if s := strings.TrimSpace(read("install/status")); s != "installed" {
		t.Errorf("after install: dpkg status %q", s)
	}
	if s := strings.TrimSpace(read("remove/status")); s != "config-files" {
		t.Errorf("after remove: dpkg status %q", s)
	}
	if s := strings.TrimSpace(read("purge/status")); s != "not-installed" && s != "" {
		t.Errorf("after purge: dpkg status %q", s)
	}

	// systemctl: install daemon-reloads and starts nothing; remove stops
	// gpuhost and both backends and daemon-reloads.
	inst := read("install/systemctl.log")
	if !strings.Contains(inst, "daemon-reload") {
		t.Errorf("install did not daemon-reload; systemctl calls:\n%s", inst)
	}
	for _, l := range strings.Split(inst, "\n") {
		for _, f := range strings.Fields(l) {
			if f == "start" || f == "restart" || f == "try-restart" || f == "enable" && strings.Contains(l, "--now") {
				t.Errorf("install started something: systemctl %s", l)
			}
		}
	}
	checkRemoveStops(t, read("remove/systemctl.log"), rendered)
	if bytes.Contains([]byte(read("install.log")), []byte("warning")) {
		t.Logf("dpkg -i warned:\n%s", read("install.log"))
	}
}

// renderedUnits runs the packaged binary's `gpuhost units render --example`
// (what `make deb` stages) into dir and returns the file names it wrote:
// the list the package must hold, taken from the renderer so that the two
// cannot drift apart.
func renderedUnits(t *testing.T, ctx context.Context, bin, dir string) []string {
	t.Helper()
	cmd := exec.CommandContext(ctx, bin, "units", "render", "--example", "--binary", "/usr/bin/gpuhost",
		"--config", "/etc/gpuhost/gpuhost.yaml", "--dir", dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("units render --example: %v\n%s", err, out)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	// The daemon, two backends, and a socket and relay per backend.
	if len(names) < 7 || !slices.Contains(names, "gpuhost.service") {
		t.Fatalf("units render --example wrote %v; want gpuhost.service, the backends and their relays", names)
	}
	return names
}

// checkPackagedUnits extracts deb into dir and checks that its systemd unit
// folder holds exactly the units rendered into renderDir, byte for byte,
// mode 0644.
func checkPackagedUnits(t *testing.T, ctx context.Context, deb, dir, renderDir string, rendered []string) {
	t.Helper()
	if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", deb, dir).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -x: %v\n%s", err, out)
	}
	unitDir := filepath.Join(dir, "usr", "lib", "systemd", "system")
	entries, err := os.ReadDir(unitDir)
	if err != nil {
		t.Fatalf("the package has no /usr/lib/systemd/system: %v", err)
	}
	var packaged []string
	for _, e := range entries {
		packaged = append(packaged, e.Name())
		if info, err := e.Info(); err != nil || info.Mode() != 0o644 {
			t.Errorf("packaged %s: mode %v, want 0644 (%v)", e.Name(), info.Mode(), err)
		}
	}
	if !slices.Equal(packaged, rendered) {
		t.Fatalf("packaged units %v, rendered %v: the package must hold exactly what `gpuhost units render --example` writes", packaged, rendered)
	}
	for _, u := range rendered {
		p, _ := os.ReadFile(filepath.Join(unitDir, u))
		r, _ := os.ReadFile(filepath.Join(renderDir, u))
		if !bytes.Equal(p, r) {
			t.Errorf("packaged %s differs from the rendered one", u)
		}
	}
}

// checkRemoveStops: removal stops gpuhost first and then every other
// packaged unit (backends, relays, sockets), and daemon-reloads.
func checkRemoveStops(t *testing.T, log string, rendered []string) {
	t.Helper()
	var stops [][]string
	for _, l := range strings.Split(log, "\n") {
		f := strings.Fields(l)
		if i := slices.Index(f, "stop"); i >= 0 {
			stops = append(stops, f[i+1:])
		}
	}
	var rest []string
	for _, u := range rendered {
		if u != "gpuhost.service" {
			rest = append(rest, u)
		}
	}
	var second []string
	if len(stops) == 2 {
		second = slices.Sorted(slices.Values(stops[1]))
	}
	if len(stops) != 2 || !slices.Equal(stops[0], []string{"gpuhost.service"}) || !slices.Equal(second, rest) ||
		!strings.Contains(log, "daemon-reload") {
		t.Errorf("remove: want a stop of gpuhost.service, then of %v, and a daemon-reload; systemctl calls:\n%s", rest, log)
	}
}
