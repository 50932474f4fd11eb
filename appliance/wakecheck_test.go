package appliance

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/units"
)

// wakeFaultYAML is standbyYAML with the vLLM simulator's wake fault set
// and coder decoding at 100 tokens/s (the demo's order; at the fixture's
// 500 a half-speed decode is within the rate check's slack).
func wakeFaultYAML(t *testing.T, fault string) func(bin, state string) string {
	base := standbyYAML(t)
	return func(bin, state string) string {
		y := base(bin, state)
		if fault != "" {
			y = strings.Replace(y, "simulate, vllm,", "simulate, vllm, --wake-fault, "+fault+",", 1)
		}
		return strings.Replace(y, "decode_tps: 500}", "decode_tps: 100}", 1)
	}
}

// eventAt is the time of the first event of kind/step/status in evs.
func eventAt(evs []api.Event, kind api.EventKind, step string, status api.EventStatus) (api.Event, bool) {
	for _, e := range evs {
		if e.Kind == kind && e.Step == step && e.Status == status {
			return e, true
		}
	}
	return api.Event{}, false
}

// TestVerifiedWakeFaults: each of the simulator's wake faults is found by
// the verified wake (or, for the residual, by the standby step) and the
// profile recovers by a cold restart in the same switch (the residual: at
// the next); a healthy wake passes. The time from the wake to the recovery
// is logged.
func TestVerifiedWakeFaults(t *testing.T) {
	tests := []struct {
		fault, reason string
	}{
		{"", ""},
		{"hang", wakeReasonHang},
		{"output", wakeReasonOutput},
		{"slow", wakeReasonRate},
		{"residual", wakeReasonResidual},
	}
	for _, tt := range tests {
		t.Run("fault="+tt.fault, func(t *testing.T) {
			f := newProcFixtureYAML(t, wakeFaultYAML(t, tt.fault))
			awaitReconciled(t, f.sup)
			for _, p := range []string{"coder", "llama"} {
				if evs, err := f.switchTo(t, p); err != nil {
					t.Fatalf("switch to %s: %v\n%s", p, err, describe(evs))
				}
			}
			evs, err := f.switchTo(t, "coder")
			if err != nil {
				t.Fatalf("switch back to coder: %v\n%s", err, describe(evs))
			}
			if tt.fault == "residual" {
				// The wake holds; the next sleep keeps 4 GiB more.
				if evs, err = f.switchTo(t, "llama"); err != nil {
					t.Fatalf("switch to llama: %v\n%s", err, describe(evs))
				}
			}
			steps := strings.Join(stepsOf(evs), " ")
			fail, failed := eventAt(evs, "wake_check", "", "failed")
			switch {
			case tt.reason == "":
				if failed || steps != "standby wake ready verify wake_check" {
					t.Fatalf("a healthy wake: steps %q, failure %v\n%s", steps, fail.Message, describe(evs))
				}
				return
			case !failed:
				t.Fatalf("fault %s not found: steps %q\n%s", tt.fault, steps, describe(evs))
			case fail.Detail["reason"] != tt.reason:
				t.Errorf("reason = %v, want %s: %s", fail.Detail["reason"], tt.reason, fail.Message)
			}
			if by, _, last := f.sup.WakeFailures(); by[tt.reason] != 1 || !strings.HasPrefix(last, "coder: ") {
				t.Errorf("WakeFailures = %v, %q", by, last)
			}
			if tt.fault == "residual" {
				// Stopped instead of kept in standby; back to coder is cold.
				if st := f.sup.State(); len(st.Standby) != 0 || st.Profile != "llama" {
					t.Fatalf("state after a sleep above the residual: %+v", st)
				}
				if evs, err = f.switchTo(t, "coder"); err != nil {
					t.Fatalf("switch to coder after the residual fault: %v\n%s", err, describe(evs))
				}
				if got := strings.Join(stepsOf(evs), " "); got != "standby vram_release configure start ready verify wake_check" {
					t.Errorf("coder after the residual fault: steps %q, want a cold start", got)
				}
				if n, d := f.holders(t); n != 1 {
					t.Errorf("%d holders: %s", n, d)
				}
				return
			}
			want := "standby wake ready verify vram_release configure start ready verify wake_check"
			if steps != want {
				t.Errorf("steps = %q, want the wake then a cold start: %q", steps, want)
			}
			woke, _ := stepEvent(evs, "wake", "done")
			last := evs[len(evs)-1]
			if last.Kind != "switch" || last.Status != "done" {
				t.Fatalf("the switch did not end active: %s", describe(evs))
			}
			t.Logf("fault %s: %s; wake → recovered (cold restart verified) in %s", tt.fault, fail.Message, last.Time.Sub(woke.Time).Round(time.Millisecond))
			if st := f.sup.State(); st.Phase != api.PhaseActive || st.Profile != "coder" {
				t.Errorf("state after recovery: %+v", st)
			}
			if n, d := f.holders(t); n != 1 {
				t.Errorf("%d holders after recovery: %s", n, d)
			}
			rep := (&Doctor{Cfg: f.cfg, GPU: f.gpu, Units: f.sup.units, Watcher: f.sup}).Run(context.Background())
			if c, _ := checkByID(rep, "standby.wake_verify", ""); c.Severity != units.SeverityWarn || !strings.Contains(c.Message, tt.reason) {
				t.Errorf("doctor standby.wake_verify = %s: %s", c.Severity, c.Message)
			}
			// The recovered backend is right: its own check passed, and a
			// new one against the reference passes too.
			if msg, reason, _ := f.sup.checkServes(context.Background(), f.cfg.Profiles["coder"], false, true); reason != "" {
				t.Errorf("check after recovery: %s (%s)", msg, reason)
			}
		})
	}
}

