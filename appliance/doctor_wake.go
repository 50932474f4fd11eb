package appliance

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"gpuhost/api"
	"gpuhost/units"
)

// Watcher is what the daemon's Supervisor reports about verified wakes
// (wakecheck.go) and the watcher's findings (watch.go), for the
// standby.wake_verify and backend.drift checks.
type Watcher interface {
	WakeFailures() (byReason map[string]uint64, last time.Time, lastMsg string)
	Drift() (byKind map[string]uint64, last time.Time, lastMsg, unresolved string)
}

// watchChecks: a wake that failed its check in the last hour warns (the
// unit was restarted cold, so the box serves, but a wake was wrong); a
// backend changed behind gpuhost's back that the watcher could not put
// right fails, one it put right in the last hour warns.
func (d *Doctor) watchChecks() []api.DoctorCheck {
	if d.Watcher == nil {
		return nil
	}
	by, last, msg := d.Watcher.WakeFailures()
	wake := api.DoctorCheck{ID: "standby.wake_verify", Severity: units.SeverityOK, Value: countsText(by),
		Message: "every wake since start answered as at the cold start"}
	if n := sum(by); n > 0 {
		wake.Message = fmt.Sprintf("%d wake(s) failed the check (%s), each restarted cold; last %s ago: %s", n, countsText(by), time.Since(last).Round(time.Second), msg)
		if time.Since(last) < exclusionWindow {
			wake.Severity = units.SeverityWarn
			wake.Fix = "the engine woke wrong (see the wake_check events); if it repeats, set the profile's standby: off (cold starts) or sleep level 2, and check the engine's version against its sleep-mode bugs"
		}
	}
	byKind, dlast, dmsg, unresolved := d.Watcher.Drift()
	drift := api.DoctorCheck{ID: "backend.drift", Severity: units.SeverityOK, Value: countsText(byKind),
		Message: "no backend changed behind gpuhost's back"}
	switch {
	case unresolved != "":
		drift.Severity = units.SeverityFail
		drift.Message = "not put right: " + unresolved
		drift.Fix = "`gpuhost switch` to the wanted profile; find who talks to the backend's port or unit behind gpuhost"
	case sum(byKind) > 0:
		drift.Message = fmt.Sprintf("%d change(s) behind gpuhost's back (%s), put right; last %s ago: %s", sum(byKind), countsText(byKind), time.Since(dlast).Round(time.Second), dmsg)
		if time.Since(dlast) < exclusionWindow {
			drift.Severity = units.SeverityWarn
			drift.Fix = "something drives the backends directly (a hand systemctl, /sleep, a load): find it"
		}
	}
	return []api.DoctorCheck{wake, drift}
}

func sum(m map[string]uint64) uint64 {
	var n uint64
	for _, v := range m {
		n += v
	}
	return n
}

// countsText is "a=1 b=2" in key order, "0" when empty.
func countsText(m map[string]uint64) string {
	if len(m) == 0 {
		return "0"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, " ")
}
