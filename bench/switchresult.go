package bench

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"gpuhost/api"
)

// Paths of a switch measurement: how the switch was asked for.
const (
	// PathSwitch: POST /api/switch, then at once a streamed /v1 request
	// to the target's model (the proxy holds it during the switch); timed
	// from sending the switch request to the first token.
	PathSwitch = "switch"
	// PathRequest: with the other profile active, a streamed /v1 request
	// naming the target's model (the proxy's auto_switch switches); timed
	// from sending the request to its first token.
	PathRequest = "request"
)

// Modes of a switch: how the target came up.
const (
	// ModeCold: the target's unit was started (stop, vram_release,
	// configure, start, ready, [load_model], verify).
	ModeCold = "cold"
	// ModeStandby: the target was woken from standby (the switch has a
	// step named "wake").
	ModeStandby = "standby"
)

// SwitchBench is `gpuhost bench switch A B`: the samples in the order they
// were taken and their summary per direction × path × mode. It sits in
// Result.Switch; such a result has no prefill, decode or serving figures.
//
//	a, b              the profiles, as asked
//	rounds            rounds asked; each has A→B and B→A on each path measured
//	profiles[]        {name, backend, model, served_name, unit, args}: A then B, as the daemon reports them
//	request_path      "measured" | "skipped"; request_path_note says why it was skipped
//	samples[]         {round, from, to, path, mode, switch_id, accepted_ms, first_token_ms,
//	                   switch_ms, steps[]{step, status, ms}}
//	groups[]          {from, to, path, mode, n, first_token_ms, switch_ms}: Stat
//	                  (samples, mean, stddev, n) plus p50 and p95
//	outliers[]        {round, from, to, path, mode, switch_id, first_token_ms, median_ms,
//	                   step, step_ms, step_median_ms, message}: see SwitchOutlier
type SwitchBench struct {
	A        string          `json:"a"`
	B        string          `json:"b"`
	Rounds   int             `json:"rounds"`
	Profiles []SwitchProfile `json:"profiles"`
	// RequestPath is "measured", or "skipped" when the daemon's proxy does
	// not switch for a request (proxy.auto_switch is off, or A and B serve
	// the same model name); RequestPathNote then says why.
	RequestPath     string         `json:"request_path"`
	RequestPathNote string         `json:"request_path_note,omitempty"`
	Samples         []SwitchSample `json:"samples"`
	Groups          []SwitchGroup  `json:"groups"`
	// Outliers are the samples over OutlierFactor × their group's median,
	// each with the step that took the time (absent in older results).
	Outliers []SwitchOutlier `json:"outliers,omitempty"`
}

// Request path states.
const (
	RequestPathMeasured = "measured"
	RequestPathSkipped  = "skipped"
)

// SwitchProfile is one of the two profiles as the daemon reports it.
type SwitchProfile struct {
	Name       string   `json:"name"`
	Backend    string   `json:"backend"`
	Model      string   `json:"model"`
	ServedName string   `json:"served_name"`
	Unit       string   `json:"unit,omitempty"`
	Args       []string `json:"args,omitempty"`
}

// SwitchSample is one measured switch.
type SwitchSample struct {
	Round    int    `json:"round"` // from 1
	From     string `json:"from"`
	To       string `json:"to"`
	Path     string `json:"path"` // PathSwitch or PathRequest
	Mode     string `json:"mode"` // ModeCold or ModeStandby, from the switch's steps
	SwitchID string `json:"switch_id"`
	// AcceptedMS is when POST /api/switch was answered (switch path only),
	// FirstTokenMS when the first token of the /v1 request arrived, both
	// from sending the first request of the sample.
	AcceptedMS   float64 `json:"accepted_ms,omitempty"`
	FirstTokenMS float64 `json:"first_token_ms"`
	// SwitchMS is the switch's own duration, from its "switch done" event.
	SwitchMS float64      `json:"switch_ms"`
	Steps    []SwitchStep `json:"steps"`
}

// SwitchStep is one step of a switch, from its done or failed event.
type SwitchStep struct {
	Step   string  `json:"step"`
	Status string  `json:"status"`
	MS     float64 `json:"ms"`
	// Message is the step's own account ("… not in standby (…); it will
	// be stopped"), which names the cause of an outlier.
	Message string `json:"message,omitempty"`
}

// SwitchGroup summarises the samples of one direction, path and mode.
type SwitchGroup struct {
	From         string      `json:"from"`
	To           string      `json:"to"`
	Path         string      `json:"path"`
	Mode         string      `json:"mode"`
	N            int         `json:"n"`
	FirstTokenMS LatencyStat `json:"first_token_ms"`
	SwitchMS     LatencyStat `json:"switch_ms"`
}

// LatencyStat is a Stat (one sample per switch) with its p50 and p95
// (numpy's linear interpolation, as Percentile).
type LatencyStat struct {
	Stat
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
}

