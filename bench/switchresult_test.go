package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"gpuhost/api"
)

// switchEvents is the event sequence of one switch with the given steps.
func switchEvents(id, target string, steps ...string) []api.Event {
	evs := []api.Event{{Kind: "switch", SwitchID: id, Profile: target, Status: "started"}}
	for _, s := range steps {
		evs = append(evs,
			api.Event{Kind: "step", SwitchID: id, Profile: target, Step: s, Status: "started"},
			api.Event{Kind: "step", SwitchID: id, Profile: target, Step: s, Status: "done", DurationMS: 1})
	}
	return append(evs, api.Event{Kind: "switch", SwitchID: id, Profile: target, Status: "done", DurationMS: 10})
}

// TestSwitchMode: today's cold sequence is cold, a switch with a wake step
// (the standby feature) is standby, a rollback's wake is not the target's.
func TestSwitchMode(t *testing.T) {
	for _, c := range []struct {
		name  string
		steps []string
		want  string
	}{
		{"cold vLLM", []string{"stop", "vram_release", "configure", "start", "ready", "verify"}, ModeCold},
		{"cold Ollama", []string{"stop", "vram_release", "configure", "start", "ready", "load_model", "verify"}, ModeCold},
		{"standby", []string{"standby", "wake", "ready", "verify", "wake_check"}, ModeStandby},
		{"wake that failed its check, then cold", []string{"standby", "wake", "ready", "verify", "vram_release", "configure", "start", "ready", "verify", "wake_check"}, ModeCold},
		{"rollback woke the old one", []string{"stop", "start", "rollback.wake"}, ModeCold},
	} {
		evs := switchEvents("s1", "b", c.steps...)
		if got := SwitchMode(evs); got != c.want {
			t.Errorf("%s: mode %q, want %q", c.name, got, c.want)
		}
		steps := switchSteps(evs)
		if len(steps) != len(c.steps) || steps[0].Step != c.steps[0] || steps[0].Status != "done" {
			t.Errorf("%s: steps %+v", c.name, steps)
		}
	}
}

// switchResult is a stored `bench switch` result with n samples per
// direction and path, first-token times around ft ms.
func switchResult(id string, n int, ft float64) *Result {
	sb := &SwitchBench{A: "coder", B: "llama", Rounds: n, RequestPath: RequestPathMeasured,
		Profiles: []SwitchProfile{{Name: "coder", Backend: "vllm", Model: "Q", Args: []string{"--x"}}, {Name: "llama", Backend: "ollama", Model: "l"}}}
	for round := 1; round <= n; round++ {
		for _, path := range []string{PathSwitch, PathRequest} {
			for _, d := range [][2]string{{"coder", "llama"}, {"llama", "coder"}} {
				v := ft + float64(round)
				sb.Samples = append(sb.Samples, SwitchSample{Round: round, From: d[0], To: d[1], Path: path, Mode: ModeCold,
					FirstTokenMS: v, SwitchMS: v - 5})
			}
		}
	}
	sb.Groups = groupSwitchSamples(sb.A, sb.B, sb.Samples)
	return &Result{SchemaVersion: SchemaVersion, ID: id, Status: StatusOK, StartedAt: time.Unix(0, 0), Switch: sb,
		Fingerprint: Fingerprint{Profile: "coder,llama"}}
}

