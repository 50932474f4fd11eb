package proxy

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"gpuhost/api"
	"gpuhost/units"
)

// policy is auto_switch's anti-thrash rule (the package doc states it):
// minimum residency, drain, and one departure at a time that every held
// request joins. Its state is one epoch: the profile the Supervisor shows
// active and since when. Everything here runs under mu, which is held for
// a few assignments and never while waiting.
type policy struct {
	minResidency time.Duration
	drainTimeout time.Duration

	deferred      *prometheus.CounterVec
	drainTimeouts prometheus.Counter

	mu       sync.Mutex
	epoch    uint64
	cur      string    // the active profile
	since    time.Time // the state's Since: when cur became active
	lastUse  time.Time // arrival of cur's latest request admitted while no request for another profile waited
	inflight int       // requests of this epoch being forwarded to cur
	// pending counts, by profile, the requests waiting for a running
	// switch to it: the batch its activation releases. A departure from
	// a profile drains them too (they are admitted during the drain), so
	// a switch never leaves a profile before the requests it was made
	// for reached it.
	pending map[string]int
	waiters int // requests for another profile held by the residency
	next    *nextTarget
	leaving *departure    // the drain and switch start away from cur, while one runs
	wake    chan struct{} // closed (and replaced) when waiters should look again
}

// nextTarget is the profile the residency will give way to: the target of
// the earliest request still waiting (so targets are served in the order
// they were first asked for). Only its waiters may lead the departure.
type nextTarget struct {
	name    string // the first candidate of the target model
	waiters int
}

// departure is one switch away from the current profile: its drain, then
// the switch the leading request starts. Every request that meets it waits
// for done and then routes again (which finds the switch running).
type departure struct {
	epoch   uint64
	from    string
	to      string        // first candidate of the target model
	drained chan struct{} // closed when no request of the epoch is in flight or pending
	isDrain bool          // drained is closed
	done    chan struct{} // closed when the leader has started the switch (or given up)
	err     *apiErr       // why the switch could not start (given to requests for the same target)
}

// ticket is a forwarded request's place in the in-flight count.
type ticket struct {
	epoch uint64
	ok    bool
}

func newPolicy(minResidency, drainTimeout time.Duration, deferred *prometheus.CounterVec, drainTimeouts prometheus.Counter) *policy {
	return &policy{minResidency: minResidency, drainTimeout: drainTimeout,
		deferred: deferred, drainTimeouts: drainTimeouts, wake: make(chan struct{}), pending: map[string]int{}}
}

// newPolicyCounters are the policy's series; they exist (at 0) with
// auto_switch off too, so dashboards see the same names on every box.
func newPolicyCounters() (*prometheus.CounterVec, prometheus.Counter) {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuhost_proxy_auto_switch_deferred_total",
			Help: "Requests on /v1 that auto_switch held back instead of switching at once, by reason (residency: the current model was within proxy.min_residency; drain: a switch waited for the current model's requests to finish). Each of them that did not start a switch itself rode on another's.",
		}, []string{"reason"}),
		prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpuhost_proxy_drain_timeouts_total",
			Help: "Switches away from a model that went ahead after proxy.drain_timeout with requests still running on it (they were cut).",
		})
}

// syncLocked moves to a new epoch when st shows another active backend
// (a newer Since): the counts of the old one no longer matter.
func (pl *policy) syncLocked(st api.State) {
	if st.Phase != api.PhaseActive || st.Step != "" {
		return
	}
	if st.Profile == pl.cur && st.Since.Equal(pl.since) || st.Since.Before(pl.since) {
		return // the same epoch, or a state read before the one already seen
	}
	pl.epoch++
	pl.cur, pl.since = st.Profile, st.Since
	pl.lastUse, pl.inflight = time.Time{}, 0
	if d := pl.leaving; d != nil {
		d.closeDrained() // what it drained is gone
	}
	pl.broadcastLocked()
}

