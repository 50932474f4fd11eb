package appliance

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/internal/testkit"
	"gpuhost/nvml"
	"gpuhost/systemd"
)

// lanesYAML turns the end-to-end config into a two-GPU box: coder, its
// greedy variant and llama stay on GPU 0, coder1 runs on GPU 1 and
// coder-tp tensor parallel on both; no profile uses standby, so the units
// of lanes sharing a GPU conflict.
func lanesYAML(p1, ptp int) func(string) string {
	return func(y string) string {
		y = strings.Replace(y, "gpu:\n  backend: sim\n", "gpu:\n  backend: sim\n  sim:\n    devices: [{}, {}]\n", 1)
		return y + fmt.Sprintf(`  coder1:
    backend: vllm
    model: Qwen/Qwen3-Coder-30B-A3B-Instruct
    served_name: coder1
    port: %d
    gpus: [1]
    vllm: {gpu_memory_utilization: 0.92, max_num_seqs: 32, max_model_len: 32768, enable_auto_tool_choice: true, tool_call_parser: qwen3_xml}
    sim: {load_time: 400ms, decode_tps: 500}
  coder-tp:
    backend: vllm
    model: Qwen/Qwen3-Coder-30B-A3B-Instruct
    served_name: coder-tp
    port: %d
    gpus: [0, 1]
    vllm: {gpu_memory_utilization: 0.92, max_num_seqs: 32, max_model_len: 32768, enable_auto_tool_choice: true, tool_call_parser: qwen3_xml}
    sim: {load_time: 400ms, decode_tps: 500}
`, p1, ptp)
	}
}

// laneUnitsOf are every backend unit of the lanes config, as rendered.
func laneUnitsOf(e *e2e) []string {
	var out []string
	for _, bu := range e.cfg.BackendUnits() {
		out = append(out, bu.Name)
	}
	return out
}

// gpuSampleReport is the per-GPU sampler's report: samples taken (each
// two NVML snapshots between two reads of every unit's cgroup) and the
// samples in which one GPU had two units above the tolerance in both
// snapshots, by GPU.
type gpuSampleReport struct {
	Samples int            `json:"samples"`
	Double  map[string]int `json:"double"`
	Seconds float64        `json:"seconds"`
	Errors  int            `json:"errors"`
	First   string         `json:"first_violation"`
}

// startGPUSampler runs the per-GPU sampler child inside the private
// systemd.
func startGPUSampler(t testing.TB, e *e2e, state string) *sampler {
	t.Helper()
	return startSamplerEnv(t, e, "GPUHOST_SAMPLER_MODE=gpus",
		"GPUHOST_SAMPLER_UNITS="+strings.Join(laneUnitsOf(e), ","),
		"GPUHOST_SAMPLER_SIMDIR="+state+"/simgpu")
}

// gpuSamplerChild is TestSamplerChild with GPUHOST_SAMPLER_MODE=gpus: on
// each GPU, the units holding more than the residual tolerance.
func gpuSamplerChild(t *testing.T) {
	names := strings.Split(os.Getenv("GPUHOST_SAMPLER_UNITS"), ",")
	gpu := nvml.NewSim(nvml.SimConfig{Dir: os.Getenv("GPUHOST_SAMPLER_SIMDIR")})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m, err := systemd.ConnectPrivate(ctx, "/run/systemd/private")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	read := func() ([]api.UnitStatus, bool) {
		var sts []api.UnitStatus
		for _, n := range names {
			st, err := m.Unit(ctx, n)
			if err != nil {
				return nil, false
			}
			sts = append(sts, st)
		}
		return sts, true
	}
	// above: the units over the tolerance on each GPU of snap.
	above := func(snap nvml.Snapshot, sts []api.UnitStatus) map[int][]string {
		out := map[int][]string{}
		for _, d := range snap.Devices {
			for i, st := range sts {
				if unitUsedMiB(d, st) > residualToleranceMiB {
					out[d.Index] = append(out[d.Index], names[i])
				}
			}
		}
		return out
	}
	rep := gpuSampleReport{Double: map[string]int{}}
	sampleUntilStdinCloses(10*time.Millisecond, &rep.Seconds, &rep, func() {
		sts, ok := read()
		s1, err1 := gpu.Snapshot(ctx)
		s2, err2 := gpu.Snapshot(ctx)
		later, ok2 := read()
		if !ok || !ok2 || err1 != nil || err2 != nil {
			rep.Errors++
			return
		}
		rep.Samples++
		a1, a2 := above(s1, sts), above(s2, later)
		for g, us := range a1 {
			var both []string
			for _, u := range us {
				if slices.Contains(a2[g], u) {
					both = append(both, u)
				}
			}
			if len(both) > 1 {
				rep.Double[strconv.Itoa(g)]++
				if rep.First == "" {
					rep.First = fmt.Sprintf("GPU %d: %s", g, strings.Join(both, ", "))
				}
			}
		}
	})
}

