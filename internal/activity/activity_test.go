package activity

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/internal/testkit"
	"gpuhost/nvml"
)

func req(model string, status int) Request {
	return Request{Model: model, Status: status, Client: "127.0.0.1", Method: "POST", Path: "/v1/chat/completions"}
}

// TestLogRingBoundsAndOrder: the log keeps the last N, newest first, with
// running totals that do not shrink when old entries go.
func TestLogRingBoundsAndOrder(t *testing.T) {
	l := NewLog(3)
	if l.Size() != 3 {
		t.Fatalf("size %d", l.Size())
	}
	for i := range 5 {
		r := req(fmt.Sprintf("m%d", i%2), 200)
		r.CompletionTokens = 10
		l.Record(r)
	}
	got := l.Recent(Filter{}, 0)
	if len(got) != 3 || got[0].Seq != 5 || got[1].Seq != 4 || got[2].Seq != 3 {
		t.Fatalf("recent = %+v", got)
	}
	if tot := l.Totals(); tot.Requests != 5 || tot.CompletionTokens != 50 {
		t.Errorf("totals %+v", tot)
	}
	if got := l.Recent(Filter{}, 2); len(got) != 2 || got[0].Seq != 5 {
		t.Errorf("limit 2: %+v", got)
	}
	if m := l.Models(); len(m) != 2 || m[0] != "m0" || m[1] != "m1" {
		t.Errorf("models %v", m)
	}
	after, missed := l.After(1)
	if missed != 1 || len(after) != 3 || after[0].Seq != 3 || after[2].Seq != 5 {
		t.Errorf("After(1) = %+v, missed %d", after, missed)
	}
	if after, missed := l.After(4); missed != 0 || len(after) != 1 || after[0].Seq != 5 {
		t.Errorf("After(4) = %+v, missed %d", after, missed)
	}
	if after, _ := l.After(5); len(after) != 0 {
		t.Errorf("After(5) = %+v", after)
	}
	if NewLog(0).Size() != DefaultLogSize {
		t.Error("default size")
	}
}

func TestFilter(t *testing.T) {
	for _, tc := range []struct {
		f    Filter
		r    Request
		want bool
	}{
		{Filter{}, req("a", 500), true},
		{Filter{Model: "a"}, req("a", 200), true},
		{Filter{Model: "a"}, req("b", 200), false},
		{Filter{Status: "ok"}, req("a", 201), true},
		{Filter{Status: "ok"}, req("a", 404), false},
		{Filter{Status: "error"}, req("a", 499), true},
		{Filter{Status: "5xx"}, req("a", 503), true},
		{Filter{Status: "5xx"}, req("a", 404), false},
		{Filter{Status: "503"}, req("a", 503), true},
		{Filter{Status: "503"}, req("a", 502), false},
		{Filter{Status: "bogus"}, req("a", 200), false},
		{Filter{Status: "9999"}, req("a", 200), false},
	} {
		if got := tc.f.Match(tc.r); got != tc.want {
			t.Errorf("%+v.Match(%d %s) = %v", tc.f, tc.r.Status, tc.r.Model, got)
		}
	}
	for s, want := range map[string]bool{"": true, "ok": true, "4xx": true, "200": true, "20": false, "x": false, "600": false} {
		if ValidStatus(s) != want {
			t.Errorf("ValidStatus(%q) != %v", s, want)
		}
	}
}