// NewLatencyStat summarises samples; empty input has N 0 and zero
// percentiles.
func NewLatencyStat(samples []float64) LatencyStat {
	l := LatencyStat{Stat: NewStat(samples)}
	if l.N > 0 {
		l.P50, l.P95 = Percentile(l.Samples, 50), Percentile(l.Samples, 95)
	}
	return l
}

// SwitchMode derives the mode of a switch from its events: a switch with
// a step named "wake" brought the target up from standby; any other
// (the target's unit was started) is cold. Rollback steps
// ("rollback.wake") do not count: they bring back the previous profile.
// A wake whose check failed is followed by a start: that switch is cold.
func SwitchMode(evs []api.Event) string {
	mode := ModeCold
	for _, e := range evs {
		switch {
		case e.Kind == api.EventStep && e.Step == api.StepWake:
			mode = ModeStandby
		case e.Kind == api.EventStep && e.Step == api.StepStart:
			return ModeCold
		}
	}
	return mode
}

// switchSteps lists the finished steps of a switch in order.
func switchSteps(evs []api.Event) []SwitchStep {
	out := []SwitchStep{}
	for _, e := range evs {
		if e.Kind == api.EventStep && (e.Status == api.StatusDone || e.Status == api.StatusFailed) {
			out = append(out, SwitchStep{Step: e.Step, Status: string(e.Status), MS: e.DurationMS, Message: e.Message})
		}
	}
	return out
}

// groupSwitchSamples summarises samples per direction (A→B first), path
// (switch first) and mode (cold first).
func groupSwitchSamples(a, b string, samples []SwitchSample) []SwitchGroup {
	type key struct{ from, to, path, mode string }
	rank := func(k key) []int {
		dir := 1
		if k.from == a && k.to == b {
			dir = 0
		}
		path := 1
		if k.path == PathSwitch {
			path = 0
		}
		mode := 1
		if k.mode == ModeCold {
			mode = 0
		}
		return []int{dir, path, mode}
	}
	byKey := map[key][]SwitchSample{}
	var keys []key
	for _, s := range samples {
		k := key{s.From, s.To, s.Path, s.Mode}
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], s)
	}
	slices.SortStableFunc(keys, func(x, y key) int {
		if c := slices.Compare(rank(x), rank(y)); c != 0 {
			return c
		}
		return cmp.Compare(x.from+" "+x.mode, y.from+" "+y.mode)
	})
	out := []SwitchGroup{}
	for _, k := range keys {
		var ft, sw []float64
		for _, s := range byKey[k] {
			ft = append(ft, s.FirstTokenMS)
			sw = append(sw, s.SwitchMS)
		}
		out = append(out, SwitchGroup{From: k.from, To: k.to, Path: k.path, Mode: k.mode, N: len(byKey[k]),
			FirstTokenMS: NewLatencyStat(ft), SwitchMS: NewLatencyStat(sw)})
	}
	return out
}

// metrics are the comparable figures of a switch result:
// switch.<from>-><to>.<path>_path.<mode>.{first_token_ms, switch_ms}, one
// sample per switch (compare tests them as the other metrics' repeats).
func (s *SwitchBench) metrics() []Metric {
	var out []Metric
	for _, g := range s.Groups {
		pre := fmt.Sprintf("switch.%s->%s.%s_path.%s.", g.From, g.To, g.Path, g.Mode)
		for _, m := range []struct {
			name string
			st   Stat
		}{{"first_token_ms", g.FirstTokenMS.Stat}, {"switch_ms", g.SwitchMS.Stat}} {
			if m.st.N > 0 {
				out = append(out, Metric{Name: pre + m.name, Unit: "ms", Stat: m.st})
			}
		}
	}
	return out
}

// profile returns the recorded profile named name.
func (s *SwitchBench) profile(name string) (SwitchProfile, bool) {
	for _, p := range s.Profiles {
		if p.Name == name {
			return p, true
		}
	}
	return SwitchProfile{}, false
}

// switchProfilesDiff lists what differs between the profiles two switch
// results measured (by name), for compare's setup changes.
func switchProfilesDiff(a, b *SwitchBench) []string {
	if a == nil || b == nil {
		return nil
	}
	var names []string
	for _, p := range append(slices.Clone(a.Profiles), b.Profiles...) {
		if !slices.Contains(names, p.Name) {
			names = append(names, p.Name)
		}
	}
	var out []string
	for _, n := range names {
		pa, okA := a.profile(n)
		pb, okB := b.profile(n)
		if !okA || !okB {
			continue // the profile field of the fingerprint names the change
		}
		add := func(what, x, y string) {
			if x != y {
				out = append(out, fmt.Sprintf("profile %s %s: %s → %s", n, what, orDash(x), orDash(y)))
			}
		}
		add("backend", pa.Backend, pb.Backend)
		add("model", pa.Model, pb.Model)
		add("served name", pa.ServedName, pb.ServedName)
		add("flags", strings.Join(pa.Args, " "), strings.Join(pb.Args, " "))
	}
	return out
}
