package activity

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"gpuhost/api"
	"gpuhost/nvml"
)

// Defaults of the history.
const (
	// DefaultInterval is how often the history samples: often enough to
	// see a switch's VRAM release, cheap for NVML (one snapshot).
	DefaultInterval = 2 * time.Second
	// DefaultKeep is how far back the history reaches (1800 samples).
	DefaultKeep = time.Hour
	// maxSwitches bounds the switch marks kept (a switch takes seconds to
	// minutes; 256 is more than an hour holds).
	maxSwitches = 256
	// snapshotTimeout bounds one GPU reading: a hung driver costs a gap in
	// the charts, never a stuck sampler.
	snapshotTimeout = time.Second
)

// GPU is what the history reads the GPU from (the Supervisor's Snapshot).
type GPU interface {
	Snapshot(ctx context.Context) (nvml.Snapshot, error)
}

// Events is where the switch marks come from (the Supervisor's event bus).
type Events interface {
	Subscribe(since uint64) (<-chan api.Event, []api.Event, func())
}

// Sample is one point of the history. GPU is false when the GPU could not
// be read (the GPU fields are then zero, and the charts leave a gap).
type Sample struct {
	Time     time.Time `json:"time"`
	GPU      bool      `json:"gpu"`
	UsedMiB  uint64    `json:"memory_used_mib"`
	TotalMiB uint64    `json:"memory_total_mib"`
	UtilPct  int       `json:"utilization_gpu"`
	MemUtil  int       `json:"utilization_memory"`
	PowerW   float64   `json:"power_w"`
	TempC    int       `json:"temperature_c"`
	// RequestsPerS and TokensPerS are the proxy's finished requests and
	// their completion tokens per second since the sample before.
	RequestsPerS float64 `json:"requests_per_s"`
	TokensPerS   float64 `json:"tokens_per_s"`
}