func (pl *policy) broadcastLocked() {
	close(pl.wake)
	pl.wake = make(chan struct{})
}

func (d *departure) closeDrained() {
	if !d.isDrain {
		d.isDrain = true
		close(d.drained)
	}
}

// residencyEndLocked is when cur may be left: min_residency after it became
// active and after its latest request that arrived before anyone waited.
func (pl *policy) residencyEndLocked() time.Time {
	t := pl.since
	if pl.lastUse.After(t) {
		t = pl.lastUse
	}
	return t.Add(pl.minResidency)
}

// idleLocked reports that nothing of cur is in flight or pending.
func (pl *policy) idleLocked() bool { return pl.inflight == 0 && pl.pending[pl.cur] == 0 }

// checkDrainedLocked ends the drain under way once cur is idle.
func (pl *policy) checkDrainedLocked() {
	if d := pl.leaving; d != nil && d.epoch == pl.epoch && pl.idleLocked() {
		d.closeDrained()
	}
}

// setPendingLocked moves rec's pending mark to profile ("" = none).
func (pl *policy) setPendingLocked(rec *record, profile string) {
	if rec.pending == profile {
		return
	}
	if old := rec.pending; old != "" {
		if pl.pending[old]--; pl.pending[old] <= 0 {
			delete(pl.pending, old)
		}
	}
	rec.pending = profile
	if profile != "" {
		pl.pending[profile]++
	}
	pl.checkDrainedLocked()
}

// await marks rec as waiting for the running switch to profile, if the
// state (read under mu) still shows one; admit or release clears it.
func (pl *policy) await(sup Backend, profile string, rec *record) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if st := sup.State(); st.Phase == api.PhaseSwitching && st.Target == profile {
		pl.setPendingLocked(rec, profile)
	}
}

// admit counts rec, about to be forwarded to prof, as in flight (its
// ticket). It reads the state under mu, so a request never slips in after
// a departure from prof has finished: the state then already shows the
// switch. It returns the departure to wait for when prof is being drained
// (unless rec is pending on prof: the drain waits for it), and ok false
// when the state no longer shows prof active (route again). It clears
// rec's pending mark.
func (pl *policy) admit(sup Backend, prof string, rec *record) (d *departure, ok bool) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	// The pending mark goes last: a drain waiting for it must not end
	// before the request counts as in flight.
	defer pl.setPendingLocked(rec, "")
	st := sup.State()
	pl.syncLocked(st)
	if st.Phase != api.PhaseActive || st.Step != "" || st.Profile != prof {
		return nil, false
	}
	if d := pl.leaving; d != nil && d.epoch == pl.epoch && rec.pending != prof {
		return d, true
	}
	pl.inflight++
	rec.ticket = ticket{epoch: pl.epoch, ok: true}
	if pl.waiters == 0 && rec.start.After(pl.lastUse) {
		pl.lastUse = rec.start
	}
	return nil, true
}

// release ends rec's place in the in-flight count and its pending mark.
func (pl *policy) release(rec *record) {
	if !rec.ticket.ok && rec.pending == "" {
		return
	}
	pl.mu.Lock()
	if t := rec.ticket; t.ok && t.epoch == pl.epoch {
		pl.inflight--
	}
	rec.ticket.ok = false
	pl.setPendingLocked(rec, "")
	pl.checkDrainedLocked()
	pl.mu.Unlock()
}