// switchSpan is one switch as its events tell it: when it was asked for,
// when its first step began, when it ended, and whether it waited for a
// GPU another lane's switch held.
type switchSpan struct {
	profile          string
	asked, run, done time.Time
	waited           bool
	ok               bool
}

// spanOf folds one switch's events.
func spanOf(profile string, evs []api.Event) switchSpan {
	sp := switchSpan{profile: profile}
	for _, e := range evs {
		switch {
		case e.Kind == api.EventSwitch && e.Status == api.StatusStarted:
			sp.asked = e.Time
		case e.Kind == api.EventSwitch && e.Status == api.StatusInfo && strings.HasPrefix(e.Message, "waiting for GPU"):
			sp.waited = true
		case e.Kind == api.EventStep && e.Status == api.StatusStarted && sp.run.IsZero():
			sp.run = e.Time
		case e.Kind == api.EventSwitch && (e.Status == api.StatusDone || e.Status == api.StatusFailed):
			sp.done, sp.ok = e.Time, e.Status == api.StatusDone
		}
	}
	return sp
}

// switchTogether runs switches to profiles at once and returns their
// spans in the order of profiles.
func (e *e2e) switchTogether(t *testing.T, profiles ...string) []switchSpan {
	t.Helper()
	spans := make([]switchSpan, len(profiles))
	var wg sync.WaitGroup
	for i, p := range profiles {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			var evs []api.Event
			err := e.client.SwitchAndFollow(ctx, api.SwitchRequest{Profile: p}, func(ev api.Event) { evs = append(evs, ev) })
			if err != nil {
				t.Errorf("switch to %s: %v%s", p, err, describe(evs))
			}
			spans[i] = spanOf(p, evs)
		})
	}
	wg.Wait()
	return spans
}

// overlap is how long two spans ran (first step to end) at the same time.
func overlap(a, b switchSpan) time.Duration {
	start, end := a.run, a.done
	if b.run.After(start) {
		start = b.run
	}
	if b.done.Before(end) {
		end = b.done
	}
	if end.Before(start) {
		return 0
	}
	return end.Sub(start)
}

