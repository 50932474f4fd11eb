package proxy

import (
	"strings"
	"testing"

	"gpuhost/api"
)

// fakeEvents is an event buffer: Subscribe returns what follows since.
type fakeEvents struct{ evs []api.Event }

func (f *fakeEvents) Subscribe(since uint64) (<-chan api.Event, []api.Event, func()) {
	var out []api.Event
	for _, e := range f.evs {
		if e.Seq > since {
			out = append(out, e)
		}
	}
	return nil, out, func() {}
}

// add appends one switch of profile: its step names (each done, a
// "-failed" suffix makes it fail), its end status and total duration.
func (f *fakeEvents) add(id, profile string, steps []string, end api.EventStatus, ms float64) {
	next := func(e api.Event) {
		e.Seq, e.SwitchID = uint64(len(f.evs)+1), id
		if e.Profile == "" {
			e.Profile = profile
		}
		f.evs = append(f.evs, e)
	}
	next(api.Event{Kind: api.EventSwitch, Status: api.StatusStarted})
	for _, s := range steps {
		st := api.StatusDone
		if name, failed := strings.CutSuffix(s, "-failed"); failed {
			s, st = name, api.StatusFailed
		}
		next(api.Event{Kind: api.EventStep, Step: s, Status: api.StatusStarted})
		next(api.Event{Kind: api.EventStep, Step: s, Status: st})
	}
	next(api.Event{Kind: api.EventSwitch, Status: end, DurationMS: ms})
}

// TestSwitchTimes: which switches count as a wake or a cold start, and
// the median over the last few.
func TestSwitchTimes(t *testing.T) {
	cold := []string{"drain", "stop", "vram_release", "configure", "start", "ready", "verify", "wake_check"}
	wake := []string{"drain", "standby", "wake", "ready", "verify", "wake_check"}
	tests := []struct {
		name             string
		run              func(f *fakeEvents)
		wantWake, wantCo float64
	}{
		{"nothing seen", func(f *fakeEvents) {}, 0, 0},
		{"a cold start", func(f *fakeEvents) { f.add("a", "p", cold, api.StatusDone, 4200.4) }, 0, 4200},
		{"a wake", func(f *fakeEvents) { f.add("a", "p", wake, api.StatusDone, 350) }, 350, 0},
		{"a failed wake started cold counts as cold", func(f *fakeEvents) {
			f.add("a", "p", []string{"wake-failed", "vram_release", "configure", "start", "ready", "verify"}, api.StatusDone, 5000)
		}, 0, 5000},
		{"a failed switch does not count", func(f *fakeEvents) { f.add("a", "p", cold, api.StatusFailed, 900) }, 0, 0},
		{"a rollback's wake is not the target's", func(f *fakeEvents) {
			f.add("a", "p", []string{"stop", "start-failed", "rollback.wake"}, api.StatusFailed, 800)
		}, 0, 0},
		{"a switch to what already serves counts as neither", func(f *fakeEvents) {
			f.add("a", "p", []string{"ready", "verify"}, api.StatusDone, 3)
		}, 0, 0},
		{"the median of the last five", func(f *fakeEvents) {
			for i, ms := range []float64{9000, 100, 300, 200, 500, 400} { // the first falls out
				f.add(string(rune('a'+i)), "p", wake, api.StatusDone, ms)
			}
		}, 300, 0},
		{"another profile's switches are its own", func(f *fakeEvents) { f.add("a", "q", cold, api.StatusDone, 700) }, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := &fakeEvents{}
			var times switchTimes
			tt.run(src)
			// Read twice with an event in between: folding catches up
			// once and does not count a switch twice.
			times.of(src, "p")
			src.add("z", "other", cold, api.StatusDone, 1)
			if w, c := times.of(src, "p"); w != tt.wantWake || c != tt.wantCo {
				t.Errorf("wake %v cold %v, want %v and %v", w, c, tt.wantWake, tt.wantCo)
			}
		})
	}
}
