package procunits

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"gpuhost/systemd"
)

func waitEvent(t *testing.T, ch <-chan systemd.UnitEvent, unit, state string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev := <-ch:
			if ev.Unit == unit && ev.ActiveState == state {
				return
			}
		case <-timeout:
			t.Fatalf("no event %s → %s", unit, state)
		}
	}
}

func TestRunnerLikeSystemd(t *testing.T) {
	dir := t.TempDir()
	env := filepath.Join(dir, "a.env")
	if err := os.WriteFile(env, []byte("GPUHOST_PROFILE=p1\nGPUHOST_ARGS=\"-c false\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := New(
		Spec{Name: "a.service", Exec: []string{"/bin/sh"}, EnvFile: env, Conflicts: []string{"b.service"}, LogDir: dir},
		// b ignores SIGTERM, so Stop must escalate to SIGKILL.
		Spec{Name: "b.service", Exec: []string{"/bin/sh", "-c", "trap '' TERM; echo started; while :; do sleep 0.05; done"},
			StopTimeout: 300 * time.Millisecond, LogDir: dir},
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer r.StopAll(context.Background())
	evs, err := r.Subscribe(ctx, "a.service", "b.service")
	if err != nil {
		t.Fatal(err)
	}

	if err := r.Start(ctx, "b.service"); err != nil {
		t.Fatal(err)
	}
	st, _ := r.Unit(ctx, "b.service")
	if !st.Active() || st.MainPID == 0 {
		t.Fatalf("b after start: %+v", st)
	}
	waitEvent(t, evs, "b.service", "active")
	// Wait until b's trap is set (it logs "started" after it).
	deadline := time.Now().Add(10 * time.Second)
	for {
		lines, _ := r.Journal(ctx, "b.service", 5)
		if strings.Contains(strings.Join(lines, "\n"), "started") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("b never logged started")
		}
		time.Sleep(10 * time.Millisecond)
	}

	// Starting a (which conflicts with b) stops b first, with SIGKILL
	// after the stop timeout because b ignores SIGTERM.
	t0 := time.Now()
	if err := r.Start(ctx, "a.service"); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d < 300*time.Millisecond {
		t.Errorf("b stopped after %s, before its stop timeout: SIGTERM was not ignored?", d)
	}
	if st, _ := r.Unit(ctx, "b.service"); st.Active() {
		t.Errorf("b still %s after starting the conflicting a", st.ActiveState)
	}
	// a runs `sh -c false` from $GPUHOST_ARGS split on whitespace: it
	// fails with exit-code, like a systemd unit.
	waitEvent(t, evs, "a.service", "failed")
	st, _ = r.Unit(ctx, "a.service")
	if st.ActiveState != "failed" || st.Result != "exit-code" {
		t.Errorf("a after sh -c false: %+v", st)
	}
	// Stopping a failed unit resets it, like systemctl stop.
	if err := r.Stop(ctx, "a.service"); err != nil {
		t.Fatal(err)
	}
	if st, _ := r.Unit(ctx, "a.service"); st.ActiveState != "inactive" {
		t.Errorf("a after stop: %s", st.ActiveState)
	}
	if _, err := r.Unit(ctx, "nope.service"); err == nil || !strings.Contains(err.Error(), "nope.service") {
		t.Errorf("unknown unit error = %v", err)
	}
}

func TestMissingEnvFileIsNoError(t *testing.T) {
	r := New(Spec{Name: "c.service", Exec: []string{"/bin/sleep", "5"}, EnvFile: filepath.Join(t.TempDir(), "none.env")})
	ctx := context.Background()
	if err := r.Start(ctx, "c.service"); err != nil {
		t.Fatal(err)
	}
	defer r.StopAll(ctx)
	st, _ := r.Unit(ctx, "c.service")
	if st.ActiveState != "active" || len(st.ExecStart) != 1 || strings.Join(st.ExecStart[0], " ") != "/bin/sleep 5" {
		t.Errorf("c: %+v", st)
	}
}

// A backend gets only a minimal environment plus its EnvironmentFile, as
// under systemd: the daemon's secrets (the bot token, API keys) must not
// reach /proc/<pid>/environ of a backend.
func TestBackendGetsOnlyAMinimalEnvironment(t *testing.T) {
	const token = "4242424242:AAFakeSecretTokenValue_abcdefghijklmnopq"
	t.Setenv("GPUHOST_TELEGRAM_TOKEN", token)
	t.Setenv("GPUHOST_API_TOKEN", "api-secret-value")
	t.Setenv("OPENAI_API_KEY", "sk-secret-value")
	t.Setenv("LC_ALL", "C.UTF-8")
	t.Setenv("HOME", "/root-for-test")
	dir := t.TempDir()
	envFile := filepath.Join(dir, "d.env")
	if err := os.WriteFile(envFile, []byte("GPUHOST_PROFILE=p1\nGPUHOST_ARGS=30\nOLLAMA_HOST=127.0.0.1:11434\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := New(Spec{Name: "d.service", Exec: []string{"/bin/sleep"}, EnvFile: envFile})
	ctx := context.Background()
	if err := r.Start(ctx, "d.service"); err != nil {
		t.Fatal(err)
	}
	defer r.StopAll(ctx)
	st, _ := r.Unit(ctx, "d.service")
	if st.MainPID <= 0 {
		t.Fatalf("no main pid: %+v", st)
	}
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(st.MainPID), "environ"))
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, kv := range strings.Split(strings.TrimRight(string(data), "\x00"), "\x00") {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	for _, secret := range []string{token, "api-secret-value", "sk-secret-value"} {
		if strings.Contains(string(data), secret) {
			t.Errorf("a daemon secret reached the backend's environment: %q", strings.ReplaceAll(string(data), "\x00", " "))
		}
	}
	for k, want := range map[string]string{
		"GPUHOST_PROFILE": "p1", "OLLAMA_HOST": "127.0.0.1:11434", // the EnvironmentFile
		"HOME": "/root-for-test", "LC_ALL": "C.UTF-8", "PATH": os.Getenv("PATH"), // the basics
	} {
		if env[k] != want {
			t.Errorf("backend env %s = %q, want %q", k, env[k], want)
		}
	}
	for k := range env {
		if !passEnv[k] && !strings.HasPrefix(k, "LC_") && !strings.HasPrefix(k, "GPUHOST_") && !strings.HasPrefix(k, "OLLAMA_") {
			t.Errorf("backend inherited %s", k)
		}
	}
}

func TestBaseEnvSetsADefaultPath(t *testing.T) {
	got := baseEnv([]string{"SECRET=x", "HOME=/h", "LC_TIME=C", "BROKEN"})
	want := []string{"HOME=/h", "LC_TIME=C", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("baseEnv = %q, want %q", got, want)
	}
}
