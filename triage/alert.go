package triage

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"time"
)

// AlertState follows consecutive failed polls (issue item 9): quiet for
// the first AlertFailures-1, then one alert, a reminder every RemindEvery
// while it keeps failing, and one all-clear when a poll succeeds again. It
// rides in the checkpoint, so that a restart during an outage neither
// repeats the alert nor forgets to give the all-clear.
type AlertState struct {
	Failures  int       `json:"failures"`
	FirstFail time.Time `json:"first_fail,omitzero"`
	Alerted   bool      `json:"alerted,omitempty"`
	LastAlert time.Time `json:"last_alert,omitzero"`
	// Told are the sinks that carried the alert or a reminder: each of
	// them, and only they, get the all-clear.
	Told []string `json:"told,omitempty"`
	// ClearPending are the sinks still owed ClearText, the all-clear of
	// an ended streak (one refused it): tried again after every
	// successful poll.
	ClearPending []string `json:"clear_pending,omitempty"`
	ClearText    string   `json:"clear_text,omitempty"`
}

func (a AlertState) clone() AlertState {
	a.Told = slices.Clone(a.Told)
	a.ClearPending = slices.Clone(a.ClearPending)
	return a
}

// storedAlert is a as the checkpoint keeps it: nil when there is nothing
// to remember.
func storedAlert(a AlertState) *AlertState {
	if reflect.DeepEqual(a, AlertState{}) {
		return nil
	}
	c := a.clone()
	return &c
}

// saveAlert writes the alert state with the checkpoint when it changed.
// A failed write is logged: the alerting goes on from memory. Callers hold
// w.mu.
func (w *Worker) saveAlert() {
	w.smu.Lock()
	a := storedAlert(w.alert)
	w.smu.Unlock()
	if reflect.DeepEqual(a, w.st.Alert) {
		return
	}
	st := w.st.clone()
	st.Alert = a
	if err := w.save(st); err != nil {
		w.log.Error("triage: could not write the alert state to the checkpoint; a restart may not give the all-clear", "err", err)
	}
}

func (w *Worker) pollFailed(ctx context.Context, now time.Time, err error) {
	defer w.saveAlert()
	w.metrics.pollFailures.Inc()
	w.smu.Lock()
	w.status.LastPoll = now
	w.status.LastError = err.Error()
	a := &w.alert
	a.Failures++
	if a.Failures == 1 {
		a.FirstFail = now
	}
	var text string
	switch {
	case a.Failures < w.o.AlertFailures:
	case !a.Alerted:
		text = fmt.Sprintf("triage: mail from %s is not being processed — %d polls in a row failed since %s. Last error: %v",
			w.name, a.Failures, a.FirstFail.UTC().Format(time.RFC3339), err)
	case now.Sub(a.LastAlert) >= w.o.RemindEvery:
		text = fmt.Sprintf("triage: reminder — mail from %s is still not being processed (%d failed polls since %s). Last error: %v",
			w.name, a.Failures, a.FirstFail.UTC().Format(time.RFC3339), err)
	}
	failures := a.Failures
	w.metrics.consecutive.Set(float64(failures))
	w.smu.Unlock()
	if text == "" {
		return
	}
	w.log.Error(text, "failures", failures)
	// The alert counts as raised when some sink carried it (or there is
	// none that could): otherwise it is tried again on the next failure.
	told, tried := w.alertSinks(ctx, text, nil)
	if tried == 0 || len(told) > 0 {
		w.smu.Lock()
		a.Alerted = true
		a.LastAlert = now
		for _, name := range told {
			if !slices.Contains(a.Told, name) {
				a.Told = append(a.Told, name)
			}
		}
		// This streak's all-clear will reach them; an older one's is moot.
		a.ClearPending, a.ClearText = nil, ""
		w.status.LastAlert = now
		w.smu.Unlock()
	}
}

func (w *Worker) pollOK(ctx context.Context, now time.Time) {
	defer w.saveAlert()
	w.smu.Lock()
	w.status.LastPoll, w.status.LastPollOK, w.status.LastError = now, now, ""
	a := w.alert.clone()
	w.alert = AlertState{ClearPending: a.ClearPending, ClearText: a.ClearText}
	w.metrics.consecutive.Set(0)
	w.smu.Unlock()
	switch {
	case a.Alerted:
		text := fmt.Sprintf("triage: all clear — mail from %s is processed again after %d failed polls over %s.",
			w.name, a.Failures, now.Sub(a.FirstFail).Round(time.Second))
		w.log.Info(text, "failures", a.Failures, "sinks", a.Told)
		w.smu.Lock()
		w.alert.ClearPending, w.alert.ClearText = a.Told, text
		// Recorded whether or not every sink takes it: the streak is over
		// either way; a sink that refuses it is tried again.
		w.status.LastAllClear = now
		w.smu.Unlock()
	case a.Failures > 0:
		w.log.Info("triage: polling works again", "failed_polls", a.Failures)
	}
	w.smu.Lock()
	pending, text := slices.Clone(w.alert.ClearPending), w.alert.ClearText
	w.smu.Unlock()
	if len(pending) == 0 {
		return
	}
	told, _ := w.alertSinks(ctx, text, pending)
	w.smu.Lock()
	w.alert.ClearPending = slices.DeleteFunc(w.alert.ClearPending, func(n string) bool { return slices.Contains(told, n) })
	if len(w.alert.ClearPending) == 0 {
		w.alert.ClearPending, w.alert.ClearText = nil, ""
	}
	w.smu.Unlock()
}

// alertAll sends text to every sink that is an Alerter and reports whether
// the alert reached someone (or there was no sink that could carry it, in
// which case the log line is all there is).
func (w *Worker) alertAll(ctx context.Context, text string) bool {
	told, tried := w.alertSinks(ctx, text, nil)
	return tried == 0 || len(told) > 0
}

// alertSinks sends text to the Alerter sinks (only those named in only,
// when it is not nil) and returns the names of those that took it and how
// many were tried. A ChannelAlerter's destinations are named
// "sink:channel", each told (and later cleared) on its own; a bare sink
// name in only (a checkpoint from before channels were told apart) stands
// for all its channels.
func (w *Worker) alertSinks(ctx context.Context, text string, only []string) (told []string, tried int) {
	for _, s := range w.o.Sinks {
		a, isAlerter := s.(Alerter)
		if !isAlerter {
			continue
		}
		send := func(actx context.Context) error { return a.Alert(actx, text) }
		names := []string{s.Name()}
		if ca, ok := s.(ChannelAlerter); ok {
			var channels []string
			names = nil
			for _, ch := range ca.AlertChannels() {
				if name := s.Name() + ":" + ch; only == nil || slices.Contains(only, name) || slices.Contains(only, s.Name()) {
					channels, names = append(channels, ch), append(names, name)
				}
			}
			send = func(actx context.Context) error {
				took, err := ca.AlertTo(actx, text, channels)
				names = names[:0]
				for _, ch := range took {
					names = append(names, s.Name()+":"+ch)
				}
				return err
			}
		} else if only != nil && !slices.Contains(only, s.Name()) {
			continue
		}
		if len(names) == 0 {
			continue
		}
		tried++
		actx, cancel := context.WithTimeout(ctx, w.o.CallTimeout)
		err := send(actx)
		cancel()
		if err != nil {
			w.log.Error("triage: could not send the alert", "sink", s.Name(), "err", err)
			if _, ok := s.(ChannelAlerter); !ok {
				continue
			}
		}
		told = append(told, names...)
	}
	if tried == 0 && only == nil {
		w.log.Warn("triage: no sink carries alerts; the log line above is the alert")
	}
	return told, tried
}