// TestSystemdLanesExclusionPerGPU: a box of two simulated GPUs under the
// private systemd, its units rendered per lane. Switches on disjoint GPU
// sets run at once and both finish; a tensor-parallel switch and a switch
// on one of its GPUs, asked for together, run one after the other; a unit
// started by hand on a GPU that another lane holds stops the holder
// (Conflicts=) and is followed, never run beside it. A sampler inside the
// private systemd reads every unit's cgroup and both GPUs throughout: on no
// GPU do two units hold memory at once.
func TestSystemdLanesExclusionPerGPU(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a private systemd")
	}
	state := t.TempDir()
	e := startE2EWith(t, "400ms", state, lanesYAML(testkit.FreePort(t), testkit.FreePort(t)), nil)
	units := laneUnitsOf(e)
	want := []string{"gpuhost-vllm.service", "gpuhost-ollama.service", "gpuhost-vllm-gpu0-1.service", "gpuhost-vllm-gpu1.service"}
	if !slices.Equal(units, want) {
		t.Fatalf("units rendered %v, want %v", units, want)
	}
	e.logOnFailure(t, 0)
	sampled := func(name string) func() gpuSampleReport {
		smp := startGPUSampler(t, e, state)
		return func() gpuSampleReport {
			rep := gpuSampleReport{}
			smp.stopInto(t, &rep)
			t.Logf("%s: per-GPU sampler %d samples in %.1f s, %d errors, samples with two units above the residual on one GPU: %v (first: %q)", name, rep.Samples, rep.Seconds, rep.Errors, rep.Double, rep.First)
			if rep.Samples == 0 {
				t.Fatalf("%s: the sampler took no sample", name)
			}
			return rep
		}
	}
	none := func(rep gpuSampleReport) {
		for g, n := range rep.Double {
			if n > 0 {
				t.Errorf("GPU %s had two units above the residual in %d samples (first: %s)", g, n, rep.First)
			}
		}
	}

	// 1. Disjoint GPU sets: both switches run at once.
	stop := sampled("disjoint switches")
	disjoint := e.switchTogether(t, "coder", "coder1")
	for _, sp := range disjoint {
		if !sp.ok || sp.waited {
			t.Fatalf("switch to %s: ok %v, waited for a GPU %v; want ok without waiting", sp.profile, sp.ok, sp.waited)
		}
	}
	ov := overlap(disjoint[0], disjoint[1])
	if ov <= 0 {
		t.Fatalf("switches on GPU 0 and GPU 1 did not overlap: coder ran %s–%s, coder1 %s–%s", disjoint[0].run.Format(time.StampMicro), disjoint[0].done.Format(time.StampMicro), disjoint[1].run.Format(time.StampMicro), disjoint[1].done.Format(time.StampMicro))
	}
	st := e.waitState(t, "both lanes serve", 30*time.Second, func(s api.Status) bool {
		return laneServes(s, "GPU 0", "coder") && laneServes(s, "GPU 1", "coder1")
	})
	t.Logf("disjoint switches overlapped %s (coder %s, coder1 %s)", ov, disjoint[0].done.Sub(disjoint[0].run), disjoint[1].done.Sub(disjoint[1].run))
	none(stop())

	// 2. Overlapping GPU sets: ordered.
	stop = sampled("overlapping switches")
	ordered := e.switchTogether(t, "coder-tp", "llama")
	first, second := ordered[0], ordered[1]
	if second.run.Before(first.run) {
		first, second = second, first
	}
	if !first.ok || !second.ok {
		t.Fatalf("overlapping switches: %+v", ordered)
	}
	if !second.waited || second.run.Before(first.done) {
		t.Fatalf("switch to %s began its steps at %s, before %s ended at %s (waited: %v); overlapping lanes must take turns",
			second.profile, second.run.Format(time.StampMicro), first.profile, first.done.Format(time.StampMicro), second.waited)
	}
	if ov := overlap(first, second); ov != 0 {
		t.Fatalf("overlapping switches ran together for %s", ov)
	}
	t.Logf("asked together: %s ran its steps %s–%s; %s waited for the GPU and ran %s–%s (overlap 0)", first.profile,
		first.run.Format("15:04:05.000"), first.done.Format("15:04:05.000"), second.profile, second.run.Format("15:04:05.000"), second.done.Format("15:04:05.000"))
	last := second.profile
	st = e.waitState(t, "the later switch serves alone on its GPUs", 30*time.Second, func(s api.Status) bool {
		return servesAnywhere(s, last) && !servesAnywhere(s, first.profile)
	})

	none(stop())

	// 3. A hand start on a GPU another lane holds: get coder-tp onto both
	// GPUs, then start coder1's unit (GPU 1) by hand.
	stop = sampled("hand start on a claimed GPU")
	e.switchTo(t, "coder-tp")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if out, err := e.sd.Systemctl(ctx, "start", "gpuhost-vllm-gpu1.service"); err != nil {
		t.Fatalf("hand start: %v %s", err, out)
	}
	st = e.waitState(t, "GPU 1's lane follows the hand start, GPU 0+1 gives way", 60*time.Second, func(s api.Status) bool {
		return laneServes(s, "GPU 1", "coder1") && !servesAnywhere(s, "coder-tp")
	})
	if got := e.isActive(t, "gpuhost-vllm-gpu0-1.service"); got == "active" {
		t.Fatalf("gpuhost-vllm-gpu0-1.service still %s beside the hand-started unit on GPU 1", got)
	}
	// GPU 0+1's lane settles without taking GPU 1 back: the operator's
	// hand start stopped it (Conflicts=), which is no crash to heal.
	st = e.waitState(t, "GPU 0+1's lane settles", 30*time.Second, func(s api.Status) bool {
		for _, l := range s.State.Lanes {
			if l.Lane == "GPU 0+1" {
				return l.Phase != api.PhaseSwitching && l.Step == ""
			}
		}
		return false
	})
	for _, l := range st.State.Lanes {
		if l.Lane == "GPU 0+1" && (l.LastWanted != "" || l.Phase != api.PhaseIdle) {
			// Anything still wanted there would be healed back over GPU 1.
			t.Fatalf("GPU 0+1's lane after the hand start on GPU 1: %s, last wanted %q, paused %q; want idle with nothing wanted", api.StatusLine(l, nil), l.LastWanted, l.Paused)
		}
	}
	if !laneServes(st, "GPU 1", "coder1") {
		t.Fatalf("GPU 1 no longer serves the hand-started coder1: %s", lanesLine(st))
	}

	none(stop())

	// 4. A unit pinned onto the wrong GPU by hand: coder serves GPU 0,
	// coder1's environment file is edited to GPU 0's UUID and its unit
	// restarted. GPU 1's lane follows the restart with a switch whose
	// verify finds the memory on GPU 0, outside the lane, and stops it; the
	// heal starts it again as gpuhost pins it, on GPU 1.
	stop = sampled("unit pinned by hand onto another lane's GPU")
	e.switchTo(t, "coder")
	e.pinWrong(t, ctx, "gpuhost-vllm-gpu1.service", 1, 0)
	var refused bool
	st = e.waitState(t, "coder1 back on GPU 1, coder on GPU 0", 60*time.Second, func(s api.Status) bool {
		for _, g := range s.GPUs {
			if g.Index == 0 && len(g.Holders) > 1 {
				return false
			}
		}
		return laneServes(s, "GPU 0", "coder") && laneServes(s, "GPU 1", "coder1")
	})
	ectx, ecancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer ecancel()
	_ = e.client.Events(ectx, "/api/events?since=0", func(ev api.Event) bool {
		if ev.Kind == api.EventStep && ev.Step == api.StepVerify && ev.Status == api.StatusFailed && strings.Contains(ev.Message, "on GPU 0, outside its lane GPU 1") {
			refused = true
			return false
		}
		return true
	})
	if !refused {
		t.Fatal("no verify refused the unit pinned onto GPU 0")
	}
	rep := stop()
	t.Logf("the wrong pin held GPU 0 beside coder for %d samples, until the follow switch's verify stopped it; restarted on GPU 1", rep.Double["0"])
	t.Logf("lanes at the end: %s", lanesLine(st))
	for _, l := range st.State.Lanes {
		t.Logf("lane %s: last wanted %q, paused %q", l.Lane, l.LastWanted, l.Paused)
	}
}

