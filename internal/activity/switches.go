package activity

import (
	"slices"

	"gpuhost/api"
)

// SlowFactor is how many times the median of its kind a switch (or one of
// its steps) must take to stand out. `gpuhost bench switch` names its
// outliers by the same factor, so a switch the bench reports as an
// outlier is one this page marks.
const SlowFactor = 3

// minJudged is how many finished switches of a kind (or steps of a name)
// a median needs before anything is judged against it: with two, neither
// can exceed three times their median.
const minJudged = 3

// Switch modes, as `gpuhost bench switch` names them.
const (
	ModeCold    = "cold"
	ModeStandby = "standby"
)

// observeStep records a finished step of the switch; a "wake" step makes
// it a standby switch. Rollback steps ("rollback.wake") bring the old
// profile back and do not change the mode.
func (sw *Switch) observeStep(e api.Event) {
	if e.Status != api.StatusDone && e.Status != api.StatusFailed {
		return
	}
	if e.Step == api.StepWake {
		sw.Mode = ModeStandby
	}
	sw.Steps = append(sw.Steps, Step{Name: e.Step, Status: string(e.Status), MS: e.DurationMS, Message: e.Message})
}

// judgeSwitches returns copies of the switches with Slow, MedianMS and
// each step's Long set against the finished switches kept of the same
// profile and mode (a wake is not judged against cold starts, nor an
// Ollama load against a vLLM start). The copies own their steps, so the caller may read
// them without the history's lock.
func judgeSwitches(all []Switch) []Switch {
	type kind struct{ profile, mode string }
	durs := map[kind][]float64{}
	steps := map[kind]map[string][]float64{}
	for _, sw := range all {
		if sw.End.IsZero() || sw.Status == "unknown" {
			continue
		}
		k := kind{sw.Profile, sw.Mode}
		durs[k] = append(durs[k], sw.DurationMS)
		if steps[k] == nil {
			steps[k] = map[string][]float64{}
		}
		for _, st := range sw.Steps {
			steps[k][st.Name] = append(steps[k][st.Name], st.MS)
		}
	}
	out := make([]Switch, len(all))
	for i, sw := range all {
		sw.Steps = slices.Clone(sw.Steps)
		k := kind{sw.Profile, sw.Mode}
		if d := durs[k]; len(d) >= minJudged && !sw.End.IsZero() {
			sw.MedianMS = median(d)
			sw.Slow = sw.DurationMS > SlowFactor*sw.MedianMS
		}
		for j, st := range sw.Steps {
			// A step that took a tenth of the switch or less did not make
			// it slow, whatever its own spread (a 0.3 ms configure).
			if xs := steps[k][st.Name]; len(xs) >= minJudged && st.MS >= sw.DurationMS/10 {
				sw.Steps[j].Long = st.MS > SlowFactor*median(xs)
			}
		}
		out[i] = sw
	}
	return out
}

// median of xs (not empty), the mean of the middle two for an even count.
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
