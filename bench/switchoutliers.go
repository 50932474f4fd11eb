package bench

import (
	"fmt"
	"strings"
)

// OutlierFactor is how many times its group's median a switch sample's
// time to the first token must exceed to count as an outlier. The
// Activity page marks a switch the same way (3× the median of its kind):
// one rule, so a sample the report names is one the page shows.
const OutlierFactor = 3

// SwitchOutlier is a sample that took more than OutlierFactor times its
// group's median, with the step that explains it: the step whose time
// exceeded that step's median in the group by the most, and its message
// from the daemon's events (e.g. "ollama.service not in standby (… holds
// 6200 MiB in standby, above its measured residual …); it will be
// stopped" for a standby step that waited its release timeout).
type SwitchOutlier struct {
	Round        int     `json:"round"`
	From         string  `json:"from"`
	To           string  `json:"to"`
	Path         string  `json:"path"`
	Mode         string  `json:"mode"`
	SwitchID     string  `json:"switch_id"`
	FirstTokenMS float64 `json:"first_token_ms"`
	MedianMS     float64 `json:"median_ms"` // the group's p50 of first_token_ms
	// Step is "" when no step took longer than usual: the time went
	// outside the switch's steps (the first token itself).
	Step         string  `json:"step,omitempty"`
	StepMS       float64 `json:"step_ms,omitempty"`
	StepMedianMS float64 `json:"step_median_ms,omitempty"`
	Message      string  `json:"message,omitempty"`
}

// Why says in words what made the sample slow.
func (o SwitchOutlier) Why() string {
	if o.Step == "" {
		return "no step of the switch took longer than usual; the time went to the first token after it"
	}
	s := fmt.Sprintf("step %s took %s ms (median %s ms)", o.Step, fmtNum(o.StepMS), fmtNum(o.StepMedianMS))
	if o.Message != "" {
		s += ": " + o.Message
	}
	return s
}

// String is the outlier's line in the report.
func (o SwitchOutlier) String() string {
	return fmt.Sprintf("round %d %s → %s %s path (%s): %s ms, %.1f× the median %s ms; %s",
		o.Round, o.From, o.To, o.Path, o.Mode, fmtNum(o.FirstTokenMS), o.FirstTokenMS/o.MedianMS, fmtNum(o.MedianMS), o.Why())
}

// switchOutliers finds the samples over OutlierFactor × their group's
// median time to the first token, in sample order. A group of two cannot
// have one (neither sample reaches twice their mean), so it takes three
// samples of a kind before anything stands out.
func switchOutliers(samples []SwitchSample) []SwitchOutlier {
	type key struct{ from, to, path, mode string }
	groups := map[key][]SwitchSample{}
	for _, s := range samples {
		k := key{s.From, s.To, s.Path, s.Mode}
		groups[k] = append(groups[k], s)
	}
	out := []SwitchOutlier{}
	for _, s := range samples {
		g := groups[key{s.From, s.To, s.Path, s.Mode}]
		ft := make([]float64, len(g))
		for i, x := range g {
			ft[i] = x.FirstTokenMS
		}
		med := Percentile(ft, 50)
		if !(med > 0 && s.FirstTokenMS > OutlierFactor*med) {
			continue
		}
		o := SwitchOutlier{Round: s.Round, From: s.From, To: s.To, Path: s.Path, Mode: s.Mode, SwitchID: s.SwitchID,
			FirstTokenMS: s.FirstTokenMS, MedianMS: med}
		excess := 0.0
		for _, st := range s.Steps {
			m := stepMedian(g, st.Step)
			if d := st.MS - m; d > excess {
				excess = d
				o.Step, o.StepMS, o.StepMedianMS, o.Message = st.Step, st.MS, m, st.Message
			}
		}
		out = append(out, o)
	}
	return out
}

// stepMedian is the median time of the step named step over the samples
// that have it.
func stepMedian(g []SwitchSample, step string) float64 {
	var xs []float64
	for _, s := range g {
		for _, st := range s.Steps {
			if st.Step == step {
				xs = append(xs, st.MS)
			}
		}
	}
	return Percentile(xs, 50)
}

// outlierNote is the result's note for its outliers ("" without any).
func outlierNote(os []SwitchOutlier) string {
	if len(os) == 0 {
		return ""
	}
	rounds := make([]string, len(os))
	for i, o := range os {
		rounds[i] = fmt.Sprintf("round %d %s → %s", o.Round, o.From, o.To)
	}
	return fmt.Sprintf("%d outlier(s) over %d× their median: %s (see outliers)", len(os), OutlierFactor, strings.Join(rounds, ", "))
}
