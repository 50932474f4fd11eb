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

// TestHandPinOntoAnotherLanesGPU: coder serves on GPU 0 and coder1 on
// GPU 1. The operator pins coder1's unit to GPU 0 by hand (its environment
// file) and restarts it. GPU 1's lane follows the restart with a switch
// whose verify finds the backend's memory on GPU 0, outside its lane, and
// stops it; the heal starts it again with the environment gpuhost writes,
// pinned to GPU 1. coder serves throughout.
func TestHandPinOntoAnotherLanesGPU(t *testing.T) {
	f := newBoxFixture(t)
	f.switchTo(t, "coder")
	f.switchTo(t, "coder1")
	gpu0, gpu1 := f.uuids(t)
	lane1 := f.box.Lane("gpu1")
	unit := lane1.cfg.Backends.VLLM.Unit
	path := lane1.cfg.EnvFilePath(unit)
	f.rewrite(t, path, gpu1, gpu0)
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
		return e.Kind == api.EventStep && e.Step == api.StepVerify && e.Status == api.StatusFailed
	})
	if last := evs[len(evs)-1]; !strings.Contains(last.Message, "on GPU 0, outside its lane GPU 1") {
		t.Fatalf("verify failed with %q; want it to name GPU 0 outside the lane", last.Message)
	}
	if !testkit.Poll(60*time.Second, func() bool {
		st := api.Status{State: f.box.State()}
		return laneServes(st, "GPU 0", "coder") && laneServes(st, "GPU 1", "coder1")
	}) {
		t.Fatalf("the lanes did not settle: %s", lanesLine(api.Status{State: f.box.State()}))
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), gpu1) || strings.Contains(string(data), gpu0) {
		t.Fatalf("%s after the heal does not pin GPU 1 alone:\n%s", path, data)
	}
	if v := f.box.CheckExclusion(context.Background()); v != 0 {
		t.Fatalf("the box finds %d violations after the heal", v)
	}
}

// TestBoxEvictsTheLaneThatDidNotClaim: the box's check, given two backends
// above their residual on one GPU, counts the violation and stops the
// backend whose lane did not claim that GPU (drift wrong_gpu), leaving that
// lane wanting nothing; the claiming lane keeps serving.
func TestBoxEvictsTheLaneThatDidNotClaim(t *testing.T) {
	f := newBoxFixture(t)
	f.switchTo(t, "coder")
	f.switchTo(t, "coder1")
	lane0, lane1 := f.box.Lane(""), f.box.Lane("gpu1")
	ctx := context.Background()
	units0, err := lane0.backends(ctx)
	if err != nil {
		t.Fatal(err)
	}
	units1, err := lane1.backends(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// What NVML would show had coder1's backend taken memory on GPU 0.
	d := nvml.Device{Index: 0, Processes: []nvml.Process{
		{PID: units0[0].status.MainPID, UsedMiB: 20000}, {PID: units1[0].status.MainPID, UsedMiB: 3000}}}
	running := []laneUnit{{lane: 0, b: units0[0]}, {lane: 2, b: units1[0]}}
	if f.box.lanes[2] != lane1 {
		t.Fatalf("lane order: %v", f.box.specs)
	}
	above := f.box.aboveResidual(d, running)
	if len(above) != 2 {
		t.Fatalf("above the residual on GPU 0: %d units, want 2", len(above))
	}
	since := f.box.LastSeq()
	f.box.violation(ctx, d, above, lane0)
	evs := waitEvent(t, lane1, since, 30*time.Second, func(e api.Event) bool {
		return e.Kind == api.EventExclusion && e.Detail[api.DetailDrift] == driftWrongGPU
	})
	if evs[0].Kind != api.EventExclusion || evs[0].Detail[api.DetailDrift] != driftGPUShared {
		t.Errorf("first event %s %v; want the gpu_shared violation", evs[0].Kind, evs[0].Detail)
	}
	us, err := f.units.Unit(ctx, units1[0].unit)
	if err != nil || us.Active() {
		t.Fatalf("%s after the eviction: %+v %v", units1[0].unit, us, err)
	}
	st := api.Status{State: f.box.State()}
	if !laneServes(st, "GPU 0", "coder") {
		t.Fatalf("coder no longer serves GPU 0: %s", lanesLine(st))
	}
	for _, l := range st.State.Lanes {
		if l.Lane == "GPU 1" && (l.LastWanted != "" || l.Phase == api.PhaseActive) {
			t.Errorf("GPU 1's lane after the eviction: %s, last wanted %q", api.StatusLine(l, nil), l.LastWanted)
		}
	}
	samples, violations := f.box.ExclusionSamples()
	byKind, _, _, _ := f.box.Drift()
	if violations != 1 || byKind[driftWrongGPU] != 1 {
		t.Errorf("violations %d (samples %d), drift %v; want one violation and one wrong_gpu", violations, samples, byKind)
	}
}

// uuids are the simulated GPUs' UUIDs.
func (f *boxFixture) uuids(t *testing.T) (gpu0, gpu1 string) {
	t.Helper()
	snap, err := f.gpu.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	d0, _ := snap.Device(0)
	d1, _ := snap.Device(1)
	return d0.UUID, d1.UUID
}

// rewrite replaces from with to in the file at path, which must hold it.
func (f *boxFixture) rewrite(t *testing.T, path, from, to string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), from) {
		t.Fatalf("%s does not hold %s:\n%s", path, from, data)
	}
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(string(data), from, to)), 0o644); err != nil {
		t.Fatal(err)
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
