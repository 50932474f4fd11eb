package proxy

import (
	"slices"
	"strings"
	"sync"

	"gpuhost/api"
)

// A router above several boxes (LiteLLM, vLLM production-stack's router)
// needs to know, per model, whether a box serves it now, how soon it would
// if asked, or that it must cold-start. GET /v1/models says so in each
// model object's "gpuhost" field (an extra field: OpenAI clients ignore
// it), from the Supervisor's state and the switches this daemon ran.

// Readiness states of a model, in the "gpuhost" field of /v1/models.
const (
	ReadyServing   = "serving"   // its backend is active and answers now
	ReadySwitching = "switching" // a switch to it (waking or starting) or away from it runs
	ReadySleeping  = "sleeping"  // its backend is in standby: a wake, wake_ms
	ReadyCold      = "cold"      // nothing of it runs: a cold start, cold_start_ms
)

// Readiness is the "gpuhost" field of a /v1/models entry.
type Readiness struct {
	// State is serving, switching, sleeping or cold.
	State string `json:"state"`
	// Standby is how it sleeps while State is sleeping: sleep1, sleep2
	// (vLLM's levels) or unload (Ollama).
	Standby string `json:"standby,omitempty"`
	// WakeMS is how long a switch that woke it from standby took, from the
	// request to serving (the median of the last few); absent until this
	// daemon has woken it once.
	WakeMS float64 `json:"wake_ms,omitempty"`
	// ColdStartMS is the same for a switch that started it cold; absent
	// until this daemon has started it once.
	ColdStartMS float64 `json:"cold_start_ms,omitempty"`
}

// eventSource is what the proxy reads of the Supervisor's events to learn
// how long wakes and cold starts take. A Backend without it (a test's
// stand-in) leaves the timings out.
type eventSource interface {
	Subscribe(since uint64) (<-chan api.Event, []api.Event, func())
}

// timingsKept is how many switches per profile and kind the medians use.
const timingsKept = 5

// switchTimes folds the Supervisor's switch events into the durations of
// wakes and cold starts per profile. It catches up on each read from the
// event buffer (no goroutine of its own): events that left the buffer
// between two reads are not counted, which only makes the medians rest on
// fewer switches.
type switchTimes struct {
	mu   sync.Mutex
	seq  uint64                // the last event folded
	open map[string]*openTimed // switch id → what its steps did
	wake map[string][]float64  // profile → durations of the last wakes, ms
	cold map[string][]float64  // profile → durations of the last cold starts, ms
}

// openTimed is a switch in progress: whether it woke or started its target.
type openTimed struct{ woke, started bool }

// of returns the median wake and cold start of profile (0: none seen),
// after folding the events src has that were not folded yet.
func (t *switchTimes) of(src eventSource, profile string) (wakeMS, coldMS float64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.catchUpLocked(src)
	return median(t.wake[profile]), median(t.cold[profile])
}

func (t *switchTimes) catchUpLocked(src eventSource) {
	if src == nil {
		return
	}
	_, backlog, cancel := src.Subscribe(t.seq)
	cancel()
	for _, e := range backlog {
		if e.Seq > t.seq {
			t.seq = e.Seq
			t.fold(e)
		}
	}
}

// fold takes one event: steps mark what their switch did; the switch's
// successful end records its total duration as a wake or a cold start. A
// rollback's steps ("rollback.wake") are the old profile's and do not count.
func (t *switchTimes) fold(e api.Event) {
	if e.SwitchID == "" || strings.HasPrefix(e.Step, api.StepRollback) {
		return
	}
	if t.open == nil {
		t.open, t.wake, t.cold = map[string]*openTimed{}, map[string][]float64{}, map[string][]float64{}
	}
	switch {
	case e.Kind == api.EventSwitch && e.Status == api.StatusStarted:
		t.open[e.SwitchID] = &openTimed{}
	case e.Kind == api.EventStep && e.Status == api.StatusDone:
		if o := t.open[e.SwitchID]; o != nil {
			o.woke = o.woke || e.Step == api.StepWake
			o.started = o.started || e.Step == api.StepStart
		}
	case e.Kind == api.EventSwitch && e.Status.Done():
		o := t.open[e.SwitchID]
		delete(t.open, e.SwitchID)
		if o == nil || e.Status != api.StatusDone || e.DurationMS <= 0 {
			return
		}
		switch {
		case o.started: // a failed wake falls back to a cold start
			t.cold[e.Profile] = keepLast(t.cold[e.Profile], e.DurationMS)
		case o.woke:
			t.wake[e.Profile] = keepLast(t.wake[e.Profile], e.DurationMS)
		}
	}
	if len(t.open) > 64 {
		clear(t.open) // ends lost from the buffer: forget, do not grow
	}
}

func keepLast(s []float64, v float64) []float64 {
	s = append(s, v)
	if len(s) > timingsKept {
		s = s[len(s)-timingsKept:]
	}
	return s
}

// median of s rounded to whole milliseconds; 0 for none.
func median(s []float64) float64 {
	if len(s) == 0 {
		return 0
	}
	c := slices.Sorted(slices.Values(s))
	m := c[len(c)/2]
	if len(c)%2 == 0 {
		m = (c[len(c)/2-1] + c[len(c)/2]) / 2
	}
	return float64(int64(m + 0.5))
}

// readiness is a profile's "gpuhost" field: its state from st, its timings
// from the switches seen.
func (p *Proxy) readiness(profile string, st api.State, cur string) *Readiness {
	r := &Readiness{State: ReadyCold}
	switch {
	case profile == cur && st.Phase == api.PhaseActive && st.Step == "":
		r.State = ReadyServing
	case profile == cur, st.Phase == api.PhaseSwitching && profile == st.Profile:
		r.State = ReadySwitching
	default:
		for _, sb := range st.Standby {
			if sb.Profile == profile {
				r.State, r.Standby = ReadySleeping, sb.Mode
				break
			}
		}
	}
	src, _ := p.sup.(eventSource)
	r.WakeMS, r.ColdStartMS = p.times.of(src, profile)
	return r
}
