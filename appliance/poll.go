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
type poller struct {
	next, max time.Duration
}

func newPoller(max time.Duration) *poller { return &poller{next: 2 * time.Millisecond, max: max} }

// Poll caps: how late at most a ready backend or released VRAM is seen.
const (
	readyPollCap   = 20 * time.Millisecond
	releasePollCap = 20 * time.Millisecond
)

func (p *poller) wait(ctx context.Context) error {
	t := time.NewTimer(p.next)
	defer t.Stop()
	p.next = min(p.next*3/2, p.max)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