// pinWrong rewrites unit's environment file to pin it to GPU to instead of
// GPU from (by UUID) and restarts it by hand.
func (e *e2e) pinWrong(t *testing.T, ctx context.Context, unit string, from, to int) {
	t.Helper()
	st, err := e.client.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	uuid := map[int]string{}
	for _, g := range st.GPUs {
		uuid[g.Index] = g.UUID
	}
	lane, _ := e.cfg.LaneOf("coder1")
	path := e.cfg.LaneConfig(lane).EnvFilePath(unit)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), uuid[from]) {
		t.Fatalf("%s does not pin GPU %d:\n%s", path, from, data)
	}
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(string(data), uuid[from], uuid[to])), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := e.sd.Systemctl(ctx, "restart", unit); err != nil {
		t.Fatalf("hand restart: %v %s", err, out)
	}
}

// laneServes: the lane named lane has profile active and settled.
func laneServes(s api.Status, lane, profile string) bool {
	for _, l := range s.State.Lanes {
		if l.Lane == lane {
			return l.Phase == api.PhaseActive && l.Step == "" && l.Profile == profile
		}
	}
	return false
}

// servesAnywhere: some lane has profile active.
func servesAnywhere(s api.Status, profile string) bool {
	for _, l := range s.State.Lanes {
		if l.Phase == api.PhaseActive && l.Profile == profile {
			return true
		}
	}
	return false
}

// lanesLine is every lane's state in one line, for the log.
func lanesLine(s api.Status) string {
	var parts []string
	for _, l := range s.State.Lanes {
		parts = append(parts, l.Lane+": "+api.StatusLine(l, nil))
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}
