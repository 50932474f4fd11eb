package packaging

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gpuhost/config"
	"gpuhost/internal/atomicfile"
	"gpuhost/internal/testkit"
)

// requireBoxEnv, when "1", turns every reason to skip the installed-box
// journey (not root, no mmdebstrap or systemd-nspawn, no cached root and no
// way to the Debian mirror) into a failure (CI).
const requireBoxEnv = "GPUHOST_REQUIRE_INSTALLED_BOX"

// The throw-away Debian root: a minimal bookworm whose PID 1 is systemd.
// curl is there for the operator's requests to /v1; libc6, systemd and
// passwd (the package's Depends) come with it, so apt installs the local
// .deb without a network.
var (
	boxSuite    = "bookworm"
	boxVariant  = "minbase"
	boxPackages = []string{"systemd", "dbus", "systemd-sysv", "curl"}
)

// boxMirror is where mmdebstrap fetches from (its default); it is only
// needed while the root is not cached.
const boxMirrorHost = "deb.debian.org:80"

func skipOrFailBox(t *testing.T, reason string) {
	t.Helper()
	msg := "!!! INSTALLED-BOX JOURNEY DID NOT RUN: " + reason
	if os.Getenv(requireBoxEnv) == "1" {
		t.Fatal(msg + " (" + requireBoxEnv + "=1 makes this a failure)")
	}
	t.Skip(msg + " (set " + requireBoxEnv + "=1 to make this a failure)")
}

// boxRootTarball returns the cached root tarball, building it with
// mmdebstrap first when it is missing. The cache (under ~/.cache/gpuhost,
// or $XDG_CACHE_HOME/gpuhost) is keyed by suite, variant, package list and
// architecture, so a changed list builds a new root.
func boxRootTarball(t *testing.T, ctx context.Context) string {
	t.Helper()
	cache, err := os.UserCacheDir()
	if err != nil {
		skipOrFailBox(t, "no cache folder: "+err.Error())
	}
	key := sha256.Sum256([]byte(strings.Join(append([]string{boxSuite, boxVariant, runtime.GOARCH}, boxPackages...), "\n")))
	tarball := filepath.Join(cache, "gpuhost", "installed-box", boxSuite+"-"+hex.EncodeToString(key[:6])+".tar")
	if _, err := os.Stat(tarball); err == nil {
		t.Logf("Debian root: cached %s", tarball)
		return tarball
	}
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		skipOrFailBox(t, "no cached root ("+tarball+") and mmdebstrap not found (apt-get install mmdebstrap)")
	}
	conn, err := net.DialTimeout("tcp", boxMirrorHost, 10*time.Second)
	if err != nil {
		skipOrFailBox(t, "no cached root ("+tarball+") and no way to the Debian mirror "+boxMirrorHost+": "+err.Error())
	}
	conn.Close()
	if err := os.MkdirAll(filepath.Dir(tarball), 0o755); err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	tmp := tarball + ".tmp-" + strconv.Itoa(os.Getpid()) + ".tar"
	defer os.Remove(tmp)
	cmd := exec.CommandContext(ctx, "mmdebstrap", "--variant="+boxVariant, "--include="+strings.Join(boxPackages, ","), boxSuite, tmp)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mmdebstrap: %v\n%s", err, out)
	}
	if err := os.Rename(tmp, tarball); err != nil {
		t.Fatal(err)
	}
	t.Logf("Debian root: built %s with mmdebstrap in %v", tarball, time.Since(begin).Round(time.Second))
	return tarball
}

// box is a Debian root booted with systemd-nspawn: systemd is its PID 1,
// with its own PID, mount, IPC, UTS and network namespaces. The host's
// PID 1 need not be systemd: --register=no --keep-unit leave machined and
// the host manager out, and nspawn's /run/systemd/nspawn is a tmpfs in a
// private mount namespace (a tmpfs over /run there), so nothing of the
// host changes. --private-network gives the container (and so its
// manager) CAP_NET_ADMIN in a network of its own, which the backend units'
// PrivateNetwork=yes needs to bring their loopback up.
type box struct {
	t    *testing.T
	root string
	log  string // nspawn's and the container's console output

	mu     sync.Mutex
	nspawn *exec.Cmd
	exited chan struct{}
	pid1   int
}

