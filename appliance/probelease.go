package appliance

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"gpuhost/api"
)

// Probes and switches never collide. A probe is a request gpuhost itself
// sends to a backend to check it (the doctor's endpoint.health, tool-call
// and context probes; the same doctor runs for the panel, /gpu doctor in
// Telegram and the MCP tool inference_doctor). A probe sent to a backend in
// standby wakes it (an Ollama chat request loads the model again), and one
// that reaches a backend the switch is putting to sleep undoes the sleep:
// the standby step then waits out its release timeout. So a probe needs a
// lease, and the lease is the switch lock's reader:
//
//   - LeaseProbe grants one only while the profile is active and settled
//     (no switch, no step, not in standby), under s.mu, the lock Switch
//     takes to mark itself running: a probe never starts during a switch.
//   - A switch revokes every lease when it starts (their contexts are
//     cancelled, so a probe's next request is never sent and the one in
//     flight is cut), and before its first step waits until the revoked
//     probes have returned, bounded by probeRevokeWait: what it waits for
//     is the cancellation being seen, never a probe's answer, so a switch
//     never waits on a probe.
//
// Routing probes through the /v1 proxy's hold was the alternative; it
// would make a probe wait out a whole switch (the doctor would report
// seconds late) and still not cut a probe in flight when the switch
// starts, which is the race that reloaded Ollama after its unload.

// probeRevokeWait bounds how long a starting switch waits for revoked
// probes to return: they return as soon as their context's cancellation
// reaches their HTTP client (microseconds); the bound only guards against
// a probe that ignores its context.
const probeRevokeWait = time.Second

// ProbeRefused says why a probe may not run now.
type ProbeRefused struct {
	Profile string
	// Switching is set when a switch runs: Target and Step name it.
	Switching    bool
	Target, Step string
	Reason       string
}

func (e *ProbeRefused) Error() string { return e.Reason }

// probeLeases is the leases out now. Its own lock nests inside the
// Supervisor's s.mu: a lease is granted under s.mu (so the grant and a
// switch marking itself running cannot interleave) and revoked under it.
type probeLeases struct {
	log *slog.Logger

	mu    sync.Mutex
	next  uint64
	out   map[uint64]*probeLease
	waitQ []*probeLease // revoked, not yet returned
}

type probeLease struct {
	cancel   context.CancelFunc
	returned chan struct{}
	once     sync.Once
}

func (l *probeLease) release() { l.once.Do(func() { l.cancel(); close(l.returned) }) }

// grant hands out a lease: a context cancelled on revoke, and the function
// that ends the lease.
func (p *probeLeases) grant(ctx context.Context) (context.Context, func()) {
	pctx, cancel := context.WithCancel(ctx)
	l := &probeLease{cancel: cancel, returned: make(chan struct{})}
	p.mu.Lock()
	if p.out == nil {
		p.out = map[uint64]*probeLease{}
	}
	p.next++
	id := p.next
	p.out[id] = l
	p.mu.Unlock()
	return pctx, func() {
		p.mu.Lock()
		delete(p.out, id)
		p.mu.Unlock()
		l.release()
	}
}

// revoke cancels every lease; a switch calls it as it marks itself
// running, then awaitRevoked before its first step.
func (p *probeLeases) revoke() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, l := range p.out {
		l.cancel()
		p.waitQ = append(p.waitQ, l)
		delete(p.out, id)
	}
}

// awaitRevoked waits until the probes revoked at the switch's start have
// returned, at most probeRevokeWait; it says how many did not.
func (p *probeLeases) awaitRevoked() {
	p.mu.Lock()
	q := p.waitQ
	p.waitQ = nil
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), probeRevokeWait)
	defer cancel()
	late := 0
	for _, l := range q {
		select {
		case <-l.returned:
		case <-ctx.Done():
			late++
		}
	}
	if late > 0 && p.log != nil {
		p.log.Warn("probes still running after their lease was revoked; the switch goes ahead", "late", late, "waited", probeRevokeWait)
	}
}

// LeaseProbe returns a context for probing profile's backend and the
// function that ends the lease (call it when the probe is done). The
// context is cancelled when a switch starts. It refuses (ProbeRefused)
// while a switch runs, while profile is not the active, settled profile,
// and while its unit is in standby.
func (s *Supervisor) LeaseProbe(ctx context.Context, profile string) (context.Context, func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.state
	ref := &ProbeRefused{Profile: profile}
	switch {
	case s.current != nil || st.Phase == api.PhaseSwitching:
		ref.Switching, ref.Target, ref.Step = true, st.Target, st.Step
		ref.Reason = SwitchingMessage(st)
	case st.Phase != api.PhaseActive || st.Profile != profile:
		ref.Reason = fmt.Sprintf("%s is not the active profile (%s)", profile, describeState(st))
	case st.Step != "":
		ref.Reason = fmt.Sprintf("%s is %s, not yet serving", st.Unit, st.Step)
	default:
		if u, e, ok := s.standby.anyOf(profile, st.Unit); ok {
			ref.Reason = fmt.Sprintf("%s (%s) is in standby (%s): a probe would wake it", u, e.Profile, e.Mode)
		}
	}
	if ref.Reason != "" {
		return nil, nil, ref
	}
	pctx, end := s.probes.grant(ctx)
	return pctx, end, nil
}

// SwitchingMessage is what a check says instead of failing while a switch
// runs: "switching to X (step S)".
func SwitchingMessage(st api.State) string {
	step := st.Step
	if step == "" {
		step = "starting"
	}
	return fmt.Sprintf("switching to %s (step %s)", st.Target, step)
}
