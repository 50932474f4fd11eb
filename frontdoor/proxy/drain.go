package proxy

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"gpuhost/api"
)

// A switch takes the old profile's backend away (stops it, or puts it to
// sleep), and a request still running on it would be cut off mid-answer.
// So the switch's drain step (appliance's Drainer, which the proxy is)
// first lets the requests being forwarded to the profiles it takes away
// finish, at most switch.drain_timeout, then cuts the rest: their
// forwarding is cancelled, which closes their connection to the backend
// (so nothing of them reaches a backend that sleeps), and each client gets
// an error in its API's shape (a status error when no header was sent
// yet, else the stream's error event: streamend.go). New requests are
// not admitted meanwhile: the switch shows in the Supervisor's state, and
// requests are held there (route) until it ends.
//
// The one race is a request that routed to the old profile just before the
// switch began and is about to be forwarded. flights closes it: a
// forwarding is registered under flights.mu only after reading the state
// there again, and the drain takes its list under the same lock after the
// switch set its state. So a forwarding is either on the drain's list or
// saw the switch and is routed again (held).

// errSwitchCut is the cause the forwarding of a request is cancelled with
// when a switch cuts it.
var errSwitchCut = errors.New("a switch cut the request: it was still running when switch.drain_timeout ran out")

// cutWait bounds how long Drain waits for the requests it cut to end (their
// error goes to the client; a client that does not read could hold that
// write). Their connections to the backend are closed at once regardless.
const cutWait = 2 * time.Second

// flight is one forwarding to a backend.
type flight struct {
	profile string
	cancel  context.CancelCauseFunc
	done    chan struct{} // closed when the forwarding has ended
	cut     atomic.Bool   // a drain cut it
}

// flights are the forwardings under way.
type flights struct {
	mu  sync.Mutex
	set map[*flight]struct{}
}

// admit registers a forwarding to profile, with the context its outgoing
// request is to use (parent, cancellable by a drain). ok is false when the
// Supervisor no longer shows profile active and settled: a switch began
// after the request was routed; route it again.
func (fs *flights) admit(sup Backend, profile string, parent context.Context) (*flight, context.Context, bool) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if st := sup.State(); st.Phase != api.PhaseActive || st.Step != "" || st.Profile != profile {
		return nil, nil, false
	}
	ctx, cancel := context.WithCancelCause(parent)
	f := &flight{profile: profile, cancel: cancel, done: make(chan struct{})}
	if fs.set == nil {
		fs.set = map[*flight]struct{}{}
	}
	fs.set[f] = struct{}{}
	return f, ctx, true
}

// end ends f's registration once its forwarding is over.
func (fs *flights) end(f *flight) {
	fs.mu.Lock()
	delete(fs.set, f)
	fs.mu.Unlock()
	close(f.done)
	f.cancel(nil)
}

// running lists the forwardings to the profiles.
func (fs *flights) running(profiles []string) []*flight {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	var out []*flight
	for f := range fs.set {
		if slices.Contains(profiles, f.profile) {
			out = append(out, f)
		}
	}
	return out
}

// InFlight is the number of requests being forwarded to profile now: the
// Supervisor verifies an active backend only while it is idle.
func (p *Proxy) InFlight(profile string) int {
	return len(p.flights.running([]string{profile}))
}

// Drain lets the requests being forwarded to profiles finish, at most
// timeout (or until ctx ends), then cuts the ones still running (see the
// top of this file). drained counts those that ended by themselves, cut
// those it cut. The Supervisor calls it as the first step of a switch,
// its state already showing the switch, so no new request is admitted to
// profiles until the switch ends.
func (p *Proxy) Drain(ctx context.Context, profiles []string, timeout time.Duration) (drained, cut int) {
	running := p.flights.running(profiles)
	if len(running) == 0 {
		return 0, 0
	}
	timer := time.NewTimer(max(timeout, 0))
	defer timer.Stop()
	waiting := true
	for _, f := range running {
		if waiting {
			select {
			case <-f.done:
				drained++
				continue
			case <-timer.C:
			case <-ctx.Done():
			}
			waiting = false
		}
		select {
		case <-f.done:
			drained++
		default:
			f.cut.Store(true)
			f.cancel(errSwitchCut)
			cut++
		}
	}
	p.switchEnds.WithLabelValues("drained").Add(float64(drained))
	if cut == 0 {
		return drained, 0
	}
	p.switchEnds.WithLabelValues("cut").Add(float64(cut))
	p.log.Warn("switch: requests still running when switch.drain_timeout ran out were cut", "profiles", profiles, "cut", cut, "drained", drained, "drain_timeout", timeout)
	bound := time.NewTimer(cutWait)
	defer bound.Stop()
	for _, f := range running {
		if !f.cut.Load() {
			continue
		}
		select {
		case <-f.done:
		case <-bound.C:
			return drained, cut
		}
	}
	return drained, cut
}

// newSwitchEndsCounter counts the requests that were running when a switch
// took their backend away, by how they ended.
func newSwitchEndsCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuhost_proxy_switch_drain_requests_total",
		Help: "Requests on /v1 that were running when a switch began to take their backend away, by outcome (drained: finished within switch.drain_timeout; cut: ended with an error in their API's shape when it ran out).",
	}, []string{"outcome"})
}
