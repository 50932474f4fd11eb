package units

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// privateSystemd is the machine's own systemd booted as PID 1 of a fresh PID
// and mount namespace, with /run, /tmp and /var/tmp private and the test's
// unit folder bound over /etc/systemd/system (see DESIGN.md, "How it is
// tested"). Everything in it dies with it.
type privateSystemd struct {
	pid int
	dir string
}

// startPrivateSystemd boots it, or skips the test where that is impossible
// (not root, tools missing, -short).
func startPrivateSystemd(t *testing.T, dir string) *privateSystemd {
	t.Helper()
	if testing.Short() {
		t.Skip("boots a private systemd; skipped with -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to boot a private systemd")
	}
	for _, tool := range []string{"unshare", "nsenter", "systemctl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	const systemdBin = "/lib/systemd/systemd"
	if _, err := os.Stat(systemdBin); err != nil {
		t.Skipf("no %s: %v", systemdBin, err)
	}

	// Empty stand-ins for the targets default dependencies pull in, and masks
	// for everything the host's targets want: otherwise the first service
	// started pulls in sysinit.target, whose systemd-tmpfiles-setup empties
	// the host's /tmp, and other units act on the shared kernel.
	unitDir := filepath.Join(dir, "units")
	for _, tgt := range []string{"sysinit.target", "basic.target", "gpuhost-test.target"} {
		writeFile(t, filepath.Join(unitDir, tgt), "[Unit]\nDescription=test stand-in\nDefaultDependencies=no\n")
	}
	var masks []string
	wants, _ := filepath.Glob("/lib/systemd/system/*.target.wants/*")
	for _, w := range wants {
		masks = append(masks, filepath.Base(w))
	}
	for _, pat := range []string{"systemd-remount-fs.service", "systemd-tmpfiles-*", "systemd-sysctl.service", "systemd-udev*"} {
		m, _ := filepath.Glob(filepath.Join("/lib/systemd/system", pat))
		for _, p := range m {
			masks = append(masks, filepath.Base(p))
		}
	}
	for _, m := range masks {
		p := filepath.Join(unitDir, m)
		if _, err := os.Lstat(p); err == nil {
			continue
		}
		if err := os.Symlink("/dev/null", p); err != nil {
			t.Fatalf("masking %s: %v", m, err)
		}
	}

	// The test dir lives under /tmp, which becomes a private tmpfs: park it
	// under the private /run first and bind it back to the same path.
	script := `set -e
mount -t tmpfs tmpfs /run
mkdir /run/keep
mount --bind "$D" /run/keep
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /var/tmp
mkdir -p "$D"
mount --bind /run/keep "$D"
umount /run/keep
rmdir /run/keep
mount --bind "$D/units" /etc/systemd/system
exec env container=gpuhost-units-test ` + systemdBin + ` --system --unit=gpuhost-test.target`
	var log bytes.Buffer
	cmd := exec.Command("unshare", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc",
		"--propagation", "private", "sh", "-c", script)
	cmd.Env = append(os.Environ(), "D="+dir)
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting unshare: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // --kill-child takes systemd and its namespace down too
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("private systemd output:\n%s", log.String())
		}
	})

	s := &privateSystemd{dir: dir}
	waitFor(t, 15*time.Second, "private systemd's D-Bus socket", func() bool {
		if s.pid == 0 {
			s.pid = childOf(cmd.Process.Pid)
		}
		if s.pid == 0 {
			return false
		}
		fi, err := os.Stat(filepath.Join("/proc", strconv.Itoa(s.pid), "root/run/systemd/private"))
		return err == nil && fi.Mode()&os.ModeSocket != 0
	})
	return s
}

// childOf finds the first process whose parent is ppid.
func childOf(ppid int) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid …; comm may contain spaces, so cut at the last ')'.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(ppid) {
			return pid
		}
	}
	return 0
}

