package panel

import (
	"context"
	"fmt"
	"sync"
	"time"

	"gpuhost/api"
)

// doctorRunTimeout bounds one doctor run; it asks systemd and the backends.
const doctorRunTimeout = 30 * time.Second

// doctorCache runs the doctor at most once per ttl (or minInterval on an
// explicit refresh) and lets concurrent page views share one run: the
// doctor talks to systemd and the backends, and a busy panel must not
// multiply that load.
type doctorCache struct {
	run         api.DoctorFunc
	ttl         time.Duration
	minInterval time.Duration
	now         func() time.Time

	mu      sync.Mutex
	rep     *api.DoctorReport
	at      time.Time
	key     string        // the backend state the report was taken in
	running chan struct{} // closed when the run in flight ends
}

func newDoctorCache(run api.DoctorFunc, ttl, minInterval time.Duration) *doctorCache {
	return &doctorCache{run: run, ttl: ttl, minInterval: minInterval, now: time.Now}
}

// get returns a report no older than the ttl (minInterval when refresh is
// set) and taken in the backend state key (a report from before a switch
// describes the old backend), running the doctor when needed, and when it
// was taken. It returns nil when no doctor is configured, or when ctx ends
// before the first run finishes.
func (d *doctorCache) get(ctx context.Context, refresh bool, key string) (*api.DoctorReport, time.Time) {
	if d.run == nil {
		return nil, time.Time{}
	}
	maxAge := d.ttl
	if refresh {
		maxAge = d.minInterval
	}
	for {
		d.mu.Lock()
		if d.rep != nil && d.key == key && d.now().Sub(d.at) < maxAge {
			rep, at := d.rep, d.at
			d.mu.Unlock()
			return rep, at
		}
		wait := d.running
		if wait == nil {
			wait = make(chan struct{})
			d.running = wait
			go d.runOnce(wait, key)
		}
		d.mu.Unlock()
		select {
		case <-wait:
			d.mu.Lock()
			rep, at := d.rep, d.at
			d.mu.Unlock()
			if rep != nil {
				return rep, at // possibly from another state when it changed meanwhile
			}
		case <-ctx.Done():
			d.mu.Lock()
			rep, at := d.rep, d.at
			d.mu.Unlock()
			return rep, at // possibly stale, possibly nil
		}
	}
}

// runOnce runs the doctor detached from any request: a browser that leaves
// must not leave the next visitor a half-run report.
func (d *doctorCache) runOnce(done chan struct{}, key string) {
	ctx, cancel := context.WithTimeout(context.Background(), doctorRunTimeout)
	defer cancel()
	rep := d.run(ctx, "")
	d.mu.Lock()
	d.rep, d.at, d.key, d.running = &rep, d.now(), key, nil
	d.mu.Unlock()
	close(done)
}

// verdict is one profile's doctor outcome, for the profiles table.
type verdict struct {
	Severity string // ok, warn, fail, or "" when unknown
	Summary  string // the non-ok messages, for the tooltip and no-JS readers
}

// verdicts folds a report into per-profile worst severities.
func verdicts(rep *api.DoctorReport) map[string]verdict {
	out := map[string]verdict{}
	if rep == nil {
		return out
	}
	rank := map[string]int{"ok": 0, "warn": 1, "fail": 2}
	for _, c := range rep.Checks {
		if c.Profile == "" {
			continue
		}
		v, seen := out[c.Profile]
		sev := string(c.Severity)
		if !seen || rank[sev] > rank[v.Severity] {
			v.Severity = sev
		}
		if sev != "ok" {
			if v.Summary != "" {
				v.Summary += "; "
			}
			v.Summary += c.ID + ": " + c.Message
		}
		out[c.Profile] = v
	}
	return out
}

// stateKey names the backend state a doctor report depends on: every
// lane's, on a box of several (a switch on GPU 1 changes what the doctor
// sees as much as one on GPU 0).
func stateKey(st api.State) string {
	key := fmt.Sprintf("%s|%s|%s", st.Phase, st.Profile, st.SwitchID)
	for _, l := range st.Lanes {
		key += fmt.Sprintf(";%s|%s|%s", l.Phase, l.Profile, l.SwitchID)
	}
	return key
}