// TestLogSubscribersNeverBlock: a subscriber that never reads does not
// hold Record up; one wake-up covers many records, and After gives them.
func TestLogSubscribersNeverBlock(t *testing.T) {
	l := NewLog(10)
	slow, cancelSlow := l.Subscribe()
	defer cancelSlow()
	ch, cancel := l.Subscribe()
	if l.Subscribers() != 2 {
		t.Fatalf("subscribers %d", l.Subscribers())
	}
	done := make(chan struct{})
	go func() {
		for range 1000 {
			l.Record(req("a", 200))
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Record blocked on a subscriber that does not read")
	}
	<-ch
	after, missed := l.After(0)
	if len(after) != 10 || missed != 990 || after[9].Seq != 1000 {
		t.Errorf("after %d, missed %d", len(after), missed)
	}
	cancel()
	if l.Subscribers() != 1 {
		t.Errorf("subscribers after cancel %d", l.Subscribers())
	}
	if len(slow) != 1 {
		t.Errorf("the slow subscriber holds %d wake-ups, want 1", len(slow))
	}
}

func TestTokensPerSecond(t *testing.T) {
	r := Request{Stream: true, CompletionTokens: 11, TTFB: time.Second, Duration: 3 * time.Second}
	if got := r.TokensPerSecond(); got != 5 {
		t.Errorf("stream rate %v, want 5", got)
	}
	r = Request{CompletionTokens: 10, Duration: 2 * time.Second}
	if got := r.TokensPerSecond(); got != 5 {
		t.Errorf("whole rate %v, want 5", got)
	}
	if (Request{Duration: time.Second}).TokensPerSecond() != 0 {
		t.Error("no tokens, a rate")
	}
}

// fakeGPU answers snapshots with a used memory the test sets, or an error.
type fakeGPU struct {
	mu   sync.Mutex
	used uint64
	err  error
}

func (g *fakeGPU) Snapshot(context.Context) (nvml.Snapshot, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return nvml.Snapshot{}, g.err
	}
	return nvml.Snapshot{Devices: []nvml.Device{{MemoryUsedMiB: g.used, MemoryTotalMiB: 24564, UtilizationGPU: 40, PowerW: 200, TemperatureC: 60}}}, nil
}

// TestHistoryRingAndRates: the ring keeps Keep/Interval samples; rates
// come from the log's totals over the clock's time; a GPU error is a gap.
func TestHistoryRingAndRates(t *testing.T) {
	clk := testkit.NewClock(time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC))
	gpu := &fakeGPU{used: 1000}
	r := New(Options{LogSize: 10, GPU: gpu, Interval: 2 * time.Second, Keep: 20 * time.Second, Now: clk.Now})
	if _, ok := r.Latest(); ok {
		t.Fatal("a latest sample before any")
	}
	r.Sample(context.Background())
	for range 4 {
		r.Record(Request{Status: 200, CompletionTokens: 25})
	}
	clk.Advance(2 * time.Second)
	s := r.Sample(context.Background())
	if s.RequestsPerS != 2 || s.TokensPerS != 50 || !s.GPU || s.UsedMiB != 1000 {
		t.Errorf("sample %+v", s)
	}
	gpu.mu.Lock()
	gpu.err = errors.New("driver gone")
	gpu.mu.Unlock()
	clk.Advance(2 * time.Second)
	if s := r.Sample(context.Background()); s.GPU || s.RequestsPerS != 0 {
		t.Errorf("sample without GPU %+v", s)
	}
	for range 20 {
		clk.Advance(2 * time.Second)
		r.Sample(context.Background())
	}
	w := r.Window(time.Hour) // clamped to Keep
	if len(w.Samples) != 10 {
		t.Fatalf("window holds %d samples, want the ring's 10", len(w.Samples))
	}
	for i := 1; i < len(w.Samples); i++ {
		if !w.Samples[i].Time.After(w.Samples[i-1].Time) {
			t.Fatalf("samples out of order at %d: %v", i, w.Samples)
		}
	}
	if last, ok := r.Latest(); !ok || !last.Time.Equal(clk.Now()) {
		t.Errorf("latest %+v, want the clock's now", last)
	}
	if w := r.Window(5 * time.Second); len(w.Samples) != 3 {
		t.Errorf("5 s window: %d samples, want 3", len(w.Samples))
	}
}

