package appliance

import (
	"strings"
	"testing"
	"time"

	"gpuhost/units"
)

type fakeWatcher struct {
	wake       map[string]uint64
	drift      map[string]uint64
	ago        time.Duration
	unresolved string
}

func (f fakeWatcher) WakeFailures() (map[string]uint64, time.Time, string) {
	return f.wake, time.Now().Add(-f.ago), "coder: the known prompt answered other words"
}

func (f fakeWatcher) Drift() (map[string]uint64, time.Time, string, string) {
	return f.drift, time.Now().Add(-f.ago), "the active coder is asleep: waking it", f.unresolved
}

func TestWatchChecks(t *testing.T) {
	tests := []struct {
		name            string
		w               fakeWatcher
		wakeSev, drift  units.Severity
		wakeMsg, driftM string
	}{
		{"nothing happened", fakeWatcher{}, units.SeverityOK, units.SeverityOK, "every wake", "no backend changed"},
		{"recent wake failure and fixed drift", fakeWatcher{wake: map[string]uint64{"output": 1}, drift: map[string]uint64{"asleep": 2}, ago: time.Minute},
			units.SeverityWarn, units.SeverityWarn, "1 wake(s) failed the check (output=1)", "2 change(s)"},
		{"old ones", fakeWatcher{wake: map[string]uint64{"rate": 1}, drift: map[string]uint64{"stray_unit": 1}, ago: 2 * time.Hour},
			units.SeverityOK, units.SeverityOK, "rate=1", "stray_unit=1"},
		{"drift not put right", fakeWatcher{drift: map[string]uint64{"asleep": 1}, unresolved: "restoring it failed: wake: refused"},
			units.SeverityOK, units.SeverityFail, "every wake", "not put right: restoring it failed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cs := (&Doctor{Watcher: tt.w}).watchChecks()
			if len(cs) != 2 || cs[0].ID != "standby.wake_verify" || cs[1].ID != "backend.drift" {
				t.Fatalf("checks = %+v", cs)
			}
			if cs[0].Severity != tt.wakeSev || !strings.Contains(cs[0].Message, tt.wakeMsg) {
				t.Errorf("wake_verify = %s %q", cs[0].Severity, cs[0].Message)
			}
			if cs[1].Severity != tt.drift || !strings.Contains(cs[1].Message, tt.driftM) {
				t.Errorf("drift = %s %q", cs[1].Severity, cs[1].Message)
			}
		})
	}
	if cs := (&Doctor{}).watchChecks(); cs != nil {
		t.Errorf("no watcher (the CLI's doctor): %+v", cs)
	}
}
