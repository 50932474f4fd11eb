package appliance

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/config"
	"gpuhost/internal/testkit"
	"gpuhost/nvml"
	"gpuhost/units"
)

// boxFixture runs a Box of several lanes over the process runner with
// simulator backends.
type boxFixture struct {
	cfg   *config.Config
	box   *Box
	gpu   GPU
	units Units
}

// newBoxFixture starts a Box on the end-to-end config turned into a
// two-GPU box (lanesYAML): coder on GPU 0, coder1 on GPU 1, coder-tp on
// both; llama (GPU 0) unloads into standby, so no unit conflicts with
// another and only gpuhost keeps the rule per GPU.
func newBoxFixture(t *testing.T) *boxFixture {
	t.Helper()
	bin := gpuhostBinary(t)
	state := t.TempDir()
	y := testConfigYAML(bin, state, "process", "", testkit.FreePort(t), testkit.FreePort(t), "50ms")
	y = strings.Replace(y, "    sim: {load_time: 50ms, vram_mib: 6200}\n", "    standby: unload\n    sim: {load_time: 50ms, vram_mib: 6200}\n", 1)
	y = lanesYAML(testkit.FreePort(t), testkit.FreePort(t))(y)
	cfg, err := config.Parse("test", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	*cfg.Switch.RestoreOnBoot = false
	gpu, u, journal, log, closeAll := openTestCore(t, cfg)
	box := NewBox(cfg, gpu, u, journal, log)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- box.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		box.Close()
		closeAll()
	})
	select {
	case <-box.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("the box did not get ready")
	}
	return &boxFixture{cfg: cfg, box: box, gpu: gpu, units: u}
}

// switchTo switches the profile's lane and waits for the switch's end.
func (f *boxFixture) switchTo(t *testing.T, profile string) []api.Event {
	t.Helper()
	lane := f.box.LaneOf(profile)
	since := f.box.LastSeq()
	id, done, err := f.box.Switch(context.Background(), profile, api.SwitchOptions{})
	if err != nil {
		t.Fatalf("switch %s: %v", profile, err)
	}
	evs := collect(t, lane, since, id, 60*time.Second)
	if err := <-done; err != nil {
		t.Fatalf("switch %s: %v%s", profile, err, describe(evs))
	}
	return evs
}

// TestBoxStopsAUnitOnAnotherLanesGPU: coder serves on GPU 0 and coder1 on
// GPU 1. The operator pins coder1's unit to GPU 0 by hand (its environment
// file) and restarts it: GPU 1's lane follows the restart, but its backend
// now holds memory on GPU 0, beside coder. The box's per-GPU check finds
// two backends above their residual on GPU 0 and stops the one whose lane
// did not claim GPU 0 (drift wrong_gpu); coder keeps serving.
func TestBoxStopsAUnitOnAnotherLanesGPU(t *testing.T) {
	f := newBoxFixture(t)
	f.switchTo(t, "coder")
	f.switchTo(t, "coder1")
	st := f.box.State()
	if !laneServes(api.Status{State: st}, "GPU 0", "coder") || !laneServes(api.Status{State: st}, "GPU 1", "coder1") {
		t.Fatalf("both lanes should serve: %s", lanesLine(api.Status{State: st}))
	}
	snap, err := f.gpu.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	gpu0, _ := snap.Device(0)
	gpu1, _ := snap.Device(1)
	lane1 := f.box.Lane("gpu1")
	unit := lane1.cfg.Backends.VLLM.Unit
	path := lane1.cfg.EnvFilePath(unit)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), gpu1.UUID) {
		t.Fatalf("%s does not pin GPU 1 (%s):\n%s", path, gpu1.UUID, data)
	}
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(string(data), gpu1.UUID, gpu0.UUID)), 0o644); err != nil {
		t.Fatal(err)
	}
	since := f.box.LastSeq()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := f.units.Stop(ctx, unit); err != nil {
		t.Fatal(err)
	}
	if err := f.units.Start(ctx, unit); err != nil {
		t.Fatal(err)
	}
	evs := waitEvent(t, lane1, since, 60*time.Second, func(e api.Event) bool {
		return e.Kind == api.EventExclusion && e.Detail[api.DetailDrift] == driftWrongGPU
	})
	var found bool
	for _, e := range evs {
		if e.Kind == api.EventExclusion && e.Status == api.StatusFailed && e.Detail[api.DetailDrift] == driftGPUShared && strings.Contains(e.Message, "GPU 0:") {
			found = true
		}
	}
	if !found {
		t.Errorf("no gpu_shared exclusion event for GPU 0 before the eviction:%s", describe(evs))
	}
	if !testkit.Poll(30*time.Second, func() bool {
		us, err := f.units.Unit(context.Background(), unit)
		return err == nil && !us.Active()
	}) {
		t.Fatalf("%s still runs on GPU 0 beside coder", unit)
	}
	st = f.box.State()
	if !laneServes(api.Status{State: st}, "GPU 0", "coder") {
		t.Fatalf("coder no longer serves GPU 0: %s", lanesLine(api.Status{State: st}))
	}
	samples, violations := f.box.ExclusionSamples()
	if violations == 0 || samples < violations {
		t.Errorf("exclusion samples %d, violations %d; want the violation counted", samples, violations)
	}
	byKind, _, _, _ := f.box.Drift()
	if byKind[driftWrongGPU] == 0 {
		t.Errorf("drift %v: want wrong_gpu", byKind)
	}
	// GPU 1's lane wants nothing now: no heal brings the unit back.
	for _, l := range st.Lanes {
		if l.Lane == "GPU 1" && (l.LastWanted != "" || l.Phase == api.PhaseActive) {
			t.Errorf("GPU 1's lane after the eviction: %s, last wanted %q", api.StatusLine(l, nil), l.LastWanted)
		}
	}
}