// systemctl runs systemctl inside the namespace (the private D-Bus socket
// drops peers it cannot see).
func (s *privateSystemd) systemctl(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	full := append([]string{"--target", strconv.Itoa(s.pid), "--pid", "--mount", "systemctl"}, args...)
	out, err := exec.CommandContext(ctx, "nsenter", full...).CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !(errors.As(err, &exit) && args[0] == "is-active") {
		t.Fatalf("systemctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

func waitFor(t *testing.T, limit time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestUnitsUnderRealSystemd proves the core claim of this package on the
// machine's real systemd: the argv gpuhost renders reaches the backend
// process exactly, through EnvFile, `$GPUHOST_ARGS` splitting and
// QuoteExecWord, and Conflicts= (rendered or added by the adopt drop-in)
// stops the other backend.
func TestUnitsUnderRealSystemd(t *testing.T) {
	dir := t.TempDir()
	sd := startPrivateSystemd(t, dir)

	// The "backend" records its argv and environment, then stays up.
	dump := filepath.Join(dir, "dump-argv")
	writeFile(t, dump, "#!/bin/sh\nprintf '%s\\0' \"$0\" \"$@\" > \""+dir+"/argv-$GPUHOST_PROFILE\"\nenv > \""+dir+"/env-$GPUHOST_PROFILE\"\nexec sleep 300\n")
	if err := os.Chmod(dump, 0o755); err != nil {
		t.Fatal(err)
	}

	v := qwenCoder()
	v.VLLM.ExtraArgs = []string{"--host=127.0.0.1", "--odd=$HOME%n`x;y"}
	v.Sim = SimOpts{LoadTime: "1.5s", PrefillTPS: 2545.5}
	if errs := v.Validate(); errs != nil {
		t.Fatalf("profile: %v", errs)
	}
	o := llamaOllama()
	vu := BackendUnit{Backend: VLLM, Name: "gpuhost-vllm.service", EnvFile: filepath.Join(dir, "vllm.env"),
		Exec:      []string{dump, "100%", "$HOME", `say "hi" \ there`, ";", "tab\tand ünï"},
		Conflicts: []string{"gpuhost-ollama.service"}}
	ou := BackendUnit{Backend: Ollama, Name: "gpuhost-ollama.service", EnvFile: filepath.Join(dir, "ollama.env"),
		Exec: []string{dump}, Conflicts: []string{"gpuhost-vllm.service"}}
	adopted := BackendUnit{Backend: VLLM, Name: "vllm-op.service", Adopt: true, Conflicts: []string{"gpuhost-ollama.service"}}
	for _, u := range []BackendUnit{vu, ou, adopted} {
		if err := u.Validate(); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, vu.EnvFile, EnvFile(v, true))
	writeFile(t, ou.EnvFile, EnvFile(o, false))
	unitDir := filepath.Join(dir, "units")
	writeFile(t, filepath.Join(unitDir, vu.Name), RenderBackendUnit(vu))
	writeFile(t, filepath.Join(unitDir, ou.Name), RenderBackendUnit(ou))
	writeFile(t, filepath.Join(unitDir, adopted.Name), "[Service]\nExecStart=/bin/sleep 300\n")
	dropPath, dropIn := RenderAdoptDropIn(adopted)
	writeFile(t, filepath.Join(unitDir, dropPath), dropIn)
	sd.systemctl(t, "daemon-reload")

	wantArgv := func(u BackendUnit, p Profile, simulated bool) string {
		return strings.Join(append(append([]string{}, u.Exec...), BackendArgs(p, simulated)...), "\x00") + "\x00"
	}
	readWhenThere := func(name string) string {
		var b []byte
		waitFor(t, 15*time.Second, name, func() bool {
			var err error
			b, err = os.ReadFile(filepath.Join(dir, name))
			return err == nil && len(b) > 0
		})
		return string(b)
	}

	sd.systemctl(t, "start", vu.Name)
	if got, want := readWhenThere("argv-coder"), wantArgv(vu, v, true); got != want {
		t.Errorf("vLLM unit argv:\n got %q\nwant %q", strings.Split(got, "\x00"), strings.Split(want, "\x00"))
	}

	sd.systemctl(t, "start", ou.Name)
	if got, want := readWhenThere("argv-llama"), wantArgv(ou, o, false); got != want {
		t.Errorf("Ollama unit argv:\n got %q\nwant %q", strings.Split(got, "\x00"), strings.Split(want, "\x00"))
	}
	if st := sd.systemctl(t, "is-active", vu.Name); st != "inactive" {
		t.Errorf("after starting %s, %s is %q; Conflicts= should have stopped it", ou.Name, vu.Name, st)
	}
	env := readWhenThere("env-llama")
	for _, kv := range []string{"OLLAMA_HOST=127.0.0.1:11434", "OLLAMA_KEEP_ALIVE=-1", "OLLAMA_CONTEXT_LENGTH=8192", "GPUHOST_PROFILE=llama"} {
		if !strings.Contains(env, kv+"\n") {
			t.Errorf("Ollama environment lacks %s:\n%s", kv, env)
		}
	}

	// The adopt drop-in alone makes the operator's unit exclusive, both ways.
	sd.systemctl(t, "start", adopted.Name)
	if st := sd.systemctl(t, "is-active", ou.Name); st != "inactive" {
		t.Errorf("after starting adopted %s, %s is %q", adopted.Name, ou.Name, st)
	}
	sd.systemctl(t, "start", ou.Name)
	if st := sd.systemctl(t, "is-active", adopted.Name); st != "inactive" {
		t.Errorf("after starting %s, adopted %s is %q", ou.Name, adopted.Name, st)
	}
}