// gate holds a request for cands (a model cur does not serve, st showing
// cur active) while cur is resident. It returns the departure when this
// request is to start the switch (the drain is over or ran out of
// drain_timeout), or nil when the request is to route again: another
// request's departure ended, or the state moved on. The time spent here is
// the policy's, bounded by min_residency and drain_timeout: it is added to
// rec.held and to the hold budget, so that it never uses up hold_timeout.
func (p *Proxy) gate(reqCtx context.Context, h *hold, rec *record, st api.State, cands []*units.Profile) (*departure, *apiErr) {
	pl := rec.pol
	target := cands[0].Name
	t0 := time.Now()
	defer func() {
		if w := time.Since(t0); w > 0 {
			rec.held += w
			h.extend(w)
		}
	}()
	g := gateWait{pl: pl, target: target}
	defer g.unregister()
	for first := true; ; first = false {
		if !first {
			st = rec.sup.State()
		}
		pl.mu.Lock()
		pl.syncLocked(st)
		if st.Phase != api.PhaseActive || st.Step != "" || st.Profile != pl.cur || containsProfile(cands, st.Profile) {
			pl.mu.Unlock()
			return nil, nil // moved on: route again
		}
		if d := pl.leaving; d != nil {
			pl.mu.Unlock()
			return nil, g.awaitLeaving(reqCtx, d)
		}
		g.queueLocked()
		now := time.Now()
		end := pl.residencyEndLocked()
		if g.mine != nil && pl.next == g.mine && !now.Before(end) {
			d := &departure{epoch: pl.epoch, from: pl.cur, to: target, drained: make(chan struct{}), done: make(chan struct{})}
			if pl.idleLocked() {
				d.closeDrained()
			}
			pl.leaving, pl.next = d, nil
			inflight := pl.inflight + pl.pending[pl.cur]
			pl.broadcastLocked()
			pl.mu.Unlock()
			g.unregister()
			return p.drain(pl, reqCtx, d, inflight)
		}
		wake := pl.wake
		pl.mu.Unlock()
		if aerr := g.sleep(reqCtx, wake, end.Sub(now)); aerr != nil {
			return nil, aerr
		}
	}
}

// gateWait is a request's standing while gate holds it for target: its
// place among the policy's waiters, and the deferred counts it is in.
type gateWait struct {
	pl               *policy
	target           string
	mine             *nextTarget // non-nil once registered as a waiter
	registered       bool
	countedResidency bool
	countedDrain     bool
}

// unregister takes the request off the waiters, if it is on them.
func (g *gateWait) unregister() {
	if !g.registered {
		return
	}
	g.registered = false
	g.pl.mu.Lock()
	g.pl.waiters--
	if g.mine != nil {
		g.mine.waiters--
		if g.mine.waiters == 0 && g.pl.next == g.mine {
			g.pl.next = nil
			g.pl.broadcastLocked() // another target's waiters may lead now
		}
	}
	g.pl.mu.Unlock()
}

// awaitLeaving waits for the departure d under way (another request leads
// it) to start its switch; the request then routes again. It returns why
// the switch could not start when d was for the same target.
func (g *gateWait) awaitLeaving(reqCtx context.Context, d *departure) *apiErr {
	g.unregister()
	if !g.countedDrain {
		g.countedDrain = true
		g.pl.deferred.WithLabelValues("drain").Inc()
	}
	select {
	case <-d.done:
	case <-reqCtx.Done():
		return clientGoneWhileHeld()
	}
	if d.to == g.target && d.err != nil {
		return d.err
	}
	return nil
}

// queueLocked registers the request as a waiter and queues its target as
// the next one, unless another target is queued first.
func (g *gateWait) queueLocked() {
	pl := g.pl
	if !g.registered {
		g.registered = true
		pl.waiters++
	}
	if g.mine != nil && pl.next != g.mine {
		g.mine = nil // our target's turn passed without us (its departure was given up): queue again
	}
	if pl.next == nil {
		pl.next = &nextTarget{name: g.target}
	}
	if g.mine == nil && pl.next.name == g.target {
		g.mine = pl.next
		g.mine.waiters++
	}
}