// TestBoxOneLaneIsItsSupervisor: a config without gpus makes a Box of one
// lane that claims nothing and runs no per-GPU check: its Supervisor has
// no box, and its state has no lanes.
func TestBoxOneLaneIsItsSupervisor(t *testing.T) {
	bin := gpuhostBinary(t)
	cfg, err := config.Parse("test", []byte(testConfigYAML(bin, t.TempDir(), "process", "", testkit.FreePort(t), testkit.FreePort(t), "50ms")))
	if err != nil {
		t.Fatal(err)
	}
	box := NewBox(cfg, nil, nil, nil, nil)
	if len(box.Lanes()) != 1 || box.Lanes()[0].box != nil || box.Lanes()[0].cfg != cfg {
		t.Fatalf("lanes %d, box %v", len(box.Lanes()), box.Lanes()[0].box)
	}
	if st := box.State(); st.Lanes != nil || st.Lane != "" {
		t.Fatalf("one lane's state has lanes: %+v", st)
	}
	if got := box.LaneOf("llama"); got != box.Lanes()[0] {
		t.Fatal("LaneOf on one lane")
	}
}

// TestPerGPUExclusionCheck: the doctor's gpus.exclusive fails exactly when
// one GPU has two units above what each may hold (its residual in
// standby, else the tolerance).
func TestPerGPUExclusionCheck(t *testing.T) {
	a := backendState{unit: "gpuhost-vllm.service", profile: "coder", status: api.UnitStatus{Name: "gpuhost-vllm.service", ActiveState: "active", MainPID: 1_000_001}}
	b := backendState{unit: "gpuhost-vllm-gpu1.service", profile: "coder1", status: api.UnitStatus{Name: "gpuhost-vllm-gpu1.service", ActiveState: "active", MainPID: 1_000_002}}
	dev := func(index int, procs ...nvml.Process) nvml.Device { return nvml.Device{Index: index, Processes: procs} }
	tests := []struct {
		name   string
		devs   []nvml.Device
		limits map[string]uint64
		want   units.Severity
	}{
		{"one per GPU", []nvml.Device{dev(0, nvml.Process{PID: 1_000_001, UsedMiB: 20000}), dev(1, nvml.Process{PID: 1_000_002, UsedMiB: 20000})}, nil, units.SeverityOK},
		{"two on GPU 0", []nvml.Device{dev(0, nvml.Process{PID: 1_000_001, UsedMiB: 20000}, nvml.Process{PID: 1_000_002, UsedMiB: 3000}), dev(1)}, nil, units.SeverityFail},
		{"the second in standby at its residual", []nvml.Device{dev(0, nvml.Process{PID: 1_000_001, UsedMiB: 20000}, nvml.Process{PID: 1_000_002, UsedMiB: 500})},
			map[string]uint64{"gpuhost-vllm-gpu1.service": 512 + residualToleranceMiB}, units.SeverityOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			limits := map[string]uint64{a.unit: residualToleranceMiB, b.unit: residualToleranceMiB}
			for k, v := range tt.limits {
				limits[k] = v
			}
			c := perGPUExclusionCheck(tt.devs, []backendState{a, b}, limits)
			if c.Severity != tt.want {
				t.Fatalf("%s: %s %s", tt.name, c.Severity, c.Message)
			}
		})
	}
}
