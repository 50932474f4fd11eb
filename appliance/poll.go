package appliance

import (
	"context"
	"time"
)

// poller yields an adaptive schedule: the first check comes at once, then
// the gap grows from 2 ms by half each time up to a cap, so fast events are
// seen within milliseconds. The cap bounds how late a slow event (a model
// load of minutes) is noticed; at 20 ms a health poll costs the backend 50
// refused connects or tiny GETs a second, which is nothing next to a load.
// An early cap holds the gap lower for the first stretch, where a fast
// backend answers: a start that answers after 20 ms would otherwise be
// seen only at the 26 ms poll.
type poller struct {
	next, max time.Duration
	earlyMax  time.Duration
	earlyEnd  time.Time
}

func newPoller(max time.Duration) *poller { return &poller{next: 2 * time.Millisecond, max: max} }

// newEarlyPoller is newPoller whose gap stays at most earlyMax for the
// first earlyFor.
func newEarlyPoller(max, earlyMax, earlyFor time.Duration) *poller {
	return &poller{next: min(2*time.Millisecond, earlyMax), max: max, earlyMax: earlyMax, earlyEnd: time.Now().Add(earlyFor)}
}

// Poll caps: how late at most a ready backend or released VRAM is seen.
// The ready poll's gap stays at most readyPollEarlyCap for its first
// readyPollEarlyFor: a simulated or a small backend answers within it,
// and 500 health GETs a second for two seconds cost the box little (the
// unit's state, which PID 1 answers, is read only every readyUnitEvery).
const (
	readyPollCap      = 20 * time.Millisecond
	readyPollEarlyCap = 2 * time.Millisecond
	readyPollEarlyFor = 2 * time.Second
	releasePollCap    = 20 * time.Millisecond
)

func (p *poller) wait(ctx context.Context) error {
	t := time.NewTimer(p.next)
	defer t.Stop()
	limit := p.max
	if p.earlyMax > 0 && time.Now().Before(p.earlyEnd) {
		limit = p.earlyMax
	}
	p.next = min(p.next*3/2, limit)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
