package appliance

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/internal/testkit"
	"gpuhost/units"
)

// newHealFixture is a process-runner fixture whose vLLM simulator crashes
// at start while crashFile exists, with a short heal back-off.
func newHealFixture(t *testing.T) (f *procFixture, crashFile string) {
	t.Helper()
	f = newProcFixtureYAML(t, func(bin, state string) string {
		crashFile = filepath.Join(state, "crash")
		y := testConfigYAML(bin, state, "process", "", testkit.FreePort(t), testkit.FreePort(t), "50ms")
		y = strings.Replace(y, "simulate, vllm, --sim-dir", "simulate, vllm, --crash-file, "+crashFile+", --sim-dir", 1)
		return y + "heal: {max_restarts: 3, window: 10m, backoff: 50ms, max_backoff: 200ms}\n"
	})
	return f, crashFile
}

// waitEvent waits for the first event after since that match accepts,
// returning every event seen up to it.
func waitEvent(t *testing.T, sup *Supervisor, since uint64, timeout time.Duration, match func(api.Event) bool) []api.Event {
	t.Helper()
	ch, backlog, cancel := sup.Subscribe(since)
	defer cancel()
	var out []api.Event
	for _, e := range backlog {
		out = append(out, e)
		if match(e) {
			return out
		}
	}
	deadline := time.After(timeout)
	for {
		select {
		case e := <-ch:
			out = append(out, e)
			if match(e) {
				return out
			}
		case <-deadline:
			t.Fatalf("no matching event within %s; events: %s", timeout, describe(out))
		}
	}
}

func count(evs []api.Event, kind api.EventKind, status api.EventStatus) int {
	n := 0
	for _, e := range evs {
		if e.Kind == kind && (status == "" || e.Status == status) {
			n++
		}
	}
	return n
}

// killMain sends SIGKILL to a unit's main process, as `kill -9` would.
func killMain(t *testing.T, f *procFixture, unit string) {
	t.Helper()
	st, err := f.sup.units.Unit(context.Background(), unit)
	if err != nil || st.MainPID == 0 {
		t.Fatalf("main pid of %s: %+v, %v", unit, st, err)
	}
	if err := syscall.Kill(st.MainPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
}

// TestCrashedBackendIsHealed: kill -9 of the active backend brings the
// same profile back through a switch, and a /v1 request arriving meanwhile
// is held until it serves, not refused.
func TestCrashedBackendIsHealed(t *testing.T) {
	f, _ := newHealFixture(t)
	if evs, err := f.switchTo(t, "coder"); err != nil {
		t.Fatalf("switch: %v%s", err, describe(evs))
	}
	since := f.sup.LastSeq()
	killMain(t, f, "gpuhost-vllm.service")
	// The hold: AwaitActive started after the kill waits for the heal.
	waitEvent(t, f.sup, since, 10*time.Second, func(e api.Event) bool { return e.Kind == "crash" })
	got := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		p, err := f.sup.AwaitActive(ctx)
		if err == nil && p.Name != "coder" {
			err = errors.New("held request got " + p.Name)
		}
		got <- err
	}()
	evs := waitEvent(t, f.sup, since, 30*time.Second, func(e api.Event) bool { return e.Kind == "heal" })
	if last := evs[len(evs)-1]; last.Status != "done" {
		t.Fatalf("heal ended %s: %s%s", last.Status, last.Message, describe(evs))
	}
	if n := count(evs, "crash", ""); n != 1 {
		t.Errorf("%d crash events, want 1:%s", n, describe(evs))
	}
	for _, e := range evs {
		if e.Kind == "crash" && (e.Detail["reason"] != "signal" || e.Profile != "coder") {
			t.Errorf("crash event %+v, want reason signal of coder", e)
		}
	}
	if err := <-got; err != nil {
		t.Errorf("a request held during the heal: %v", err)
	}
	st := f.sup.State()
	if st.Phase != api.PhaseActive || st.Profile != "coder" || st.NotServing != "" {
		t.Errorf("after heal: %+v", st)
	}
}