func TestSwitchGroupsAndMetrics(t *testing.T) {
	r := switchResult("20260101T000000Z-switch-coder-llama", 3, 100)
	// Mix in a standby sample: its own group, after the cold one.
	r.Switch.Samples = append(r.Switch.Samples, SwitchSample{Round: 3, From: "coder", To: "llama", Path: PathSwitch, Mode: ModeStandby, FirstTokenMS: 5})
	gs := groupSwitchSamples("coder", "llama", r.Switch.Samples)
	var order []string
	for _, g := range gs {
		order = append(order, g.From+">"+g.To+" "+g.Path+" "+g.Mode)
	}
	want := []string{"coder>llama switch cold", "coder>llama switch standby", "coder>llama request cold",
		"llama>coder switch cold", "llama>coder request cold"}
	if !slices.Equal(order, want) {
		t.Fatalf("groups %q, want %q", order, want)
	}
	g := gs[0]
	if g.N != 3 || g.FirstTokenMS.N != 3 || g.FirstTokenMS.P50 != 102 || !(g.FirstTokenMS.P95 > 102 && g.FirstTokenMS.P95 <= 103) {
		t.Errorf("group %+v", g)
	}
	r.Switch.Groups = gs
	var names []string
	for _, m := range r.Metrics() {
		names = append(names, m.Name)
		if m.HigherIsBetter || m.Unit != "ms" {
			t.Errorf("%s: %+v", m.Name, m)
		}
	}
	if len(names) != 2*len(gs) || names[0] != "switch.coder->llama.switch_path.cold.first_token_ms" ||
		names[1] != "switch.coder->llama.switch_path.cold.switch_ms" || names[2] != "switch.coder->llama.switch_path.standby.first_token_ms" {
		t.Errorf("metrics %q", names)
	}
	// The JSON round trip keeps the switch part; Kind tells it apart.
	data, _ := json.Marshal(r)
	back, err := ParseResult(data)
	if err != nil || back.Kind() != KindSwitch || len(back.Switch.Samples) != len(r.Switch.Samples) ||
		back.Switch.Groups[0].FirstTokenMS.P95 != g.FirstTokenMS.P95 || Summarize(back).Kind != KindSwitch {
		t.Fatalf("round trip: %v %+v", err, back)
	}
	if (&Result{}).Kind() != KindRun {
		t.Error("a run result is not of kind run")
	}
}

// TestCompareSwitch: two switch results compare metric by metric with the
// same statistics as runs; a slower switch is "worse"; a run and a switch
// result are refused; changed profile flags show as setup changes.
func TestCompareSwitch(t *testing.T) {
	a := switchResult("20260101T000000Z-switch-coder-llama", 5, 100)
	b := switchResult("20260102T000000Z-switch-coder-llama", 5, 150)
	b.Switch.Profiles[0].Args = []string{"--y"}
	c := mustCompare(t, a, b, CompareOptions{})
	if len(c.Rows) != 8 || c.Tests != 8 || len(c.OnlyIn) != 0 {
		t.Fatalf("rows %d tests %d only %v", len(c.Rows), c.Tests, c.OnlyIn)
	}
	r := row(t, c, "switch.llama->coder.request_path.cold.first_token_ms")
	if r.Verdict != "worse" || r.A.N != 5 || r.B.N != 5 {
		t.Errorf("slower switch: %+v", r)
	}
	if !slices.ContainsFunc(c.Fingerprint, func(s string) bool { return strings.Contains(s, "profile coder flags: --x → --y") }) {
		t.Errorf("setup changes %q lack the flag change", c.Fingerprint)
	}
	same := mustCompare(t, a, a, CompareOptions{})
	if r := row(t, same, "switch.coder->llama.switch_path.cold.switch_ms"); r.Verdict != "~" {
		t.Errorf("same result: %+v", r)
	}
	run := synthetic("20260103T000000Z-coder", 1, 5, 100, 200, 2)
	if _, err := Compare(a, run, CompareOptions{}); !errors.Is(err, ErrNotComparable) || !strings.Contains(err.Error(), "switch result") {
		t.Errorf("switch vs run: %v", err)
	}
}

