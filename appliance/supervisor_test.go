package appliance

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/config"
	"gpuhost/internal/testkit"
	"gpuhost/nvml"
)

// procFixture runs a Supervisor over the process runner with simulator
// backends (real processes, real HTTP, simulated GPU memory).
type procFixture struct {
	cfg    *config.Config
	sup    *Supervisor
	gpu    GPU
	cancel context.CancelFunc
	done   chan error
}

func newProcFixture(t *testing.T, vllmLoad string, tune ...func(*config.Config)) *procFixture {
	t.Helper()
	return newProcFixtureYAML(t, func(bin, state string) string {
		return testConfigYAML(bin, state, "process", "", testkit.FreePort(t), testkit.FreePort(t), vllmLoad)
	}, tune...)
}

// newProcFixtureYAML is newProcFixture with the config text made by yaml
// from the gpuhost binary and the state directory. Each tune changes the
// parsed config before the Supervisor starts: its goroutines read the
// config, so a test must not change it once Run is running.
func newProcFixtureYAML(t testing.TB, yaml func(bin, state string) string, tune ...func(*config.Config)) *procFixture {
	t.Helper()
	bin := gpuhostBinary(t)
	state := t.TempDir()
	cfg, err := config.Parse("test", []byte(yaml(bin, state)))
	if err != nil {
		t.Fatal(err)
	}
	*cfg.Switch.RestoreOnBoot = false
	for _, f := range tune {
		f(cfg)
	}
	gpu, u, journal, log, closeAll := openTestCore(t, cfg)
	sup := NewSupervisor(cfg, gpu, u, journal, log)
	ctx, cancel := context.WithCancel(context.Background())
	f := &procFixture{cfg: cfg, sup: sup, gpu: gpu, cancel: cancel, done: make(chan error, 1)}
	go func() { f.done <- sup.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-f.done
		sup.Close()
		closeAll()
	})
	return f
}

// openTestCore opens cfg's GPU and units as the daemon does, with a log
// that is quiet unless the test runs verbose; closeAll closes both.
func openTestCore(t testing.TB, cfg *config.Config) (GPU, Units, JournalFunc, *slog.Logger, func()) {
	t.Helper()
	gpu, closeGPU, err := OpenGPU(cfg)
	if err != nil {
		t.Fatal(err)
	}
	u, journal, closeUnits, err := OpenUnits(context.Background(), cfg)
	if err != nil {
		closeGPU()
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.Default()
	}
	return gpu, u, journal, log, func() {
		closeUnits()
		closeGPU()
	}
}

func (f *procFixture) switchTo(t testing.TB, profile string) ([]api.Event, error) {
	t.Helper()
	since := f.sup.LastSeq()
	id, done, err := f.sup.Switch(context.Background(), profile, api.SwitchOptions{})
	if err != nil {
		t.Fatalf("switch %s: %v", profile, err)
	}
	evs := collect(t, f.sup, since, id, 60*time.Second)
	return evs, <-done
}

func (f *procFixture) usedMiB(t *testing.T) uint64 {
	t.Helper()
	s, err := f.gpu.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	d, _ := s.Device0()
	return d.MemoryUsedMiB
}

func TestSwitchReleasesAndReallocatesVRAM(t *testing.T) {
	f := newProcFixture(t, "200ms")

	evs, err := f.switchTo(t, "coder")
	if err != nil {
		t.Fatalf("switch to coder: %v%s", err, describe(evs))
	}
	st := f.sup.State()
	if st.Phase != api.PhaseActive || st.Profile != "coder" || st.Unit != "gpuhost-vllm.service" {
		t.Fatalf("state after switch = %+v", st)
	}
	// vLLM claims gpu_memory_utilization × total.
	want := uint64(22598) // 0.92 × 24564
	if used := f.usedMiB(t); used < want || used > want+600 {
		t.Errorf("VRAM used with vLLM active = %d MiB, want about %d", used, want)
	}
	for _, step := range []string{"vram_release", "configure", "start", "ready", "verify"} {
		if _, ok := stepEvent(evs, step, "done"); !ok {
			t.Errorf("no %s step in the first switch:%s", step, describe(evs))
		}
	}
	if _, ok := stepEvent(evs, "stop", "started"); ok {
		t.Error("nothing ran, so nothing should have been stopped")
	}

	evs, err = f.switchTo(t, "llama")
	if err != nil {
		t.Fatalf("switch to llama: %v%s", err, describe(evs))
	}
	rel, ok := stepEvent(evs, "vram_release", "done")
	if !ok {
		t.Fatalf("no vram_release step:%s", describe(evs))
	}
	if used, _ := rel.Detail["used_mib"].(uint64); used > 1024 {
		t.Errorf("VRAM at release = %v MiB, want near the idle baseline", rel.Detail["used_mib"])
	}
	order := []string{}
	for _, e := range evs {
		if e.Kind == "step" && e.Status == "done" {
			order = append(order, e.Step)
		}
	}
	if got := strings.Join(order, ","); got != "stop,vram_release,configure,start,ready,load_model,verify,wake_check" {
		t.Errorf("step order = %s", got)
	}
	if used := f.usedMiB(t); used < 6200 || used > 7000 {
		t.Errorf("VRAM with the 8B Ollama model loaded = %d MiB, want about 6200", used)
	}
	vst, _ := f.sup.units.Unit(context.Background(), "gpuhost-vllm.service")
	if vst.Active() {
		t.Errorf("vLLM unit still %s after switching to Ollama", vst.ActiveState)
	}

	// A switch to the profile that already runs is a quick no-op.
	evs, err = f.switchTo(t, "llama")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := stepEvent(evs, "start", "started"); ok {
		t.Errorf("re-switch to the active profile restarted it:%s", describe(evs))
	}
}