// Switch is a switch as the charts mark it: from its start to its end
// (End zero while it runs).
type Switch struct {
	ID      string    `json:"id"`
	Profile string    `json:"profile"`
	Start   time.Time `json:"start"`
	End     time.Time `json:"end,omitzero"`
	// Status is "started" while it runs, then "done" or "failed";
	// "unknown" when its end was not seen before the next switch began.
	Status string `json:"status"`
	// DurationMS is the switch's own duration from its end event (0
	// while it runs).
	DurationMS float64 `json:"duration_ms,omitempty"`
	// Mode is "standby" when the target was woken (a "wake" step), else
	// "cold"; a switch is compared with others of its profile and mode.
	Mode  string `json:"mode"`
	Steps []Step `json:"steps"`
	// MedianMS is the median duration of the finished switches kept to
	// the same profile in the same mode (0 with fewer than three), and
	// Slow says this one took more than SlowFactor times it.
	MedianMS float64 `json:"median_ms,omitempty"`
	Slow     bool    `json:"slow,omitempty"`
	// Kind is "crash" for a backend that died without gpuhost asking
	// (Status "crash", Reason systemd's result, Message what gpuhost
	// does about it); "" for a switch.
	Kind    string `json:"kind,omitempty"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// Step is one finished step of a switch, from its done or failed event.
type Step struct {
	Name    string  `json:"name"`
	Status  string  `json:"status"`
	MS      float64 `json:"ms"`
	Message string  `json:"message,omitempty"`
	// Long marks a step that took more than SlowFactor times the median
	// of the same step in the switches kept to the same profile and mode
	// (e.g. a standby step that waited its release timeout).
	Long bool `json:"long,omitempty"`
}

// Window is the history of one time span, oldest first.
type Window struct {
	From     time.Time     `json:"from"`
	To       time.Time     `json:"to"`
	Interval time.Duration `json:"interval_ns"`
	Samples  []Sample      `json:"samples"`
	Switches []Switch      `json:"switches"`
}

// History is a bounded ring of samples plus the recent switches.
type History struct {
	gpu      GPU
	events   Events
	totals   func() Totals
	now      func() time.Time
	interval time.Duration
	size     int // samples kept (fixed; read without mu)
	log      *slog.Logger

	mu       sync.Mutex
	samples  []Sample // ring, len = capacity once full
	next     int
	last     Totals
	lastAt   time.Time
	switches []Switch // oldest first, at most maxSwitches
}

// HistoryOptions configure NewHistory; zero values take the defaults.
type HistoryOptions struct {
	GPU    GPU           // nil: samples without GPU facts
	Events Events        // nil: no switch marks
	Totals func() Totals // the request log's counts; nil: no rates
	// Interval and Keep: one sample per Interval, Keep/Interval kept.
	Interval time.Duration
	Keep     time.Duration
	// Now is the clock (time.Now); tests pass a testkit.Clock's Now.
	Now func() time.Time
	Log *slog.Logger
}

// NewHistory returns an empty history; Run fills it.
func NewHistory(o HistoryOptions) *History {
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.Keep <= 0 {
		o.Keep = DefaultKeep
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Totals == nil {
		o.Totals = func() Totals { return Totals{} }
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	n := max(int(o.Keep/o.Interval), 1)
	return &History{gpu: o.GPU, events: o.Events, totals: o.Totals, now: o.Now, interval: o.Interval, size: n, log: o.Log,
		samples: make([]Sample, 0, n)}
}

// Interval is the time between two samples.
func (h *History) Interval() time.Duration { return h.interval }

// Keep is how far back the history reaches.
func (h *History) Keep() time.Duration { return time.Duration(h.size) * h.interval }

// Run samples every Interval and follows the switches until ctx ends.
// ticks, when not nil, replaces the ticker (tests send on it).
func (h *History) Run(ctx context.Context, ticks <-chan time.Time) {
	if ticks == nil {
		t := time.NewTicker(h.interval)
		defer t.Stop()
		ticks = t.C
	}
	var evs <-chan api.Event
	if h.events != nil {
		ch, backlog, cancel := h.events.Subscribe(0)
		defer cancel()
		for _, e := range backlog {
			h.Observe(e)
		}
		evs = ch
	}
	h.Sample(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticks:
			h.Sample(ctx)
		case e, ok := <-evs:
			if !ok {
				evs = nil // the bus let go of us: no more marks, samples go on
				continue
			}
			h.Observe(e)
		}
	}
}

// Sample takes one sample now: a GPU snapshot (bounded by a second) and
// the request rates since the sample before.
func (h *History) Sample(ctx context.Context) Sample {
	s := Sample{Time: h.now()}
	if h.gpu != nil {
		sctx, cancel := context.WithTimeout(ctx, snapshotTimeout)
		snap, err := h.gpu.Snapshot(sctx)
		cancel()
		if err != nil {
			h.log.Debug("activity: GPU sample failed; the charts show a gap", "err", err)
		} else if len(snap.Devices) > 0 {
			d := snap.Devices[0]
			s.GPU, s.UsedMiB, s.TotalMiB = true, d.MemoryUsedMiB, d.MemoryTotalMiB
			s.UtilPct, s.MemUtil, s.PowerW, s.TempC = d.UtilizationGPU, d.UtilizationMemory, d.PowerW, d.TemperatureC
		}
	}
	tot := h.totals()
	h.mu.Lock()
	defer h.mu.Unlock()
	if el := s.Time.Sub(h.lastAt); !h.lastAt.IsZero() && el > 0 {
		s.RequestsPerS = float64(tot.Requests-h.last.Requests) / el.Seconds()
		s.TokensPerS = float64(tot.CompletionTokens-h.last.CompletionTokens) / el.Seconds()
	}
	h.last, h.lastAt = tot, s.Time
	if len(h.samples) < cap(h.samples) {
		h.samples = append(h.samples, s)
	} else {
		h.samples[h.next] = s
		h.next = (h.next + 1) % cap(h.samples)
	}
	return s
}

// Observe takes a switch's start and end from the Supervisor's events
// (Kind "switch"); other events are ignored. An end whose start was not
// seen (it left the event buffer) is marked from its duration.
func (h *History) Observe(e api.Event) {
	if e.Kind == api.EventCrash {
		reason, _ := e.Detail[api.DetailReason].(string)
		h.mu.Lock()
		h.addSwitch(Switch{ID: fmt.Sprintf("crash-%d", e.Seq), Kind: string(api.EventCrash), Profile: e.Profile, Start: e.Time, End: e.Time,
			Status: "crash", Reason: reason, Message: e.Message, Steps: []Step{}})
		h.mu.Unlock()
		return
	}
	if (e.Kind != api.EventSwitch && e.Kind != api.EventStep) || e.SwitchID == "" {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	i := len(h.switches) - 1
	for ; i >= 0 && h.switches[i].ID != e.SwitchID; i-- {
	}
	if e.Kind == api.EventStep {
		if i >= 0 {
			h.switches[i].observeStep(e)
		}
		return
	}
	switch e.Status {
	case api.StatusStarted:
		if i < 0 {
			// The Supervisor runs one switch at a time: one still open
			// here lost its end event (a full subscriber buffer drops
			// events), so it ended by now, how is unknown.
			for k := range h.switches {
				if h.switches[k].End.IsZero() && h.switches[k].Kind == "" {
					h.switches[k].End, h.switches[k].Status = e.Time, "unknown"
				}
			}
			h.addSwitch(Switch{ID: e.SwitchID, Profile: e.Profile, Start: e.Time, Status: "started", Mode: ModeCold, Steps: []Step{}})
		}
	case api.StatusDone, api.StatusFailed:
		if i < 0 {
			start := e.Time.Add(-time.Duration(e.DurationMS * float64(time.Millisecond)))
			h.addSwitch(Switch{ID: e.SwitchID, Profile: e.Profile, Start: start, Mode: ModeCold, Steps: []Step{}})
			i = len(h.switches) - 1
		}
		h.switches[i].End, h.switches[i].Status = e.Time, string(e.Status)
		h.switches[i].DurationMS = e.DurationMS
		if e.DurationMS <= 0 {
			h.switches[i].DurationMS = float64(e.Time.Sub(h.switches[i].Start)) / float64(time.Millisecond)
		}
		if e.Profile != "" {
			h.switches[i].Profile = e.Profile
		}
	}
}

// addSwitch appends sw, dropping the oldest past maxSwitches; h.mu is held.
func (h *History) addSwitch(sw Switch) {
	if len(h.switches) >= maxSwitches {
		h.switches = append(h.switches[:0], h.switches[1:]...)
	}
	h.switches = append(h.switches, sw)
}

// Latest is the newest sample (false: none yet).
func (h *History) Latest() (Sample, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.samples) == 0 {
		return Sample{}, false
	}
	i := len(h.samples) - 1
	if len(h.samples) == cap(h.samples) {
		i = (h.next - 1 + cap(h.samples)) % cap(h.samples)
	}
	return h.samples[i], true
}

// Window returns the samples of the last d (clamped to what the history
// keeps) and the switches that overlap it, oldest first.
func (h *History) Window(d time.Duration) Window {
	d = min(max(d, h.interval), h.Keep())
	to := h.now()
	w := Window{From: to.Add(-d), To: to, Interval: h.interval, Samples: []Sample{}, Switches: []Switch{}}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, part := range [][]Sample{h.samples[h.next:], h.samples[:h.next]} {
		for _, s := range part {
			if !s.Time.Before(w.From) && !s.Time.After(to) {
				w.Samples = append(w.Samples, s)
			}
		}
	}
	judged := judgeSwitches(h.switches)
	for _, sw := range judged {
		if (sw.End.IsZero() || !sw.End.Before(w.From)) && !sw.Start.After(to) {
			w.Switches = append(w.Switches, sw)
		}
	}
	return w
}