// bootScript runs in a private mount namespace. On a cgroup v1 or hybrid
// host it also gives nspawn a /sys/fs/cgroup of its own (a tmpfs there)
// with every hierarchy this process is in mounted: nspawn mounts them again
// inside the container's cgroup namespace, where the kernel refuses to
// create a hierarchy, and one that is not mounted anywhere (the private
// systemd of another test may have just let go of perf_event or net_cls)
// would fail the boot ("Failed to mount cgroup ... Operation not
// permitted"). Mounted here, in the first cgroup namespace, each exists
// while nspawn runs; the host's mounts are untouched.
const bootScript = `set -eu
mount -t tmpfs -o mode=0755 tmpfs /run
if [ "$(stat -f -c %T /sys/fs/cgroup)" = tmpfs ]; then
	mount -t tmpfs -o mode=0755 tmpfs /sys/fs/cgroup
	while IFS=: read -r id ctrl path; do
		case "$id:$ctrl" in
		0:) d=unified; mkdir "/sys/fs/cgroup/$d"; mount -t cgroup2 cgroup2 "/sys/fs/cgroup/$d" ;;
		*:name=*) d=${ctrl#name=}; mkdir "/sys/fs/cgroup/$d"; mount -t cgroup -o "none,$ctrl" cgroup "/sys/fs/cgroup/$d" ;;
		*) mkdir "/sys/fs/cgroup/$ctrl"; mount -t cgroup -o "$ctrl" cgroup "/sys/fs/cgroup/$ctrl"
			for c in $(echo "$ctrl" | tr , ' '); do [ "$c" = "$ctrl" ] || ln -s "$ctrl" "/sys/fs/cgroup/$c"; done ;;
		esac
	done < /proc/self/cgroup
fi
exec systemd-nspawn -q -D "$1" --boot --register=no --keep-unit --private-network --console=passive`

// boot starts the container and returns once its manager has finished
// booting (is-system-running: running), or fails the test.
func (b *box) boot(ctx context.Context) {
	b.t.Helper()
	logf, err := os.OpenFile(b.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		b.t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", bootScript, "sh", b.root)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		b.t.Fatalf("start systemd-nspawn: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	b.mu.Lock()
	b.nspawn, b.exited, b.pid1 = cmd, exited, 0
	b.mu.Unlock()
	var pid1 int
	if !testkit.Poll(30*time.Second, func() bool { pid1 = containerPID1(cmd.Process.Pid); return pid1 > 0 }) {
		b.t.Fatalf("systemd-nspawn started no PID 1 within 30s:\n%s", b.console())
	}
	b.mu.Lock()
	b.pid1 = pid1
	b.mu.Unlock()
	var state string
	ok := testkit.Poll(90*time.Second, func() bool {
		out, _ := b.sh(ctx, "systemctl is-system-running --wait")
		state = strings.TrimSpace(out)
		return state == "running" || state == "degraded"
	})
	if !ok || state != "running" {
		failed, _ := b.sh(ctx, "systemctl --failed --no-legend")
		b.t.Fatalf("the container's systemd is %q, want running; failed units:\n%s\nconsole:\n%s", state, failed, b.console())
	}
}

// containerPID1 returns the container's PID 1 as the host sees it: the
// child of nspawn that is PID 1 of its own PID namespace and has become
// systemd (nspawn's short-lived outer child and the inner one before its
// exec are not), or 0.
func containerPID1(nspawn int) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		status, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		var name, ppid, nspid string
		for _, l := range strings.Split(string(status), "\n") {
			k, v, _ := strings.Cut(l, ":")
			switch k {
			case "Name":
				name = strings.TrimSpace(v)
			case "PPid":
				ppid = strings.TrimSpace(v)
			case "NSpid":
				nspid = strings.TrimSpace(v)
			}
		}
		if ppid == strconv.Itoa(nspawn) && name == "systemd" && strings.HasSuffix(nspid, "\t1") {
			return n
		}
	}
	return 0
}

