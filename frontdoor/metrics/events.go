package metrics

import (
	"context"
	"time"

	"gpuhost/api"
)

// handle turns one Supervisor event into counter and histogram updates.
//
// Switch durations: the "done" event carries the whole switch's DurationMS;
// a "failed" one may not (it is published after a rollback, with only a
// message), so its duration is measured from the "started" event's time.
// When that start was not seen either (the metrics started mid-switch and
// the start had left the Supervisor's buffer), the switch is counted but its
// duration is not observed rather than guessed.
//
// Step durations are observed for steps that succeeded only: a failed step's
// time is mostly the timeout that ended it, which says nothing about how
// long the step takes; failures show in gpuhost_switches_total.
// maxInFlightSwitches bounds the switches the metrics follow at once:
// far more than the lanes of any box.
const maxInFlightSwitches = 64

func (m *Metrics) handle(e api.Event) {
	m.mu.Lock()
	if m.lastSeq != 0 && e.Seq > m.lastSeq+1 {
		m.eventsLost.Add(float64(e.Seq - m.lastSeq - 1))
	}
	var (
		finished bool
		seconds  = -1.0
	)
	switch e.Kind {
	case api.EventSwitch:
		switch e.Status {
		case api.StatusStarted:
			if m.started == nil || len(m.started) >= maxInFlightSwitches {
				m.started = map[string]time.Time{}
			}
			m.started[e.SwitchID] = e.Time
		case api.StatusDone, api.StatusFailed:
			finished = true
			t0, ok := m.started[e.SwitchID]
			switch {
			case e.DurationMS > 0:
				seconds = e.DurationMS / 1000
			case ok && !e.Time.Before(t0):
				seconds = e.Time.Sub(t0).Seconds()
			}
			delete(m.started, e.SwitchID)
		}
	}
	m.mu.Unlock()

	switch {
	case finished:
		profile, result := cleanLabel(e.Profile), cleanLabel(string(e.Status))
		m.switches.WithLabelValues(profile, result).Inc()
		if seconds >= 0 {
			m.switchDur.WithLabelValues(profile, result).Observe(seconds)
		}
		// What the doctor checks (drift, endpoint health, exclusivity)
		// changes with the backend: refresh it, rate-limited.
		m.requestDoctor()
	case e.Kind == api.EventWakeCheck && e.Status == api.StatusFailed:
		m.wakeFails.WithLabelValues(cleanLabel(detailString(e, api.DetailReason))).Inc()
	case e.Kind == api.EventCrash:
		m.crashes.WithLabelValues(cleanLabel(e.Profile), cleanLabel(detailString(e, api.DetailReason))).Inc()
		m.requestDoctor()
	case e.Kind == api.EventDrift || e.Kind == api.EventExclusion:
		m.drift.WithLabelValues(cleanLabel(detailString(e, api.DetailDrift))).Inc()
	case e.Kind == api.EventStep && e.Status == api.StatusDone && e.Step != "":
		m.stepDur.WithLabelValues(cleanLabel(e.Step)).Observe(max(e.DurationMS, 0) / 1000)
	}

	// The event counts as handled only now, after its series changed: a
	// waitFor that returned earlier let a scrape miss the counter.
	m.mu.Lock()
	if e.Seq > m.lastSeq {
		m.lastSeq = e.Seq
	}
	progress := m.advanceLocked()
	m.mu.Unlock()
	close(progress)
}

// advanceLocked replaces the progress channel and returns the old one, for
// the caller to close once it has released m.mu: that wakes every waitFor.
func (m *Metrics) advanceLocked() chan struct{} {
	old := m.progress
	m.progress = make(chan struct{})
	return old
}

// waitFor blocks until cond (called with m.mu held) is true or ctx ends;
// cond is re-checked whenever an event has been handled or a doctor run has
// finished. Tests use it to scrape after the metrics have caught up,
// without sleeping.
func (m *Metrics) waitFor(ctx context.Context, cond func() bool) error {
	for {
		m.mu.Lock()
		done, progress := cond(), m.progress
		m.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-progress:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// detailString is e.Detail[key] when it is a string, else "unknown".
func detailString(e api.Event, key string) string {
	if v, ok := e.Detail[key].(string); ok && v != "" {
		return v
	}
	return "unknown"
}