// TestRateNotComparedOnTheCPU: the rate is left out only when the engine
// ran on the CPU (no GPU memory held by its unit) at the cold start that
// measured the reference and does now. A reference marked CPU-only does
// not excuse an engine that holds GPU memory: the simulated vLLM, held to
// a rate it cannot reach, still fails with reason rate.
func TestRateNotComparedOnTheCPU(t *testing.T) {
	f := newProcFixtureYAML(t, wakeFaultYAML(t, "")) // coder at 100 tokens/s: a slow answer is late beyond the slack
	awaitReconciled(t, f.sup)
	if evs, err := f.switchTo(t, "coder"); err != nil {
		t.Fatalf("switch to coder: %v\n%s", err, describe(evs))
	}
	ctx := context.Background()
	if held, read := f.sup.engineGPUMiB(ctx, f.cfg.Profiles["coder"]); !read || held == 0 {
		t.Fatalf("the running simulated vLLM holds %d MiB (read %v), want some", held, read)
	}
	tests := []struct {
		profile string // coder runs and holds GPU memory; llama's unit is stopped and holds none
		cpuOnly bool
		want    bool
	}{
		{"coder", false, true},
		{"coder", true, true},
		{"llama", false, true},
		{"llama", true, false},
	}
	for _, tt := range tests {
		if got := f.sup.rateComparable(ctx, f.cfg.Profiles[tt.profile], wakeRef{CPUOnly: tt.cpuOnly}); got != tt.want {
			t.Errorf("%s with a reference cpu_only=%v: compared %v, want %v", tt.profile, tt.cpuOnly, got, tt.want)
		}
	}
	ref, ok := f.sup.wake.ref("coder")
	if !ok || ref.CPUOnly {
		t.Fatalf("coder's reference after a cold start with GPU memory held: %+v", ref)
	}
	ref.CPUOnly, ref.DecodeTPS = true, 1e6
	f.sup.wake.setRef("coder", ref)
	if msg, reason, _ := f.sup.checkServes(ctx, f.cfg.Profiles["coder"], false, false); reason != wakeReasonRate {
		t.Errorf("a GPU engine held to 1e6 tokens/s by a CPU-only reference: %q (reason %q), want reason %s", msg, reason, wakeReasonRate)
	}
}