// TestCrashLoopGivesUp: a backend that crashes at every start is
// restarted heal.max_restarts times, then the phase is failed with the
// reason and the log lines, the doctor fails naming it, and `gpuhost heal`
// brings it back once the cause is gone.
func TestCrashLoopGivesUp(t *testing.T) {
	f, crashFile := newHealFixture(t)
	if evs, err := f.switchTo(t, "coder"); err != nil {
		t.Fatalf("switch: %v%s", err, describe(evs))
	}
	if err := os.WriteFile(crashFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	since := f.sup.LastSeq()
	killMain(t, f, "gpuhost-vllm.service")
	evs := waitEvent(t, f.sup, since, 60*time.Second, func(e api.Event) bool { return e.Kind == "heal" })
	last := evs[len(evs)-1]
	if last.Status != "failed" || !strings.Contains(last.Message, "crashed 4 times") || len(last.Journal) == 0 {
		t.Fatalf("heal ended %+v%s", last, describe(evs))
	}
	if c, s := count(evs, "crash", ""), count(evs, "switch", "started"); c != 4 || s != 3 {
		t.Errorf("%d crashes and %d restarts, want 4 and 3:%s", c, s, describe(evs))
	}
	st := f.sup.State()
	if st.Phase != api.PhaseFailed || st.NotServing == "" || !strings.Contains(st.Error, "gpuhost heal") {
		t.Fatalf("state after the crash loop: %+v", st)
	}
	rep := (&Doctor{Cfg: f.cfg, GPU: f.gpu, Units: f.sup.units, Gate: f.sup}).Run(context.Background())
	c := findCheck(rep, "state.last_wanted")
	if c.Severity != units.SeverityFail || !strings.Contains(c.Message, "crashed 4 times") || !strings.Contains(c.Fix, "gpuhost heal") {
		t.Errorf("doctor's state.last_wanted: %+v", c)
	}
	// It stays failed: nothing restarts it by itself.
	time.Sleep(300 * time.Millisecond)
	if st := f.sup.State(); st.Phase != api.PhaseFailed {
		t.Fatalf("after giving up: %+v", st)
	}
	if err := os.Remove(crashFile); err != nil {
		t.Fatal(err)
	}
	profile, id, done, err := f.sup.Heal(context.Background())
	if err != nil || profile != "coder" {
		t.Fatalf("heal: %q %v", profile, err)
	}
	if err := <-done; err != nil {
		t.Fatalf("heal switch %s: %v", id, err)
	}
	if st := f.sup.State(); st.Phase != api.PhaseActive || st.NotServing != "" {
		t.Errorf("after gpuhost heal: %+v", st)
	}
}

// TestHandStopPauses: a clean stop of the active unit by hand means "serve
// nothing": no restart, nothing wanted, the profile remembered as paused,
// which heal resumes.
func TestHandStopPauses(t *testing.T) {
	f, _ := newHealFixture(t)
	if evs, err := f.switchTo(t, "coder"); err != nil {
		t.Fatalf("switch: %v%s", err, describe(evs))
	}
	since := f.sup.LastSeq()
	if err := f.sup.units.Stop(context.Background(), "gpuhost-vllm.service"); err != nil {
		t.Fatal(err)
	}
	evs := waitEvent(t, f.sup, since, 20*time.Second, func(e api.Event) bool { return e.Kind == "paused" || e.Kind == "crash" })
	if last := evs[len(evs)-1]; last.Kind != "paused" {
		t.Fatalf("a hand stop was taken for a crash:%s", describe(evs))
	}
	deadline := time.Now().Add(10 * time.Second)
	for f.sup.State().Phase != api.PhaseIdle && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	st := f.sup.State()
	if st.Phase != api.PhaseIdle || st.Paused != "coder" || st.LastWanted != "" || st.NotServing != "" {
		t.Fatalf("after a hand stop: %+v", st)
	}
	if lw := f.sup.readStateFile(); lw.Paused != "coder" || lw.Profile != "" {
		t.Errorf("state file after a hand stop: %+v", lw)
	}
	rep := (&Doctor{Cfg: f.cfg, GPU: f.gpu, Units: f.sup.units, Gate: f.sup}).Run(context.Background())
	if c := findCheck(rep, "state.last_wanted"); c.Severity != units.SeverityWarn || !strings.Contains(c.Fix, "gpuhost heal") {
		t.Errorf("doctor after a hand stop: %+v", c)
	}
	_, _, done, err := f.sup.Heal(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st := f.sup.State(); st.Phase != api.PhaseActive || st.LastWanted != "coder" || st.Paused != "" {
		t.Errorf("after heal: %+v", st)
	}
}

func findCheck(rep api.DoctorReport, id string) api.DoctorCheck {
	for _, c := range rep.Checks {
		if c.ID == id {
			return c
		}
	}
	return api.DoctorCheck{}
}

// TestStandbyBackendDeathIsDropped: the unit in standby dying is a crash
// of its own (event with the reason): it leaves standby, the active
// profile serves on, nothing is restarted.
func TestStandbyBackendDeathIsDropped(t *testing.T) {
	f := newProcFixtureYAML(t, standbyYAML(t))
	for _, p := range []string{"coder", "llama"} {
		if evs, err := f.switchTo(t, p); err != nil {
			t.Fatalf("switch %s: %v%s", p, err, describe(evs))
		}
	}
	if st := f.sup.State(); len(st.Standby) != 1 || st.Standby[0].Profile != "coder" {
		t.Fatalf("coder not in standby: %+v", st)
	}
	since := f.sup.LastSeq()
	killMain(t, f, "gpuhost-vllm.service")
	evs := waitEvent(t, f.sup, since, 20*time.Second, func(e api.Event) bool { return e.Kind == "crash" })
	e := evs[len(evs)-1]
	if e.Profile != "coder" || e.Detail["reason"] != "signal" || e.Detail["standby"] != true || !strings.Contains(e.Message, "dropped from standby") {
		t.Errorf("crash event %+v", e)
	}
	time.Sleep(300 * time.Millisecond)
	st := f.sup.State()
	if st.Phase != api.PhaseActive || st.Profile != "llama" || len(st.Standby) != 0 || st.NotServing != "" {
		t.Errorf("after the standby backend died: %+v", st)
	}
	_, after, cancel := f.sup.Subscribe(since)
	cancel()
	if n := count(after, "switch", "started"); n != 0 {
		t.Errorf("%d switches after a standby backend died, want none", n)
	}
}
