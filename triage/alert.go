package triage

import (
	"context"
	"fmt"
	"time"
)

// alertState follows consecutive failed polls (issue item 9): quiet for the
// first AlertFailures-1, then one alert, a reminder every RemindEvery while
// it keeps failing, and one all-clear when a poll succeeds again.
type alertState struct {
	failures  int
	firstFail time.Time
	alerted   bool
	lastAlert time.Time
}

func (w *Worker) pollFailed(ctx context.Context, now time.Time, err error) {
	w.metrics.pollFailures.Inc()
	w.smu.Lock()
	w.status.LastPoll = now
	w.status.LastError = err.Error()
	a := &w.alert
	a.failures++
	if a.failures == 1 {
		a.firstFail = now
	}
	var text string
	switch {
	case a.failures < w.o.AlertFailures:
	case !a.alerted:
		text = fmt.Sprintf("triage: mail from %s is not being processed — %d polls in a row failed since %s. Last error: %v",
			w.name, a.failures, a.firstFail.UTC().Format(time.RFC3339), err)
	case now.Sub(a.lastAlert) >= w.o.RemindEvery:
		text = fmt.Sprintf("triage: reminder — mail from %s is still not being processed (%d failed polls since %s). Last error: %v",
			w.name, a.failures, a.firstFail.UTC().Format(time.RFC3339), err)
	}
	failures := a.failures
	w.metrics.consecutive.Set(float64(failures))
	w.smu.Unlock()
	if text == "" {
		return
	}
	w.log.Error(text, "failures", failures)
	// The alert counts as raised when some sink carried it (or there is
	// none that could): otherwise it is tried again on the next failure.
	if w.alertAll(ctx, text) {
		w.smu.Lock()
		w.alert.alerted = true
		w.alert.lastAlert = now
		w.status.LastAlert = now
		w.smu.Unlock()
	}
}

func (w *Worker) pollOK(ctx context.Context, now time.Time) {
	w.smu.Lock()
	w.status.LastPoll, w.status.LastPollOK, w.status.LastError = now, now, ""
	a := w.alert
	w.alert = alertState{}
	w.metrics.consecutive.Set(0)
	w.smu.Unlock()
	if !a.alerted {
		if a.failures > 0 {
			w.log.Info("triage: polling works again", "failed_polls", a.failures)
		}
		return
	}
	text := fmt.Sprintf("triage: all clear — mail from %s is processed again after %d failed polls over %s.",
		w.name, a.failures, now.Sub(a.firstFail).Round(time.Second))
	w.log.Info(text, "failures", a.failures)
	// Recorded whether or not a sink took it (alertAll logs a refusal):
	// the streak is over either way, and the alert state says so.
	w.alertAll(ctx, text)
	w.smu.Lock()
	w.status.LastAllClear = now
	w.smu.Unlock()
}

// alertAll sends text to every sink that is an Alerter and reports whether
// the alert reached someone (or there was no sink that could carry it, in
// which case the log line is all there is).
func (w *Worker) alertAll(ctx context.Context, text string) bool {
	tried, ok := 0, 0
	for _, s := range w.o.Sinks {
		a, isAlerter := s.(Alerter)
		if !isAlerter {
			continue
		}
		tried++
		actx, cancel := context.WithTimeout(ctx, w.o.CallTimeout)
		err := a.Alert(actx, text)
		cancel()
		if err != nil {
			w.log.Error("triage: could not send the alert", "sink", s.Name(), "err", err)
			continue
		}
		ok++
	}
	if tried == 0 {
		w.log.Warn("triage: no sink carries alerts; the log line above is the alert")
	}
	return tried == 0 || ok > 0
}