func TestSecondSwitchWhileBusyIsRefused(t *testing.T) {
	f := newProcFixture(t, "1500ms")
	since := f.sup.LastSeq()
	id, done, err := f.sup.Switch(context.Background(), "coder", api.SwitchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = f.sup.Switch(context.Background(), "llama", api.SwitchOptions{})
	var be *api.BusyError
	if !errors.As(err, &be) || be.Target != "coder" || be.SwitchID != id {
		t.Fatalf("second switch: got %v, want BusyError naming coder/%s", err, id)
	}
	collect(t, f.sup, since, id, 60*time.Second)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestUnknownProfileAndDoctorRefusal(t *testing.T) {
	f := newProcFixture(t, "10ms")
	_, _, err := f.sup.Switch(context.Background(), "nope", api.SwitchOptions{})
	if !errors.Is(err, api.ErrUnknownProfile) || !strings.Contains(err.Error(), "coder, coder-greedy, llama") {
		t.Fatalf("unknown profile error = %v", err)
	}
	_, _, err = f.sup.Switch(context.Background(), "coder-greedy", api.SwitchOptions{})
	var de *api.DoctorError
	if !errors.As(err, &de) {
		t.Fatalf("0.96 utilisation should fail doctor, got %v", err)
	}
	found := false
	for _, c := range de.Checks {
		if c.ID == "profile.gpu_memory_utilization" {
			found = true
		}
	}
	if !found {
		t.Errorf("doctor refusal does not name the utilisation check: %v", de)
	}
	if st := f.sup.State(); st.Phase != api.PhaseIdle {
		t.Errorf("a refused switch changed the state: %+v", st)
	}
	// Forced, it runs.
	since := f.sup.LastSeq()
	id, done, err := f.sup.Switch(context.Background(), "coder-greedy", api.SwitchOptions{Force: true})
	if err != nil {
		t.Fatal(err)
	}
	collect(t, f.sup, since, id, 60*time.Second)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestCrashWhileLoadingRollsBackWithJournal(t *testing.T) {
	f := newProcFixture(t, "10ms")
	if _, err := f.switchTo(t, "llama"); err != nil {
		t.Fatal(err)
	}
	// Occupy the vLLM port: the simulator fails to bind after loading and
	// exits non-zero, like a backend crashing while loading.
	ln, err := net.Listen("tcp", "127.0.0.1:"+itoa(f.cfg.Profiles["coder"].Port))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	evs, err := f.switchTo(t, "coder")
	if err == nil {
		t.Fatalf("switch should fail:%s", describe(evs))
	}
	if !strings.Contains(err.Error(), "rolled back to llama") {
		t.Errorf("error %q does not report the rollback", err)
	}
	var failed *api.Event
	for i := range evs {
		if evs[i].Kind == "step" && evs[i].Status == "failed" {
			failed = &evs[i]
			break
		}
	}
	if failed == nil || len(failed.Journal) == 0 {
		t.Fatalf("failed step carries no journal tail:%s", describe(evs))
	}
	if j := strings.Join(failed.Journal, "\n"); !strings.Contains(j, "address already in use") {
		t.Errorf("journal tail does not show why: %s", j)
	}
	st := f.sup.State()
	if st.Phase != api.PhaseActive || st.Profile != "llama" || !strings.Contains(st.LastError, "coder") {
		t.Errorf("after rollback state = %+v", st)
	}
	if _, ok := stepEvent(evs, "rollback.verify", "done"); !ok {
		t.Errorf("no rollback steps:%s", describe(evs))
	}
}

func TestVRAMHeldByForeignProcessTimesOut(t *testing.T) {
	f := newProcFixture(t, "10ms", func(c *config.Config) {
		*c.Switch.Rollback = false
		c.GPU.ReleaseTimeout = config.Duration(300 * time.Millisecond)
	})
	// A foreign process holds 20 GiB in the simulated GPU.
	cmd := startSleeper(t)
	if err := nvml.WriteClaim(f.cfg.GPU.SimDir, nvml.Claim{PID: cmd.Process.Pid, MiB: 20480, Name: "foreign"}); err != nil {
		t.Fatal(err)
	}
	evs, err := f.switchTo(t, "coder")
	if err == nil {
		t.Fatal("switch should fail while a foreign process holds the VRAM")
	}
	e, ok := stepEvent(evs, "vram_release", "failed")
	if !ok {
		t.Fatalf("no failed vram_release step:%s", describe(evs))
	}
	for _, w := range []string{"not released within 300ms", "20498 MiB used", "foreign"} {
		if !strings.Contains(e.Message, w) {
			t.Errorf("message %q lacks %q", e.Message, w)
		}
	}
	if st := f.sup.State(); st.Phase != api.PhaseFailed {
		t.Errorf("state = %+v, want failed", st)
	}
}