// TestHistorySwitchMarks: starts and ends pair by switch id; an end whose
// start was lost is marked from its duration; the window keeps those that
// overlap it; the number kept is bounded.
func TestHistorySwitchMarks(t *testing.T) {
	clk := testkit.NewClock(time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC))
	h := NewHistory(HistoryOptions{Now: clk.Now, Keep: time.Hour})
	t0 := clk.Now()
	h.Observe(api.Event{Kind: "switch", SwitchID: "a", Profile: "llama", Status: "started", Time: t0})
	h.Observe(api.Event{Kind: "step", SwitchID: "a", Step: "stop", Status: "done", Time: t0})
	h.Observe(api.Event{Kind: "switch", SwitchID: "a", Profile: "llama", Status: "done", Time: t0.Add(5 * time.Second)})
	h.Observe(api.Event{Kind: "switch", SwitchID: "b", Profile: "coder", Status: "failed", Time: t0.Add(20 * time.Minute), DurationMS: 3000})
	h.Observe(api.Event{Kind: "switch", SwitchID: "c", Profile: "coder", Status: "started", Time: t0.Add(50 * time.Minute)})
	clk.Advance(55 * time.Minute)
	w := h.Window(time.Hour)
	if len(w.Switches) != 3 {
		t.Fatalf("switches %+v", w.Switches)
	}
	a, b, c := w.Switches[0], w.Switches[1], w.Switches[2]
	if a.Status != "done" || a.End.Sub(a.Start) != 5*time.Second {
		t.Errorf("a = %+v", a)
	}
	if b.Status != "failed" || b.End.Sub(b.Start) != 3*time.Second {
		t.Errorf("b = %+v", b)
	}
	if c.Status != "started" || !c.End.IsZero() {
		t.Errorf("c = %+v", c)
	}
	if w := h.Window(15 * time.Minute); len(w.Switches) != 1 || w.Switches[0].ID != "c" {
		t.Errorf("15 min window: %+v", w.Switches)
	}
	// c's end event is lost (the bus dropped it): the next switch's start
	// closes it, so it does not stay an open band for the rest of the hour.
	h.Observe(api.Event{Kind: "switch", SwitchID: "d", Profile: "llama", Status: "started", Time: clk.Now()})
	if w := h.Window(15 * time.Minute); len(w.Switches) != 2 || w.Switches[0].Status != "unknown" ||
		!w.Switches[0].End.Equal(clk.Now()) || w.Switches[1].Status != "started" {
		t.Errorf("after d started: %+v", w.Switches)
	}
	for i := range maxSwitches + 10 {
		h.Observe(api.Event{Kind: "switch", SwitchID: fmt.Sprint("x", i), Status: "started", Time: clk.Now()})
	}
	if n := len(h.Window(time.Hour).Switches); n != maxSwitches {
		t.Errorf("%d switches kept, want %d", n, maxSwitches)
	}
}

// fakeEvents is a bus with a backlog and a channel the test sends on.
type fakeEvents struct {
	backlog []api.Event
	ch      chan api.Event
}

func (f *fakeEvents) Subscribe(uint64) (<-chan api.Event, []api.Event, func()) {
	return f.ch, f.backlog, func() {}
}

// TestHistoryRun: Run samples at once and on each tick, takes the backlog's
// switches and the live ones, and ends with its context.
func TestHistoryRun(t *testing.T) {
	clk := testkit.NewClock(time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC))
	ev := &fakeEvents{ch: make(chan api.Event),
		backlog: []api.Event{{Kind: "switch", SwitchID: "old", Status: "done", Time: clk.Now(), DurationMS: 1000}}}
	h := NewHistory(HistoryOptions{GPU: &fakeGPU{used: 5}, Events: ev, Now: clk.Now})
	ticks := make(chan time.Time)
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan struct{})
	go func() { h.Run(ctx, ticks); close(ended) }()
	for range 3 {
		clk.Advance(2 * time.Second)
		ticks <- clk.Now()
	}
	ev.ch <- api.Event{Kind: "switch", SwitchID: "new", Status: "started", Time: clk.Now()}
	ticks <- clk.Now() // handled after the event: Run is one loop
	cancel()
	<-ended
	w := h.Window(time.Hour)
	if len(w.Samples) != 5 {
		t.Errorf("%d samples, want 5 (one at start, four ticks)", len(w.Samples))
	}
	if len(w.Switches) != 2 || w.Switches[0].ID != "old" || w.Switches[1].ID != "new" {
		t.Errorf("switches %+v", w.Switches)
	}
}

