package appliance

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/internal/testkit"
	"gpuhost/nvml"
)

// standbyYAML is the process-runner config with standby on both engines:
// coder (vLLM, auto: level 1 while the simulated host RAM holds its
// weights) and llama (Ollama, unload), and a fast standby watcher.
func standbyYAML(t testing.TB) func(bin, state string) string {
	vport, oport := testkit.FreePort(t), testkit.FreePort(t)
	return func(bin, state string) string {
		y := testConfigYAML(bin, state, "process", "", vport, oport, "300ms")
		y = strings.Replace(y, "  release_timeout: 20s\n", "  release_timeout: 20s\n  standby_watch_interval: 100ms\n", 1)
		y = strings.Replace(y, "    served_name: qwen3-coder\n    port: "+fmt.Sprint(vport)+"\n    vllm: {gpu_memory_utilization: 0.92,",
			"    served_name: qwen3-coder\n    standby: auto\n    port: "+fmt.Sprint(vport)+"\n    vllm: {gpu_memory_utilization: 0.92,", 1)
		y = strings.Replace(y, "    model: llama3.1:8b\n", "    model: llama3.1:8b\n    standby: unload\n", 1)
		return y
	}
}

// stepsOf lists the done steps of a switch's events, in order.
func stepsOf(evs []api.Event) []string {
	var out []string
	for _, e := range evs {
		if e.Kind == "step" && e.Status == "done" {
			out = append(out, e.Step)
		}
	}
	return out
}

// holders counts the backend units holding more than their residual (+
// tolerance) now: the standby invariant says at most one.
func (f *procFixture) holders(t *testing.T) (n int, detail string) {
	t.Helper()
	snap, err := f.gpu.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	d, _ := snap.Device0()
	bs, err := f.sup.backends(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	st := f.sup.State()
	for _, b := range bs {
		used := unitUsedMiB(d, b.status)
		limit := uint64(residualToleranceMiB)
		for _, sb := range st.Standby {
			if sb.Unit == b.unit {
				limit += sb.ResidualMiB
			}
		}
		detail += fmt.Sprintf("%s %d MiB (limit %d); ", b.unit, used, limit)
		if used > limit {
			n++
		}
	}
	return n, detail
}

func TestStandbyRoundTrip(t *testing.T) {
	f := newProcFixtureYAML(t, standbyYAML(t))
	awaitReconciled(t, f.sup)

	// Cold start of coder, then away to llama: coder goes to sleep, its unit stays up.
	if evs, err := f.switchTo(t, "coder"); err != nil {
		t.Fatalf("cold switch to coder: %v\n%s", err, describe(evs))
	}
	evs, err := f.switchTo(t, "llama")
	if err != nil {
		t.Fatalf("switch to llama: %v\n%s", err, describe(evs))
	}
	if got := strings.Join(stepsOf(evs), " "); got != "standby vram_release configure start ready load_model verify wake_check" {
		t.Errorf("coder → llama steps = %q", got)
	}
	var why string
	for _, e := range evs {
		if e.Step == "standby" && e.Status == "info" {
			why = e.Message
		}
	}
	if !strings.HasPrefix(why, "sleep level 1: ") || !strings.Contains(why, "GiB available") {
		t.Errorf("the standby choice must say why: %q", why)
	}
	st := f.sup.State()
	if st.Phase != api.PhaseActive || st.Profile != "llama" || len(st.Standby) != 1 || st.Standby[0].Profile != "coder" || st.Standby[0].Mode != "sleep1" {
		t.Fatalf("state after coder → llama: %+v", st)
	}
	if st.Standby[0].ResidualMiB == 0 || st.Standby[0].ResidualMiB > 1024 {
		t.Errorf("coder's measured residual = %d MiB, want the simulator's 512", st.Standby[0].ResidualMiB)
	}
	if n, d := f.holders(t); n != 1 {
		t.Errorf("%d backends above their residual, want 1: %s", n, d)
	}

	// Back to coder: woken, not started; llama unloads (its unit stays up).
	evs, err = f.switchTo(t, "coder")
	if err != nil {
		t.Fatalf("switch back to coder: %v\n%s", err, describe(evs))
	}
	if got := strings.Join(stepsOf(evs), " "); got != "standby wake ready verify wake_check" {
		t.Errorf("llama → coder steps = %q, want a wake and no start", got)
	}
	st = f.sup.State()
	if st.Profile != "coder" || len(st.Standby) != 1 || st.Standby[0].Profile != "llama" || st.Standby[0].Mode != "unload" {
		t.Fatalf("state after llama → coder: %+v", st)
	}
	if n, d := f.holders(t); n != 1 {
		t.Errorf("%d backends above their residual, want 1: %s", n, d)
	}

	// And to llama again: its model loads into the running server.
	evs, err = f.switchTo(t, "llama")
	if err != nil {
		t.Fatalf("switch to llama again: %v\n%s", err, describe(evs))
	}
	if got := strings.Join(stepsOf(evs), " "); got != "standby wake ready verify wake_check" {
		t.Errorf("coder → llama (warm) steps = %q", got)
	}
	if n, d := f.holders(t); n != 1 {
		t.Errorf("%d backends above their residual, want 1: %s", n, d)
	}

	// The doctor sees both units running, one in standby, and no fault.
	rep := (&Doctor{Cfg: f.cfg, GPU: f.gpu, Units: f.sup.units, Exclusion: f.sup.Exclusion}).Run(context.Background())
	for _, c := range rep.Checks {
		switch c.ID {
		case "units.exclusive", "standby.residual", "standby.exclusion", "units.conflicts":
			if c.Severity != "ok" {
				t.Errorf("doctor %s = %s: %s", c.ID, c.Severity, c.Message)
			}
		}
	}
}

func TestStandbyWatcherPutsAWokenBackendBack(t *testing.T) {
	f := newProcFixtureYAML(t, standbyYAML(t))
	awaitReconciled(t, f.sup)
	for _, p := range []string{"coder", "llama"} {
		if evs, err := f.switchTo(t, p); err != nil {
			t.Fatalf("switch to %s: %v\n%s", p, err, describe(evs))
		}
	}
	since := f.sup.LastSeq()
	// Someone wakes the sleeping vLLM behind gpuhost's back.
	port := f.cfg.Profiles["coder"].Port
	resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/wake_up", port), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("hand wake_up: %s", resp.Status)
	}
	var msg string
	ok := testkit.Poll(30*time.Second, func() bool {
		_, evs, cancel := f.sup.Subscribe(since)
		cancel()
		for _, e := range evs {
			if e.Kind == "exclusion" {
				msg = e.Message
				return true
			}
		}
		return false
	})
	if !ok {
		t.Fatal("no exclusion event after a hand wake_up of the sleeping backend")
	}
	if !strings.Contains(msg, "put back into standby") {
		t.Errorf("exclusion event: %q", msg)
	}
	if n, _, _ := f.sup.Exclusion(); n != 1 {
		t.Errorf("exclusion count = %d, want 1", n)
	}
	if n, d := f.holders(t); n != 1 {
		t.Errorf("after the watcher: %d backends above their residual, want 1: %s", n, d)
	}
	rep := (&Doctor{Cfg: f.cfg, GPU: f.gpu, Units: f.sup.units, Exclusion: f.sup.Exclusion}).Run(context.Background())
	for _, c := range rep.Checks {
		if c.ID == "standby.exclusion" && c.Severity != "fail" {
			t.Errorf("doctor standby.exclusion = %s after a violation: %s", c.Severity, c.Message)
		}
	}
	if st := f.sup.State(); st.Profile != "llama" || len(st.Standby) != 1 {
		t.Errorf("state after the watcher: %+v", st)
	}
}

