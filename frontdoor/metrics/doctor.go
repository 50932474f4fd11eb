package metrics

import (
	"context"
	"errors"
	"time"

	"gpuhost/api"
)

// requestDoctor asks the doctor loop for an early run without waiting: a
// request while one is pending is the same request.
func (m *Metrics) requestDoctor() {
	select {
	case m.doctorReq <- struct{}{}:
	default:
	}
}

// doctorLoop runs the doctor at once, then every doctorInterval, and early
// on request but never sooner than doctorMinInterval after the previous
// run. The doctor reads units and probes the backend over HTTP, which can
// take seconds; scrapes only ever read the cached report.
func (m *Metrics) doctorLoop(ctx context.Context) {
	var last time.Time // start of the previous run; zero: none yet
	next := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.doctorReq:
			if early := last.Add(m.doctorMinInterval); early.Before(next) {
				next = early
			}
		case <-timer.C:
			last = time.Now()
			m.runDoctor(ctx)
			next = last.Add(m.doctorInterval)
		}
		// Since Go 1.23 Reset needs no draining: a stale tick is never
		// delivered after it.
		timer.Reset(time.Until(next))
	}
}

// runDoctor runs the doctor once for all profiles and caches its report.
func (m *Metrics) runDoctor(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, doctorRunTimeout)
	defer cancel()
	rep := m.doctor(ctx, "")
	if errors.Is(ctx.Err(), context.Canceled) {
		return // shutting down: a half-run report is not worth caching
	}
	m.mu.Lock()
	m.report, m.reportAt = &rep, time.Now()
	m.runs++
	progress := m.advanceLocked()
	m.mu.Unlock()
	close(progress)
}

// cachedDoctor returns the latest doctor report (nil before the first run)
// and when it was taken. A report older than doctorMinInterval asks the loop
// for a fresh one, which the next scrape will see.
func (m *Metrics) cachedDoctor() (*api.DoctorReport, time.Time) {
	m.mu.Lock()
	rep, at := m.report, m.reportAt
	m.mu.Unlock()
	if rep != nil && time.Since(at) > m.doctorMinInterval {
		m.requestDoctor()
	}
	return rep, at
}