// sh runs a shell command inside the container (all its namespaces, its
// root), as an operator on the box types it, and returns its output.
func (b *box) sh(ctx context.Context, script string) (string, error) {
	return b.shIn(ctx, "", script)
}

// shIn is sh with stdin.
func (b *box) shIn(ctx context.Context, stdin, script string) (string, error) {
	b.mu.Lock()
	pid1 := b.pid1
	b.mu.Unlock()
	if pid1 == 0 {
		return "", errors.New("the container is not running")
	}
	cmd := exec.CommandContext(ctx, "nsenter", "-t", strconv.Itoa(pid1), "-a", "--",
		"/usr/bin/env", "-i", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"DEBIAN_FRONTEND=noninteractive", "HOME=/root", "LANG=C.UTF-8", "/bin/sh", "-c", script)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("in the box: %s: %w", script, err)
	}
	return string(out), nil
}

// must is sh that fails the test on an error.
func (b *box) must(ctx context.Context, script string) string {
	b.t.Helper()
	out, err := b.sh(ctx, script)
	if err != nil {
		b.t.Fatalf("%v\n%s", err, out)
	}
	return out
}

// poweroff asks the container's systemd to power off and waits for nspawn
// to end; past the budget it kills nspawn (and so the container).
func (b *box) poweroff(budget time.Duration) error {
	b.mu.Lock()
	cmd, exited := b.nspawn, b.exited
	b.mu.Unlock()
	if cmd == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = b.sh(ctx, "systemctl poweroff --no-block")
	var err error
	select {
	case <-exited:
	case <-time.After(budget):
		_ = cmd.Process.Kill()
		<-exited
		err = fmt.Errorf("the container did not power off within %v; killed", budget)
	}
	b.mu.Lock()
	b.nspawn, b.pid1 = nil, 0
	b.mu.Unlock()
	return err
}

// console is nspawn's output so far.
func (b *box) console() string {
	out, _ := os.ReadFile(b.log)
	return string(out)
}

// writeFile writes a file into the container's root from the host, as
// root, atomically (an operator's `sudoedit`).
func (b *box) writeFile(path string, data []byte, mode os.FileMode) {
	b.t.Helper()
	if err := atomicfile.Write(filepath.Join(b.root, path), data, mode); err != nil {
		b.t.Fatal(err)
	}
}

// boxConfig is the operator's /etc/gpuhost/gpuhost.yaml of the journey: a
// simulated GPU, the simulator as both backends' program (`gpuhost
// simulate`, the packaged binary), a vLLM profile with standby (sleep) and
// an Ollama one whose model unloads. The backends run as root: the
// simulator shares its GPU claims with gpuhost through gpu.sim_dir (under
// /var/lib/gpuhost, 0750 root), and gpuhost.service, root without
// CAP_DAC_OVERRIDE, could not read the claims of another user.
const boxConfig = `listen: 127.0.0.1:8080
state_dir: /var/lib/gpuhost
gpu:
  backend: sim
  release_timeout: 20s
backends:
  vllm:
    unit: gpuhost-vllm.service
    exec: [/usr/bin/gpuhost, simulate, vllm, --sim-dir, /var/lib/gpuhost/simgpu]
    simulated: true
    user: root
  ollama:
    unit: gpuhost-ollama.service
    exec: [/usr/bin/gpuhost, simulate, ollama, --sim-dir, /var/lib/gpuhost/simgpu]
    simulated: true
    user: root
switch:
  ready_timeout: 60s
  stop_timeout: 20s
default_profile: qwen3-coder
proxy:
  min_residency: 0s
profiles:
  qwen3-coder:
    backend: vllm
    model: cpatonn/Qwen3-Coder-30B-A3B-Instruct-AWQ-4bit
    served_name: qwen3-coder
    port: 8000
    standby: auto
    vllm: {gpu_memory_utilization: 0.92, max_num_seqs: 32, max_model_len: 65536, enable_auto_tool_choice: true, tool_call_parser: qwen3_xml}
    sim: {load_time: 2s, prefill_tps: 2545, decode_tps: 150, weights_mib: 14540, h2d_gbps: 100}
  llama3-8b:
    backend: ollama
    model: llama3.1:8b
    served_name: llama3.1:8b
    port: 11434
    standby: unload
    ollama: {num_ctx: 8192, keep_alive: "-1"}
    sim: {load_time: 800ms, prefill_tps: 4000, decode_tps: 120, vram_mib: 6200}
`