func TestStandbySurvivesADaemonRestart(t *testing.T) {
	yaml := standbyYAML(t)
	f := newProcFixtureYAML(t, yaml)
	awaitReconciled(t, f.sup)
	for _, p := range []string{"coder", "llama"} {
		if evs, err := f.switchTo(t, p); err != nil {
			t.Fatalf("switch to %s: %v\n%s", p, err, describe(evs))
		}
	}
	// A second Supervisor over the same state dir and units reads the
	// standby back and checks it against the sleeping server.
	sf := readStandbyFile(f.cfg, discardLog)
	if e, ok := sf.Units[f.cfg.Backends.VLLM.Unit]; !ok || e.Profile != "coder" || sf.ResidualMiB["coder"] == 0 {
		t.Fatalf("standby.json after coder → llama: %+v", sf)
	}
	s2 := NewSupervisor(f.cfg, f.gpu, f.sup.units, nil, discardLog)
	s2.checkStandbyAtStart(context.Background())
	st := s2.Reconcile(context.Background())
	if st.Phase != api.PhaseActive || st.Profile != "llama" || len(st.Standby) != 1 || st.Standby[0].Profile != "coder" {
		t.Errorf("a restarted Supervisor sees %+v, want llama active and coder in standby (not two active backends)", st)
	}
}

// awaitReconciled waits until Run has reconciled once.
func awaitReconciled(t testing.TB, s *Supervisor) {
	t.Helper()
	select {
	case <-s.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("Supervisor not ready")
	}
}

// hookGPU runs a hook once, right after the next Snapshot it serves, to
// make something happen between a reader's NVML reading and what it does
// with it.
type hookGPU struct {
	GPU
	mu   sync.Mutex
	hook func()
}