// sleep holds the request for wait (until the residency ends), until the
// waiters are woken (wake closed), or until the client leaves.
func (g *gateWait) sleep(reqCtx context.Context, wake <-chan struct{}, wait time.Duration) *apiErr {
	if !g.countedResidency {
		g.countedResidency = true
		g.pl.deferred.WithLabelValues("residency").Inc()
	}
	if wait <= 0 {
		wait = time.Second // another target leads; belt and braces against a missed wake
	}
	timer := time.NewTimer(wait)
	select {
	case <-timer.C:
	case <-wake:
	case <-reqCtx.Done():
		timer.Stop()
		return clientGoneWhileHeld()
	}
	timer.Stop()
	return nil
}

// drain waits, as the leader of d, for the requests in flight on d.from to
// finish, at most drain_timeout. It returns d for the caller to start the
// switch and then call finish; nil when the request is to route again.
func (p *Proxy) drain(pl *policy, reqCtx context.Context, d *departure, inflight int) (*departure, *apiErr) {
	if inflight > 0 && pl.drainTimeout > 0 {
		pl.deferred.WithLabelValues("drain").Inc()
		timer := time.NewTimer(pl.drainTimeout)
		select {
		case <-d.drained:
		case <-timer.C:
			pl.mu.Lock()
			left := 0
			if pl.epoch == d.epoch {
				left = pl.inflight + pl.pending[d.from]
			}
			pl.mu.Unlock()
			if left > 0 {
				pl.drainTimeouts.Inc()
				p.log.Warn("auto_switch: proxy.drain_timeout ran out; switching with requests still running", "from", d.from, "to", d.to, "in_flight", left, "drain_timeout", pl.drainTimeout)
			}
		case <-reqCtx.Done():
			timer.Stop()
			p.finish(pl, d, nil, "", nil)
			return nil, clientGoneWhileHeld()
		}
		timer.Stop()
	}
	pl.mu.Lock()
	moved := pl.epoch != d.epoch
	pl.mu.Unlock()
	if moved {
		p.finish(pl, d, nil, "", nil) // something else switched meanwhile
		return nil, nil
	}
	return d, nil
}

// finish ends d once the leader (rec) has tried to start its switch: to
// started, or err saying why it could not. The leader is marked pending on
// the profile it switched to in the same step, so no departure from that
// profile can start before the leader reached it. Everyone waiting for d
// routes again.
func (p *Proxy) finish(pl *policy, d *departure, rec *record, started string, err *apiErr) {
	pl.mu.Lock()
	if started != "" {
		pl.setPendingLocked(rec, started)
	}
	if pl.leaving == d {
		pl.leaving = nil
	}
	d.err = err
	close(d.done)
	pl.broadcastLocked()
	pl.mu.Unlock()
}

func clientGoneWhileHeld() *apiErr {
	return &apiErr{status: statusClientClosed, msg: "the client went away while the request was held"}
}

// hold is a request's hold budget: proxy.hold_timeout for waiting on
// switches, moved back by the time the anti-thrash policy held the request
// (bounded by min_residency and drain_timeout instead), so that the policy
// never uses up the budget the operator set. Its context (with a timer) is
// made on first use: a request that is forwarded at once, as nearly all
// are, never waits and does not pay for one.
type hold struct {
	parent   context.Context
	ctx      context.Context // nil until context is called
	cancel   context.CancelFunc
	deadline time.Time
}

func (h *hold) start(parent context.Context, d time.Duration) {
	h.parent, h.deadline = parent, time.Now().Add(d)
}

// context is the hold's context: done at the deadline or with the request.
func (h *hold) context() context.Context {
	if h.ctx == nil {
		h.ctx, h.cancel = context.WithDeadline(h.parent, h.deadline)
	}
	return h.ctx
}

// extend moves the deadline back by d; a context handed out before is
// cancelled, the next call of context makes one with the new deadline.
func (h *hold) extend(d time.Duration) {
	h.stop()
	h.ctx, h.cancel = nil, nil
	h.deadline = h.deadline.Add(d)
}

func (h *hold) stop() {
	if h.cancel != nil {
		h.cancel()
	}
}