// journey records each step of the installed-box journey with its time
// and prints the transcript at the end.
type journey struct {
	t     *testing.T
	begin time.Time
	lines []string
}

// step runs fn as one step and records how long it took and what it said.
func (j *journey) step(name string, fn func() string) {
	j.t.Helper()
	start := time.Now()
	note := fn()
	line := fmt.Sprintf("[%6.1fs] %-58s %7.2fs  %s", start.Sub(j.begin).Seconds(), name, time.Since(start).Seconds(), note)
	j.lines = append(j.lines, line)
	j.t.Log(line)
}

func (j *journey) transcript() string {
	return "installed-box journey (step, its time, what was seen):\n" + strings.Join(j.lines, "\n")
}

// TestInstalledBox is the installed-box journey: `make deb` twice (a build
// and a newer one), a minimal Debian booted with systemd-nspawn (systemd
// as its PID 1), and then what an operator types there: apt install, the
// config, docs/deployment.md's commands, systemctl, /v1 through the relay
// sockets, switches both ways with standby, a crashed backend, a restart
// of gpuhost (the backend is adopted), a reboot, an upgrade while a
// backend serves, apt remove and apt purge. The transcript gives each
// step's time.
func TestInstalledBox(t *testing.T) {
	if os.Getuid() != 0 {
		skipOrFailBox(t, "needs root (systemd-nspawn, mount namespaces)")
	}
	for _, tool := range []string{"make", "gcc", "systemd-nspawn", "unshare", "nsenter", "tar", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			skipOrFailBox(t, tool+" not found (apt-get install systemd-container mmdebstrap util-linux gcc make)")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	j := &journey{t: t, begin: time.Now()}
	defer func() {
		if len(j.lines) > 0 {
			t.Log(j.transcript())
		}
	}()
	dir := t.TempDir()
	var tarball string
	j.step("Debian root (mmdebstrap, or the cached tarball)", func() string {
		tarball = boxRootTarball(t, ctx)
		return filepath.Base(tarball)
	})
	var debs []string
	var debDir string
	j.step("make deb, twice (the build, and a newer version of it to upgrade to)", func() string {
		first, d := builtDeb(t, ctx)
		second, err := makeDeb(ctx, filepath.Join(dir, "newer"), upgradeVersion, "DEB_BINARY="+filepath.Join(d, "gpuhost"))
		if err != nil {
			t.Fatal(err)
		}
		debs, debDir = []string{first, second}, d
		return filepath.Base(first) + ", " + filepath.Base(second)
	})
	rendered := renderedUnits(t, ctx, filepath.Join(debDir, "gpuhost"), filepath.Join(dir, "rendered"))
	b := &box{t: t, root: filepath.Join(dir, "root"), log: filepath.Join(dir, "console.log")}
	j.step("unpack the root, copy the packages in", func() string {
		unpackRoot(t, ctx, tarball, b.root, debs)
		return b.root
	})
	t.Cleanup(func() {
		if err := b.poweroff(60 * time.Second); err != nil {
			t.Error(err)
		}
	})
	j.step("boot: systemd-nspawn --boot (systemd is PID 1)", func() string {
		b.boot(ctx)
		return "is-system-running: running"
	})
	installAndStart(ctx, j, b, rendered)
	switchesAndCrash(ctx, j, b)
	restartRebootUpgrade(ctx, j, b)
	removeAndPurge(ctx, j, b, rendered)
	j.step("systemctl poweroff", func() string {
		if err := b.poweroff(60 * time.Second); err != nil {
			t.Fatal(err)
		}
		return "nspawn ended"
	})
}

// unpackRoot unpacks the root tarball into root and copies the packages
// into its /root/debs.
func unpackRoot(t *testing.T, ctx context.Context, tarball, root string, debs []string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(root, "root", "debs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(ctx, "tar", "--numeric-owner", "-xpf", tarball, "-C", root).CombinedOutput(); err != nil {
		t.Fatalf("unpack %s: %v\n%s", tarball, err, out)
	}
	for _, deb := range debs {
		data, err := os.ReadFile(deb)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, "root", "debs", filepath.Base(deb)), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// upgradeVersion is the newer package the journey upgrades to.
const upgradeVersion = "0.0.0+test2"

// boxURL is gpuhost's listener inside the box (the container's own network).
const boxURL = "http://127.0.0.1:8080"

// mainPID is a unit's MainPID in the box (0: not running).
func (b *box) mainPID(ctx context.Context, unit string) int {
	b.t.Helper()
	out := b.must(ctx, "systemctl show -p MainPID --value "+unit)
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		b.t.Fatalf("MainPID of %s: %q", unit, out)
	}
	return pid
}

// post sends a JSON body to gpuhost in the box with curl and returns the
// answer; a status >= 400 is an error carrying the body.
func (b *box) post(ctx context.Context, path, body string) (string, error) {
	return b.shIn(ctx, body, "curl -sS -m 60 --fail-with-body -H 'content-type: application/json' --data-binary @- "+boxURL+path)
}

// chat asks model for a short answer through /v1/chat/completions.
func (b *box) chat(ctx context.Context, model string) error {
	out, err := b.post(ctx, "/v1/chat/completions",
		`{"model":"`+model+`","messages":[{"role":"user","content":"Say hello."}],"max_tokens":8}`)
	if err != nil {
		return fmt.Errorf("%w: %s", err, out)
	}
	if !strings.Contains(out, `"object":"chat.completion"`) || !strings.Contains(out, `"model":"`+model+`"`) {
		return fmt.Errorf("chat with %s answered %s", model, out)
	}
	return nil
}

// waitServing polls chat until model answers or budget has passed, and
// returns how long it took.
func (b *box) waitServing(ctx context.Context, model string, budget time.Duration) time.Duration {
	b.t.Helper()
	begin := time.Now()
	var last error
	if !testkit.Poll(budget, func() bool { last = b.chat(ctx, model); return last == nil }) {
		status, _ := b.sh(ctx, "gpuhost status; journalctl -n 30 --no-pager -u 'gpuhost*'")
		b.t.Fatalf("%s did not serve within %v: %v\n%s", model, budget, last, status)
	}
	return time.Since(begin)
}

// installAndStart: apt install, the config, docs/deployment.md's commands,
// systemctl start, and /v1 through the relay sockets.
func installAndStart(ctx context.Context, j *journey, b *box, rendered []string) {
	t := j.t
	j.step("apt install ./gpuhost_"+sharedVersion+"_*.deb", func() string {
		b.must(ctx, "cd /root/debs && apt-get install -y ./gpuhost_"+sharedVersion+"_*.deb")
		listed := strings.Fields(b.must(ctx, `dpkg-query -L gpuhost | grep '^/usr/lib/systemd/system/.' | sed 's|.*/||' | sort`))
		if strings.Join(listed, " ") != strings.Join(rendered, " ") {
			t.Errorf("the installed package holds the units %v; the renderer writes %v", listed, rendered)
		}
		enabled, _ := b.sh(ctx, "systemctl is-enabled gpuhost.service")
		active, _ := b.sh(ctx, "systemctl is-active gpuhost.service")
		if strings.TrimSpace(enabled) != "enabled" || strings.TrimSpace(active) == "active" {
			t.Errorf("after install gpuhost.service is %q and %q; want enabled and not started", enabled, active)
		}
		return fmt.Sprintf("%d units; gpuhost.service %s, %s", len(listed), strings.TrimSpace(enabled), strings.TrimSpace(active))
	})
	j.step("sudoedit /etc/gpuhost/gpuhost.yaml (simulator backends)", func() string {
		b.writeFile("/etc/gpuhost/gpuhost.yaml", []byte(boxConfig), 0o640)
		return "gpu.backend: sim; backends: gpuhost simulate vllm|ollama"
	})
	j.step("gpuhost units install --binary /usr/bin/gpuhost --no-start", func() string {
		out := b.must(ctx, "gpuhost units install --binary /usr/bin/gpuhost --no-start")
		return fmt.Sprintf("%d files written", strings.Count(out, "wrote "))
	})
	j.step("systemctl start gpuhost → qwen3-coder serves", func() string {
		b.must(ctx, "systemctl start gpuhost")
		d := b.waitServing(ctx, "qwen3-coder", 2*time.Minute)
		return fmt.Sprintf("first answer %.2fs after the start", d.Seconds())
	})
	j.step("/v1 through the relay socket: chat, Messages, Responses", func() string {
		checkAPIs(ctx, t, b)
		// The relay is the only way in: the backend's port is in its own network.
		if out, err := b.sh(ctx, "curl -sS -m 5 http://127.0.0.1:8000/health"); err == nil {
			t.Errorf("the backend's port answered from the box's network (want it reachable only through the relay): %s", out)
		}
		return "3 APIs answered; relay " + strings.Join(strings.Fields(b.must(ctx,
			"systemctl is-active gpuhost-vllm-proxy-8000.socket gpuhost-vllm-proxy-8000.service")), "/") + "; port 8000 closed outside"
	})
}

// checkAPIs sends one request per API to qwen3-coder and checks the shape
// of each answer.
func checkAPIs(ctx context.Context, t *testing.T, b *box) {
	t.Helper()
	for _, c := range []struct{ path, body, want string }{
		{"/v1/chat/completions", `{"model":"qwen3-coder","messages":[{"role":"user","content":"hi"}],"max_tokens":8}`, `"object":"chat.completion"`},
		{"/v1/messages", `{"model":"qwen3-coder","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`, `"type":"message"`},
		{"/v1/responses", `{"model":"qwen3-coder","input":"hi","max_output_tokens":16}`, `"status":"completed"`},
	} {
		out, err := b.post(ctx, c.path, c.body)
		if err != nil || !strings.Contains(out, c.want) {
			t.Errorf("POST %s: %v; want %s in: %s", c.path, err, c.want, out)
		}
	}
}

// healingBuilt reports whether this build heals a crashed backend: its
// config has the heal: section.
func healingBuilt() bool {
	f, ok := reflect.TypeOf(config.Config{}).FieldByName("Heal")
	return ok && strings.HasPrefix(f.Tag.Get("yaml"), "heal")
}

// healBudget bounds a crash → serving again: the back-off (2 s by default)
// plus a cold start of the simulated vLLM (2 s), with room for a loaded
// 2-core machine.
const healBudget = 90 * time.Second

// switchesAndCrash: switches both ways with standby, then a kill -9 of the
// active backend.
func switchesAndCrash(ctx context.Context, j *journey, b *box) {
	t := j.t
	vllmPID := b.mainPID(ctx, "gpuhost-vllm.service")
	j.step("gpuhost switch llama3-8b (qwen3-coder into standby)", func() string {
		b.must(ctx, "gpuhost switch llama3-8b")
		if err := b.chat(ctx, "llama3.1:8b"); err != nil {
			t.Fatal(err)
		}
		if pid := b.mainPID(ctx, "gpuhost-vllm.service"); pid != vllmPID {
			t.Errorf("the vLLM's MainPID went %d → %d; want it kept asleep in standby", vllmPID, pid)
		}
		return fmt.Sprintf("llama3.1:8b answers; vLLM pid %d asleep", vllmPID)
	})
	j.step("gpuhost switch qwen3-coder (woken from standby)", func() string {
		b.must(ctx, "gpuhost switch qwen3-coder")
		if err := b.chat(ctx, "qwen3-coder"); err != nil {
			t.Fatal(err)
		}
		if pid := b.mainPID(ctx, "gpuhost-vllm.service"); pid != vllmPID {
			t.Errorf("the vLLM's MainPID went %d → %d; want the same process woken", vllmPID, pid)
		}
		return fmt.Sprintf("qwen3-coder answers; same vLLM pid %d", vllmPID)
	})
	j.step("kill -9 the active backend → qwen3-coder serves again", func() string {
		pid := b.mainPID(ctx, "gpuhost-vllm.service")
		b.must(ctx, "kill -9 "+strconv.Itoa(pid))
		if !healingBuilt() {
			t.Log("!!! crash healing not in this build (its config has no heal: section): the crash is not healed; switching by hand to go on")
			b.must(ctx, "gpuhost switch qwen3-coder")
			return "!!! NOT CHECKED: crash healing not in this build"
		}
		d := b.waitServing(ctx, "qwen3-coder", healBudget)
		now := b.mainPID(ctx, "gpuhost-vllm.service")
		if now == pid || now == 0 {
			t.Errorf("after kill -9 of %d the vLLM's MainPID is %d; want a new process", pid, now)
		}
		return fmt.Sprintf("pid %d killed; pid %d serves %.2fs later", pid, now, d.Seconds())
	})
}

// restartRebootUpgrade: systemctl restart gpuhost (the backend is adopted),
// a reboot of the box, and an upgrade while a backend serves.
func restartRebootUpgrade(ctx context.Context, j *journey, b *box) {
	t := j.t
	j.step("systemctl restart gpuhost → the backend is adopted", func() string {
		vllm, daemon := b.mainPID(ctx, "gpuhost-vllm.service"), b.mainPID(ctx, "gpuhost.service")
		b.must(ctx, "systemctl restart gpuhost")
		b.waitServing(ctx, "qwen3-coder", time.Minute)
		vllm2, daemon2 := b.mainPID(ctx, "gpuhost-vllm.service"), b.mainPID(ctx, "gpuhost.service")
		if vllm2 != vllm || daemon2 == daemon {
			t.Errorf("restart: vLLM pid %d → %d (want the same), gpuhost pid %d → %d (want a new one)", vllm, vllm2, daemon, daemon2)
		}
		return fmt.Sprintf("gpuhost pid %d → %d; vLLM pid %d unchanged", daemon, daemon2, vllm2)
	})
	j.step("gpuhost switch llama3-8b (the last wanted profile)", func() string {
		b.must(ctx, "gpuhost switch llama3-8b")
		return "llama3-8b"
	})
	j.step("reboot: systemctl poweroff, boot the root again → llama3-8b serves", func() string {
		if err := b.poweroff(60 * time.Second); err != nil {
			t.Fatal(err)
		}
		begin := time.Now()
		b.boot(ctx)
		booted := time.Since(begin)
		b.waitServing(ctx, "llama3.1:8b", 2*time.Minute)
		return fmt.Sprintf("booted in %.2fs; llama3.1:8b serves %.2fs after the boot began", booted.Seconds(), time.Since(begin).Seconds())
	})
	j.step("apt install ./gpuhost_"+upgradeVersion+"_*.deb (upgrade) while llama3-8b serves", func() string {
		ollama, daemon := b.mainPID(ctx, "gpuhost-ollama.service"), b.mainPID(ctx, "gpuhost.service")
		b.must(ctx, "cd /root/debs && apt-get install -y ./gpuhost_"+upgradeVersion+"_*.deb")
		if v := strings.TrimSpace(b.must(ctx, "dpkg-query -W -f '${Version}' gpuhost")); v != upgradeVersion {
			t.Errorf("after the upgrade gpuhost is %q", v)
		}
		b.waitServing(ctx, "llama3.1:8b", time.Minute)
		ollama2, daemon2 := b.mainPID(ctx, "gpuhost-ollama.service"), b.mainPID(ctx, "gpuhost.service")
		if ollama2 != ollama || daemon2 == daemon {
			t.Errorf("upgrade: Ollama pid %d → %d (want the same), gpuhost pid %d → %d (want restarted)", ollama, ollama2, daemon, daemon2)
		}
		return fmt.Sprintf(upgradeVersion+"; gpuhost pid %d → %d; Ollama pid %d unchanged and serving", daemon, daemon2, ollama2)
	})
}

// leftovers lists every path in the box's root file system whose name
// holds "gpuhost" (the packages copied in aside), and whether the backend
// user exists.
func (b *box) leftovers(ctx context.Context) ([]string, bool) {
	b.t.Helper()
	out := b.must(ctx, "find / -xdev -name '*gpuhost*' -not -path '/root/debs*' | sort")
	_, err := b.sh(ctx, "getent passwd gpuhost-backend")
	return strings.Fields(out), err == nil
}

// checkLeftovers: what remains is exactly what docs/deployment.md says is
// kept (each of kept exists; nothing else but the package manager's own
// records, allowed by prefix).
func checkLeftovers(t *testing.T, step string, paths []string, kept, bookkeeping []string) {
	t.Helper()
	seen := map[string]bool{}
	for _, p := range paths {
		ok := false
		for _, k := range kept {
			if p == k || strings.HasPrefix(p, k+"/") {
				ok, seen[k] = true, seen[k] || p == k
			}
		}
		for _, k := range bookkeeping {
			ok = ok || strings.HasPrefix(p, k)
		}
		if !ok {
			t.Errorf("after %s: %s remains; docs/deployment.md says it goes", step, p)
		}
	}
	for _, k := range kept {
		if !seen[k] {
			t.Errorf("after %s: %s is gone; docs/deployment.md says it is kept", step, k)
		}
	}
}

// removeAndPurge: apt remove keeps the config, the state, the backend user
// and its home; apt purge keeps only the backend user and its home.
func removeAndPurge(ctx context.Context, j *journey, b *box, rendered []string) {
	t := j.t
	j.step("apt remove gpuhost", func() string {
		b.must(ctx, "apt-get remove -y gpuhost")
		for _, u := range rendered {
			if state, _ := b.sh(ctx, "systemctl is-active "+u); strings.TrimSpace(state) == "active" {
				t.Errorf("after apt remove %s is still active", u)
			}
		}
		paths, user := b.leftovers(ctx)
		t.Logf("after apt remove:\n%s", strings.Join(paths, "\n"))
		checkLeftovers(t, "apt remove", paths, []string{"/etc/gpuhost", "/var/lib/gpuhost", "/var/lib/gpuhost-backend"},
			// dpkg's and deb-systemd-helper's records, the mask, and the
			// enablement link (kept until purge, as for every Debian service).
			[]string{"/var/lib/dpkg/info/gpuhost.", "/var/lib/systemd/deb-systemd-helper-", "/etc/systemd/system/gpuhost.service",
				"/etc/systemd/system/multi-user.target.wants/gpuhost.service"})
		if link, _ := b.sh(ctx, "readlink /etc/systemd/system/gpuhost.service"); strings.TrimSpace(link) != "/dev/null" {
			t.Errorf("after apt remove /etc/systemd/system/gpuhost.service is %q; want the mask (→ /dev/null) or nothing", link)
		}
		if !user {
			t.Error("after apt remove the user gpuhost-backend is gone")
		}
		return fmt.Sprintf("no unit active; kept /etc/gpuhost, /var/lib/gpuhost, gpuhost-backend; %d paths", len(paths))
	})
	j.step("apt purge gpuhost", func() string {
		b.must(ctx, "apt-get purge -y gpuhost")
		paths, user := b.leftovers(ctx)
		t.Logf("after apt purge:\n%s", strings.Join(paths, "\n"))
		checkLeftovers(t, "apt purge", paths, []string{"/var/lib/gpuhost-backend"}, nil)
		if !user {
			t.Error("after apt purge the user gpuhost-backend is gone")
		}
		return "kept only the user gpuhost-backend and /var/lib/gpuhost-backend"
	})
}