// TestSwitchOutliers: a sample over 3× its group's median first token is
// an outlier, named by round and direction, with the step that exceeded
// its own median the most and that step's message; groups are judged
// apart (a cold switch is not an outlier among standby ones), two
// samples never make one, and a slow sample whose steps were usual says
// the time went to the first token.
func TestSwitchOutliers(t *testing.T) {
	const stalled = "llama.service not in standby (llama.service holds 6200 MiB in standby, above its measured residual 500 MiB (+256)); it will be stopped"
	wake := func(round int, ft, standbyMS float64, msg string) SwitchSample {
		return SwitchSample{Round: round, From: "a", To: "b", Path: PathSwitch, Mode: ModeStandby, SwitchID: fmt.Sprint("s", round), FirstTokenMS: ft,
			Steps: []SwitchStep{{Step: "standby", Status: "done", MS: standbyMS, Message: msg}, {Step: "wake", Status: "done", MS: 200}, {Step: "verify", Status: "done", MS: 5}}}
	}
	cold := SwitchSample{Round: 1, From: "a", To: "b", Path: PathSwitch, Mode: ModeCold, FirstTokenMS: 2600,
		Steps: []SwitchStep{{Step: "start", Status: "done", MS: 2500}}}
	for _, c := range []struct {
		name    string
		samples []SwitchSample
		want    []string // round/step of each outlier
		why     string
	}{
		{"none", []SwitchSample{wake(1, 250, 20, "ok"), wake(2, 260, 21, "ok"), wake(3, 700, 22, "ok")}, nil, ""},
		{"two samples never", []SwitchSample{wake(1, 250, 20, "ok"), wake(2, 20300, 20000, stalled)}, nil, ""},
		{"release timeout", []SwitchSample{cold, wake(1, 250, 20, "ok"), wake(2, 20300, 20010, stalled), wake(3, 240, 19, "ok"), wake(4, 255, 21, "ok")},
			[]string{"2/standby"}, "step standby took 20010 ms (median 20.50 ms): " + stalled},
		{"first token slow", []SwitchSample{wake(1, 250, 20, "ok"), wake(2, 260, 20, "ok"), wake(3, 1000, 20, "ok")},
			[]string{"3/"}, "no step of the switch took longer than usual"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := switchOutliers(c.samples)
			var names []string
			for _, o := range got {
				names = append(names, fmt.Sprintf("%d/%s", o.Round, o.Step))
				if o.FirstTokenMS <= OutlierFactor*o.MedianMS {
					t.Errorf("outlier %+v is not over %d× its median", o, OutlierFactor)
				}
				if !strings.Contains(o.String(), c.why) || !strings.HasPrefix(o.String(), fmt.Sprintf("round %d a → b switch path (standby)", o.Round)) {
					t.Errorf("line %q lacks %q", o, c.why)
				}
			}
			if !slices.Equal(names, c.want) {
				t.Errorf("outliers %q, want %q", names, c.want)
			}
			if note := outlierNote(got); (note != "") != (len(c.want) > 0) {
				t.Errorf("note %q for %d outliers", note, len(got))
			}
		})
	}
}

// TestSwitchOutliersReported: show names each outlier with its round and
// why, list counts them on the result's line.
func TestSwitchOutliersReported(t *testing.T) {
	const why = "ollama.service not in standby (holds 6200 MiB in standby, above its measured residual 500 MiB (+256)); it will be stopped"
	o := SwitchOutlier{Round: 2, From: "coder", To: "llama", Path: PathSwitch, Mode: ModeStandby, FirstTokenMS: 20300, MedianMS: 250,
		Step: "standby", StepMS: 20010, StepMedianMS: 20, Message: why}
	r := &Result{SchemaVersion: SchemaVersion, ID: "20260102T150405Z-switch-coder-llama", Status: StatusOK, StartedAt: time.Unix(0, 0), FinishedAt: time.Unix(60, 0),
		Switch: &SwitchBench{A: "coder", B: "llama", Rounds: 3, Outliers: []SwitchOutlier{o}}}
	var b strings.Builder
	if err := WriteReport(&b, r); err != nil {
		t.Fatal(err)
	}
	want := "round 2 coder → llama switch path (standby): 20300 ms, 81.2× the median 250.0 ms; step standby took 20010 ms (median 20.00 ms): " + why
	if !strings.Contains(b.String(), "outliers (over 3× their group's median first token") || !strings.Contains(b.String(), want) {
		t.Errorf("report lacks the outlier %q:\n%s", want, b.String())
	}
	b.Reset()
	if err := WriteList(&b, []Summary{Summarize(r)}); err != nil || !strings.Contains(b.String(), "ok (1 outliers)") {
		t.Errorf("list: %v\n%s", err, b.String())
	}
}