// TestHistorySwitchJudged: each switch keeps its duration, mode and
// steps from the events; one over 3× the median of its profile and mode
// is slow, and its step over 3× that step's median is long (the standby
// step that waited its release timeout); a cold switch among wakes, a
// switch of another profile and a quick step's noise are not judged
// against them, and nothing is judged before three of a kind finished.
func TestHistorySwitchJudged(t *testing.T) {
	clk := testkit.NewClock(time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC))
	h := NewHistory(HistoryOptions{Now: clk.Now, Keep: time.Hour})
	const stalled = "ollama.service not in standby (holds 6200 MiB, above its measured residual); it will be stopped"
	n := 0
	sw := func(profile string, steps map[string]float64, msg string, order ...string) string {
		n++
		id := fmt.Sprint("s", n)
		t0 := clk.Now()
		h.Observe(api.Event{Kind: "switch", SwitchID: id, Profile: profile, Status: "started", Time: t0})
		total := 0.0
		for _, name := range order {
			m := ""
			if name == "standby" {
				m = msg
			}
			h.Observe(api.Event{Kind: "step", SwitchID: id, Step: name, Status: "started", Time: t0})
			h.Observe(api.Event{Kind: "step", SwitchID: id, Step: name, Status: "done", DurationMS: steps[name], Message: m, Time: t0})
			total += steps[name]
		}
		h.Observe(api.Event{Kind: "step", SwitchID: id, Step: "standby", Status: "info", Message: "why", Time: t0})
		h.Observe(api.Event{Kind: "switch", SwitchID: id, Profile: profile, Status: "done", DurationMS: total, Time: t0.Add(time.Duration(total) * time.Millisecond)})
		clk.Advance(time.Minute)
		return id
	}
	wake := func(standbyMS, configureMS float64, msg string) string {
		return sw("coder", map[string]float64{"standby": standbyMS, "configure": configureMS, "wake": 200, "verify": 5}, msg, "standby", "configure", "wake", "verify")
	}
	cold := sw("coder", map[string]float64{"stop": 100, "start": 2500, "ready": 100}, "", "stop", "start", "ready")
	early := wake(20, 0.1, "")
	judge := func() map[string]Switch {
		m := map[string]Switch{}
		for _, s := range h.Window(time.Hour).Switches {
			m[s.ID] = s
		}
		return m
	}
	if s := judge()[early]; s.Mode != ModeStandby || s.DurationMS != 225.1 || s.MedianMS != 0 || s.Slow || len(s.Steps) != 4 {
		t.Errorf("a lone wake: %+v", s)
	}
	wake(22, 0.1, "")
	noisy := wake(21, 0.9, "") // configure 9× its median, but a tiny part of the switch
	slow := wake(20010, 0.1, stalled)
	other := sw("llama", map[string]float64{"standby": 20000, "wake": 300}, "", "standby", "wake")
	got := judge()
	s := got[slow]
	if !s.Slow || s.MedianMS != 227 || s.Mode != ModeStandby {
		t.Errorf("the stalled wake: slow %v median %v mode %s, want slow against 227 (the median of 225.1, 226.9, 227.1, 20235.1)", s.Slow, s.MedianMS, s.Mode)
	}
	var long []string
	for _, st := range s.Steps {
		if st.Long {
			long = append(long, st.Name+": "+st.Message)
		}
	}
	if !slices.Equal(long, []string{"standby: " + stalled}) {
		t.Errorf("long steps of the stalled wake: %q", long)
	}
	for _, id := range []string{cold, early, noisy, other} {
		s := got[id]
		if s.Slow {
			t.Errorf("switch %s (%s %s, %v ms) marked slow", id, s.Profile, s.Mode, s.DurationMS)
		}
		for _, st := range s.Steps {
			if st.Long {
				t.Errorf("switch %s: step %+v marked long", id, st)
			}
		}
	}
	if got[cold].Mode != ModeCold || got[other].MedianMS != 0 {
		t.Errorf("cold %+v other %+v", got[cold], got[other])
	}
}

// TestHistoryCrashMarks: a backend's crash is a line of its own among the
// switches, with its reason, and does not close a switch that runs.
func TestHistoryCrashMarks(t *testing.T) {
	clk := testkit.NewClock(time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC))
	h := NewHistory(HistoryOptions{Now: clk.Now, Keep: time.Hour})
	t0 := clk.Now()
	h.Observe(api.Event{Kind: "crash", Seq: 7, Profile: "coder", Message: "crashed", Detail: map[string]any{"reason": "signal"}, Time: t0})
	h.Observe(api.Event{Kind: "switch", SwitchID: "a", Profile: "coder", Status: "started", Time: t0.Add(time.Second)})
	h.Observe(api.Event{Kind: "switch", SwitchID: "a", Profile: "coder", Status: "done", Time: t0.Add(3 * time.Second)})
	clk.Advance(time.Minute)
	w := h.Window(time.Hour)
	if len(w.Switches) != 2 {
		t.Fatalf("marks %+v", w.Switches)
	}
	if c := w.Switches[0]; c.Kind != "crash" || c.Reason != "signal" || c.Profile != "coder" || c.Status != "crash" {
		t.Errorf("crash mark %+v", c)
	}
	if s := w.Switches[1]; s.Kind != "" || s.Status != "done" {
		t.Errorf("the restart's switch %+v", s)
	}
}
