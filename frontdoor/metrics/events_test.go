package metrics

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"gpuhost/api"
)

// read returns the written form of one series of a vector.
func read(t *testing.T, m prometheus.Metric) *dto.Metric {
	t.Helper()
	var out dto.Metric
	if err := m.Write(&out); err != nil {
		t.Fatal(err)
	}
	return &out
}

func TestHandleEvents(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	sw := func(id string, status api.EventStatus, at time.Duration, ms float64) api.Event {
		return api.Event{Kind: "switch", SwitchID: id, Profile: "coder", Status: status, Time: t0.Add(at), DurationMS: ms}
	}
	step := func(name string, status api.EventStatus, ms float64) api.Event {
		return api.Event{Kind: "step", SwitchID: "a", Profile: "coder", Step: name, Status: status, DurationMS: ms, Time: t0}
	}
	tests := []struct {
		name   string
		events []api.Event
		// per result: switches counted, durations observed, their sum (s)
		done, failed       float64
		doneObs, failedObs uint64
		doneSum, failedSum float64
		steps              map[string]uint64
	}{
		{name: "done uses its own duration",
			events: []api.Event{sw("a", "started", 0, 0), sw("a", "done", 9*time.Second, 2500)},
			done:   1, doneObs: 1, doneSum: 2.5},
		{name: "failed without duration is measured from its start",
			events: []api.Event{sw("a", "started", 0, 0), sw("a", "info", time.Second, 0), sw("a", "failed", 3*time.Second, 0)},
			failed: 1, failedObs: 1, failedSum: 3},
		{name: "failed whose start was not seen is counted, not timed",
			events: []api.Event{sw("a", "failed", 3*time.Second, 0)},
			failed: 1},
		{name: "the start of another switch does not time a failure",
			events: []api.Event{sw("a", "started", 0, 0), sw("b", "failed", 3*time.Second, 0)},
			failed: 1},
		{name: "a failure timed before its start is not timed",
			events: []api.Event{sw("a", "started", 5*time.Second, 0), sw("a", "failed", 0, 0)},
			failed: 1},
		{name: "a start and info alone count nothing",
			events: []api.Event{sw("a", "started", 0, 0), sw("a", "info", 0, 0)}},
		{name: "a start is used once",
			events: []api.Event{sw("a", "started", 0, 0), sw("a", "failed", 2*time.Second, 0), sw("a", "failed", 4*time.Second, 0)},
			failed: 2, failedObs: 1, failedSum: 2},
		{name: "successful steps are timed, failed ones are not",
			events: []api.Event{step("verify", "started", 0), step("verify", "done", 250), step("ready", "failed", 20000), step("rollback.ready", "done", 1000)},
			steps:  map[string]uint64{"verify": 1, "ready": 0, "rollback.ready": 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := New(nil, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
			for i, e := range tc.events {
				e.Seq = uint64(i + 1)
				m.handle(e)
			}
			for _, r := range []struct {
				result string
				count  float64
				obs    uint64
				sum    float64
			}{{"done", tc.done, tc.doneObs, tc.doneSum}, {"failed", tc.failed, tc.failedObs, tc.failedSum}} {
				if got := read(t, m.switches.WithLabelValues("coder", r.result)).GetCounter().GetValue(); got != r.count {
					t.Errorf("switches_total{%s} = %v, want %v", r.result, got, r.count)
				}
				h := read(t, m.switchDur.WithLabelValues("coder", r.result).(prometheus.Metric)).GetHistogram()
				if h.GetSampleCount() != r.obs || !near(h.GetSampleSum(), r.sum) {
					t.Errorf("switch_duration{%s}: count %d sum %v, want %d and %v", r.result, h.GetSampleCount(), h.GetSampleSum(), r.obs, r.sum)
				}
			}
			for s, want := range tc.steps {
				if got := read(t, m.stepDur.WithLabelValues(s).(prometheus.Metric)).GetHistogram().GetSampleCount(); got != want {
					t.Errorf("step %s observed %d times, want %d", s, got, want)
				}
			}
			if lost := read(t, m.eventsLost).GetCounter().GetValue(); lost != 0 {
				t.Errorf("events lost = %v in a gapless stream", lost)
			}
		})
	}
}

func TestHandleCountsLostEvents(t *testing.T) {
	m := New(nil, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, seq := range []uint64{1, 2, 5, 6, 10} {
		m.handle(api.Event{Seq: seq, Kind: "state"})
	}
	if lost := read(t, m.eventsLost).GetCounter().GetValue(); lost != 5 {
		t.Errorf("events lost = %v, want 5 (3, 4, 7, 8, 9)", lost)
	}
}

// TestWakeFailureAndDriftCounters: failed wake checks count by their
// reason, watcher findings (drift, exclusion) by their kind; other events
// of those kinds count nothing.
func TestWakeFailureAndDriftCounters(t *testing.T) {
	m := New(nil, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	evs := []api.Event{
		{Kind: "wake_check", Status: "failed", Detail: map[string]any{"reason": "output"}},
		{Kind: "wake_check", Status: "failed", Detail: map[string]any{"reason": "output"}},
		{Kind: "wake_check", Status: "failed", Detail: map[string]any{"reason": "rate"}},
		{Kind: "wake_check", Status: "failed"},
		{Kind: "step", Step: "wake_check", Status: "failed", Detail: map[string]any{"reason": "hang"}},
		{Kind: "drift", Status: "failed", Detail: map[string]any{"drift": "asleep"}},
		{Kind: "exclusion", Status: "failed", Detail: map[string]any{"drift": "stray_unit"}},
		{Kind: "exclusion", Status: "failed", Detail: map[string]any{"drift": "stray_unit"}},
	}
	for i, e := range evs {
		e.Seq = uint64(i + 1)
		m.handle(e)
	}
	for _, c := range []struct {
		vec   *prometheus.CounterVec
		label string
		want  float64
	}{{m.wakeFails, "output", 2}, {m.wakeFails, "rate", 1}, {m.wakeFails, "unknown", 1}, {m.wakeFails, "hang", 0},
		{m.drift, "asleep", 1}, {m.drift, "stray_unit", 2}} {
		if got := read(t, c.vec.WithLabelValues(c.label)).GetCounter().GetValue(); got != c.want {
			t.Errorf("%s = %v, want %v", c.label, got, c.want)
		}
	}
}
