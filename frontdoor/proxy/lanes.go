package proxy

import (
	"sync"

	"gpuhost/api"
)

// LaneFunc returns the switch engine of a profile's lane (its GPU set) on
// a box whose profiles run on several GPU sets; "" is GPU 0's lane. Each
// lane serves, switches and is held on its own: a request for a model on
// GPU 1 never waits for a switch on GPU 0.
type LaneFunc func(profile string) Backend

// lanes is the proxy's view of the lanes: the engines by profile, and one
// anti-thrash policy per engine (auto_switch), so that a model resident on
// one GPU set never holds requests for another.
type lanes struct {
	of   LaneFunc
	mu   sync.Mutex
	pols map[Backend]*policy
}

// SetLanes routes each request to its model's lane. Without it every
// request goes to the Backend given to New.
func (p *Proxy) SetLanes(of LaneFunc) {
	p.lanes = &lanes{of: of, pols: map[Backend]*policy{}}
}

// laneFor picks the lane of a request for requested ("" = no model named):
// the lane where one of the model's profiles serves or is being switched
// to, else the lane of its first profile.
func (p *Proxy) laneFor(requested string) (Backend, *policy) {
	if p.lanes == nil {
		return p.sup, p.pol
	}
	name := ""
	if requested != "" {
		cands := candidates(p.profiles(), requested)
		if len(cands) > 0 {
			name = cands[0].Name
		}
		for _, c := range cands {
			st := p.lanes.of(c.Name).State()
			if (st.Phase == api.PhaseActive && st.Profile == c.Name) || (st.Phase == api.PhaseSwitching && st.Target == c.Name) {
				name = c.Name
				break
			}
		}
	}
	b := p.lanes.of(name)
	return b, p.lanes.policyOf(b, p)
}

// policyOf is b's anti-thrash policy, made on first use (nil without
// auto_switch).
func (l *lanes) policyOf(b Backend, p *Proxy) *policy {
	if p.pol == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	pl := l.pols[b]
	if pl == nil {
		pl = newPolicy(p.pol.minResidency, p.pol.drainTimeout, p.deferred, p.drainTimeouts)
		l.pols[b] = pl
	}
	return pl
}