func (h *hookGPU) Snapshot(ctx context.Context) (nvml.Snapshot, error) {
	snap, err := h.GPU.Snapshot(ctx)
	h.mu.Lock()
	fn := h.hook
	h.hook = nil
	h.mu.Unlock()
	if fn != nil {
		fn()
	}
	return snap, err
}

// HostMemAvailableMiB passes the simulated host RAM through, so the
// standby choice sees what it sees without the hook.
func (h *hookGPU) HostMemAvailableMiB(ctx context.Context) (uint64, error) {
	return h.GPU.(interface {
		HostMemAvailableMiB(context.Context) (uint64, error)
	}).HostMemAvailableMiB(ctx)
}

// TestStandbyWatcherSparesAWokenTarget is the watcher's race with a
// switch: it reads the units in standby and NVML without the switch lock,
// so a switch back to the sleeping backend can wake it (above its residual
// and still listed) and finish before the watcher takes the lock. The
// watcher must then see that the backend serves and leave it alone, not
// put the active backend to sleep on its stale reading.
func TestStandbyWatcherSparesAWokenTarget(t *testing.T) {
	yaml := standbyYAML(t)
	f := newProcFixtureYAML(t, func(bin, state string) string {
		// No watcher rounds of its own: this test runs the one round.
		return strings.Replace(yaml(bin, state), "standby_watch_interval: 100ms", "standby_watch_interval: 1h", 1)
	})
	awaitReconciled(t, f.sup)
	hg := &hookGPU{GPU: f.sup.gpu}
	f.sup.gpu = hg // before any switch; Run is past its last read of it
	for _, p := range []string{"coder", "llama"} {
		if evs, err := f.switchTo(t, p); err != nil {
			t.Fatalf("switch to %s: %v\n%s", p, err, describe(evs))
		}
	}
	// coder above its residual while still listed in standby: as in the
	// middle of a switch's wake step (here a wake_up by hand stands in for
	// the half-done wake, so the reading is certain).
	port := f.cfg.Profiles["coder"].Port
	resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/wake_up", port), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	// Between the watcher's reading and its lock, the switch to coder
	// completes: coder woken (a no-op wake), llama in standby, coder active.
	var switchErr error
	hg.mu.Lock()
	hg.hook = func() {
		evs, err := f.switchTo(t, "coder")
		if err != nil {
			switchErr = fmt.Errorf("%w\n%s", err, describe(evs))
		}
	}
	hg.mu.Unlock()
	f.sup.watch.enforceStandby(context.Background())
	if switchErr != nil {
		t.Fatalf("switch to coder: %v", switchErr)
	}
	if st := f.sup.State(); st.Phase != api.PhaseActive || st.Profile != "coder" {
		t.Fatalf("state after the switch back: %+v", st)
	}
	if n, _, msg := f.sup.Exclusion(); n != 0 {
		t.Errorf("the watcher acted on the serving backend: %d exclusions, %q", n, msg)
	}
	if f.sup.engineSleeping(context.Background(), f.cfg.Profiles["coder"]) {
		t.Error("the active coder was put back to sleep on a reading from before the switch")
	}
	if n, d := f.holders(t); n != 1 {
		t.Errorf("%d backends above their residual, want 1: %s", n, d)
	}
}

// TestStandbyFirstSleepOfASleepingBackend: a vLLM put to sleep by hand
// before gpuhost ever measured its residual is measured where it is,
// not stopped after the release timeout for "not coming down".
//
// The standby watcher looks only once an hour here: at its usual 100 ms
// it may find the hand sleep first and wake the active coder (the drift
// rule for a sleeping active backend, tested elsewhere), and the switch
// below is then refused as busy (CI under load).
func TestStandbyFirstSleepOfASleepingBackend(t *testing.T) {
	yaml := standbyYAML(t)
	f := newProcFixtureYAML(t, func(bin, state string) string {
		return strings.Replace(yaml(bin, state), "standby_watch_interval: 100ms", "standby_watch_interval: 1h", 1)
	})
	awaitReconciled(t, f.sup)
	if evs, err := f.switchTo(t, "coder"); err != nil {
		t.Fatalf("switch to coder: %v\n%s", err, describe(evs))
	}
	resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/sleep?level=1", f.cfg.Profiles["coder"].Port), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	evs, err := f.switchTo(t, "llama")
	if err != nil {
		t.Fatalf("switch to llama: %v\n%s", err, describe(evs))
	}
	if got := strings.Join(stepsOf(evs), " "); !strings.HasPrefix(got, "standby vram_release configure start") || strings.Contains(got, "stop") {
		t.Errorf("steps = %q: the sleeping coder must go into standby, not be stopped", got)
	}
	if st := f.sup.State(); len(st.Standby) != 1 || st.Standby[0].Profile != "coder" || st.Standby[0].ResidualMiB == 0 || st.Standby[0].ResidualMiB > 1024 {
		t.Errorf("standby after a hand sleep: %+v", st.Standby)
	}
}