// TestColdStartKeepsTheReference: the first cold start of a profile
// measures the reference rate over the long answer and records the engine
// and driver version; a later cold start on the same versions that answers
// as recorded keeps it (no long answer); a reference from another version
// (or from a file without one) is measured again.
func TestColdStartKeepsTheReference(t *testing.T) {
	f := newProcFixture(t, "0s")
	awaitReconciled(t, f.sup)
	coldCheck := func() api.Event {
		t.Helper()
		if evs, err := f.switchTo(t, "llama"); err != nil {
			t.Fatalf("switch to llama: %v\n%s", err, describe(evs))
		}
		evs, err := f.switchTo(t, "coder")
		if err != nil {
			t.Fatalf("switch to coder: %v\n%s", err, describe(evs))
		}
		if got := strings.Join(stepsOf(evs), " "); !strings.HasSuffix(got, "start ready verify wake_check") {
			t.Fatalf("coder not started cold: %q", got)
		}
		e, _ := stepEvent(evs, "wake_check", "done")
		return e
	}
	tests := []struct {
		name    string
		version string // set on the reference before the cold start ("-": leave it)
		kept    bool
	}{
		{"first cold start measures", "-", false},
		{"same versions keep it", "-", true},
		{"another engine version measures again", "vllm 0.0.1, driver 1", false},
		{"kept again after that", "-", true},
		{"a reference without a version measures again", "", false},
	}
	for _, tt := range tests {
		if tt.version != "-" {
			ref, ok := f.sup.wake.ref("coder")
			if !ok {
				t.Fatalf("%s: no reference", tt.name)
			}
			ref.Version = tt.version
			f.sup.wake.setRef("coder", ref)
		}
		e := coldCheck()
		if kept := e.Detail["reference_kept"] == true; kept != tt.kept {
			t.Errorf("%s: reference kept = %v, want %v: %s", tt.name, kept, tt.kept, e.Message)
		}
		// A kept reference keeps the tool verdict (no round trip); a new
		// one runs the round trip.
		if got, want := strings.Contains(e.Message, "tool calls as recorded (worked: true)"), tt.kept; got != want {
			t.Errorf("%s: tool verdict kept = %v, want %v: %s", tt.name, got, want, e.Message)
		}
		if !tt.kept && !strings.Contains(e.Message, "tool call: structured") {
			t.Errorf("%s: no tool round trip when measuring: %s", tt.name, e.Message)
		}
		ref, _ := f.sup.wake.ref("coder")
		if ref.Version == "" || ref.Version != e.Detail["version"] || ref.DecodeTPS <= 0 {
			t.Errorf("%s: reference after the cold start: %+v (check's version %v)", tt.name, ref, e.Detail["version"])
		}
	}
}

// TestWakeCheckToolsByLevel: after a level-1 wake (the same bytes copied
// back from host memory) the wake check is the known answer and the rate;
// after a level-2 wake (weights reloaded) the tool-call round trip runs
// too, as after every cold start.
func TestWakeCheckToolsByLevel(t *testing.T) {
	for _, tt := range []struct {
		standby string
		tools   bool
	}{
		{"sleep1", false},
		{"sleep2", true},
	} {
		t.Run(tt.standby, func(t *testing.T) {
			f := newProcFixtureYAML(t, func(bin, state string) string {
				return strings.Replace(standbyYAML(t)(bin, state), "    standby: auto\n", "    standby: "+tt.standby+"\n", 1)
			})
			awaitReconciled(t, f.sup)
			var evs []api.Event
			for _, p := range []string{"coder", "llama", "coder"} {
				var err error
				if evs, err = f.switchTo(t, p); err != nil {
					t.Fatalf("switch to %s: %v\n%s", p, err, describe(evs))
				}
			}
			if got := strings.Join(stepsOf(evs), " "); got != "standby wake ready verify wake_check" {
				t.Fatalf("back to coder: steps %q, want a wake", got)
			}
			e, _ := stepEvent(evs, "wake_check", "done")
			if got := strings.Contains(e.Message, "tool call: structured"); got != tt.tools {
				t.Errorf("tool round trip after a %s wake = %v, want %v: %s", tt.standby, got, tt.tools, e.Message)
			}
		})
	}
}

// TestDecodeRateRefusesABurst: a reference measured from an answer read in
// one burst is no rate (it would fail every later check on its rate).
func TestDecodeRateRefusesABurst(t *testing.T) {
	for _, tc := range []struct {
		n    int
		span time.Duration
		want float64
	}{
		{32, 62 * time.Millisecond, 31 / 0.062},
		{32, 310 * time.Millisecond, 100},
		{32, 59 * time.Microsecond, 0}, // 521,186 tokens/s: one burst
		{1, time.Second, 0},
		{32, 0, 0},
	} {
		if got := decodeRate(tc.n, tc.span); math.Abs(got-tc.want) > 0.01 {
			t.Errorf("decodeRate(%d, %v) = %.2f, want %.2f", tc.n, tc.span, got, tc.want)
		}
	}
}
