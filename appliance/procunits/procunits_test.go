package procunits

import (
	"context"
	"os"
	"path/filepath"
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
