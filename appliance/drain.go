package appliance

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"gpuhost/api"
	"gpuhost/config"
)

// Drainer lets the requests running on the backends a switch takes away
// finish before it does, and cuts the rest. The /v1 proxy implements it;
// the daemon wires it (SetDrainer). Without one a switch has no drain step.
type Drainer interface {
	// Drain waits for the requests being forwarded to profiles to
	// finish, at most timeout (or until ctx ends), cuts those still
	// running with an error to their clients, and returns how many
	// finished (drained) and how many it cut. It is called with the
	// switch already in the state, so no new request reaches profiles.
	Drain(ctx context.Context, profiles []string, timeout time.Duration) (drained, cut int)
}

// drainSlot holds the Drainer; the zero value is "none".
type drainSlot = atomic.Pointer[drainerBox]

type drainerBox struct{ d Drainer }

// SetDrainer installs the drain of a switch's first step (nil removes it).
func (s *Supervisor) SetDrainer(d Drainer) {
	if d == nil {
		s.drainer.Store(nil)
		return
	}
	s.drainer.Store(&drainerBox{d})
}

// drainStep runs the drain step before the backends in l's way are put in
// standby or stopped, when a Drainer is installed and this is not a
// rollback (no request was admitted to the failed target: it never
// became active).
func (l *leg) drainStep(ctx context.Context) error {
	box := l.r.s.drainer.Load()
	if box == nil || l.r.rollback || len(l.toStop)+len(l.toStandby) == 0 {
		return nil
	}
	return l.r.step(ctx, api.StepDrain, func(ctx context.Context) (string, map[string]any, error) {
		return l.drainOld(ctx, box.d)
	})
}

// drainOld lets the requests on the profiles in the way finish, at most
// switch.drain_timeout, and cuts the rest (Drainer.Drain).
func (l *leg) drainOld(ctx context.Context, d Drainer) (string, map[string]any, error) {
	var profiles []string
	for _, b := range append(append([]backendState(nil), l.toStandby...), l.toStop...) {
		if b.profile != "" {
			profiles = append(profiles, b.profile)
		}
	}
	timeout := config.DefaultSwitchDrainTimeout
	if t := l.r.s.cfg.Switch.DrainTimeout; t != nil {
		timeout = t.D()
	}
	drained, cut := d.Drain(ctx, profiles, timeout)
	detail := map[string]any{api.DetailDrained: drained, api.DetailCut: cut, "drain_timeout_ms": timeout.Milliseconds(), "profiles": profiles}
	who := strings.Join(profiles, ", ")
	switch {
	case drained+cut == 0:
		return "no requests in flight on " + who, detail, nil
	case cut == 0:
		return fmt.Sprintf("%d %s on %s finished", drained, plural(drained, "request", "requests"), who), detail, nil
	}
	msg := fmt.Sprintf("%d %s on %s finished, %d cut after switch.drain_timeout %s", drained, plural(drained, "request", "requests"), who, cut, timeout)
	return msg + l.awaitEnginesIdle(ctx), detail, nil
}

// runningCounter is an engine that says how many requests it still runs
// (vLLM's vllm:num_requests_running).
type runningCounter interface {
	RequestsRunning(ctx context.Context) (int, error)
}

// cutSettle bounds the wait for a cut request to leave the engine.
const cutSettle = 2 * time.Second

// awaitEnginesIdle waits, at most cutSettle, until the engines going into
// standby run no request: a request cut at the front door is cancelled
// in the engine a moment later, through the unit's socket relay, and a
// sleep must not overtake it (an engine put to sleep under a request
// aborts it, and some vLLM releases hang). An engine that cannot say is
// not waited for.
func (l *leg) awaitEnginesIdle(ctx context.Context) string {
	s := l.r.s
	wctx, cancel := context.WithTimeout(ctx, cutSettle)
	defer cancel()
	for _, b := range l.toStandby {
		p := s.cfg.Profiles[b.profile]
		if p == nil {
			continue
		}
		be, err := s.engineOf(p)
		rc, ok := be.(runningCounter)
		if err != nil || !ok {
			continue
		}
		for {
			n, err := rc.RequestsRunning(wctx)
			if err != nil || n == 0 {
				break
			}
			select {
			case <-wctx.Done():
				return fmt.Sprintf("; %s still ran %d after %s", b.profile, n, cutSettle)
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	return ""
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
