package appliance

// The box's exclusion check: on each GPU at most one backend holds memory
// above its residual. Within a lane its Supervisor keeps that rule
// (standby.go, watch.go); across lanes only the box sees both sides.

import (
	"context"
	"fmt"
	"strings"
	"time"

	"gpuhost/api"
	"gpuhost/nvml"
)

// driftWrongGPU is a lane's backend found running on a GPU that another
// lane holds (started by hand, or left from before a restart); driftGPUShared
// is a sample with two backends above their residual on one GPU.
const (
	driftWrongGPU  = "wrong_gpu"
	driftGPUShared = "gpu_shared"
)

// watchExclusion checks every GPU on each watch tick and after each unit
// event, until ctx ends.
func (b *Box) watchExclusion(ctx context.Context) {
	tick := time.NewTicker(b.cfg.GPU.StandbyWatchInterval.D())
	defer tick.Stop()
	evs, _, cancel := b.bus.subscribe(b.bus.lastSeq())
	defer func() { cancel() }()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case e, ok := <-evs:
			if !ok { // fell behind: follow again from now
				cancel()
				evs, _, cancel = b.bus.subscribe(b.bus.lastSeq())
				continue
			}
			if e.Kind != api.EventUnit && e.Kind != api.EventState {
				continue
			}
		}
		b.CheckExclusion(ctx)
	}
}

// laneUnit is one running backend unit of a lane.
type laneUnit struct {
	lane int
	b    backendState
}

// CheckExclusion takes one sample: every GPU's holders above their
// residual, and every pair of lanes sharing a GPU that both serve. A GPU
// with two is a violation (counted, and an exclusion event); the lane that
// did not claim the GPU last is stopped (vacate). It returns the
// violations this sample found.
func (b *Box) CheckExclusion(ctx context.Context) int {
	snap, err := b.Snapshot(ctx)
	if err != nil {
		return 0
	}
	var running []laneUnit
	for i, s := range b.lanes {
		if s.isSwitching() {
			continue // its switch proves the release itself
		}
		bs, err := s.backends(ctx)
		if err != nil {
			continue
		}
		for _, bk := range bs {
			if bk.status.Active() {
				running = append(running, laneUnit{lane: i, b: bk})
			}
		}
	}
	found := 0
	for _, d := range snap.Devices {
		above := b.aboveResidual(d, running)
		b.mu.Lock()
		b.excl.samples++
		owner := b.owner[d.Index]
		b.mu.Unlock()
		if len(above) < 2 {
			continue
		}
		found++
		b.violation(ctx, d, above, owner)
	}
	found += b.servingTwice(ctx)
	return found
}

// aboveResidual lists the units holding memory on d above their residual
// (a unit in standby may hold its measured residual; any other holds
// nothing beyond the tolerance).
func (b *Box) aboveResidual(d nvml.Device, running []laneUnit) []laneUnit {
	var out []laneUnit
	for _, r := range running {
		used := unitUsedMiB(d, r.b.status)
		if used == 0 {
			continue
		}
		s := b.lanes[r.lane]
		limit := uint64(residualToleranceMiB)
		if e, asleep := s.standby.of(r.b.unit); asleep {
			res, _ := s.standby.residualOf(e.Profile)
			limit += res
		}
		if used > limit {
			out = append(out, r)
		}
	}
	return out
}

// violation records two holders above their residual on d and stops the
// ones whose lane did not claim d.
func (b *Box) violation(ctx context.Context, d nvml.Device, above []laneUnit, owner *Supervisor) {
	var who []string
	for _, a := range above {
		who = append(who, fmt.Sprintf("%s (%s) %d MiB", a.b.unit, orDash(a.b.profile), unitUsedMiB(d, a.b.status)))
	}
	msg := fmt.Sprintf("GPU %d: %d backends above their residual at once: %s", d.Index, len(above), strings.Join(who, ", "))
	b.mu.Lock()
	b.excl.violations++
	b.excl.last, b.excl.lastMsg = time.Now(), msg
	b.mu.Unlock()
	b.bus.publish(api.Event{Kind: api.EventExclusion, Status: api.StatusFailed, Message: msg, Detail: map[string]any{api.DetailGPU: d.Index, api.DetailDrift: driftGPUShared}})
	if owner == nil {
		return // nobody claimed it: the lanes' own watchers decide
	}
	for _, a := range above {
		if s := b.lanes[a.lane]; s != owner {
			b.evict(ctx, s, fmt.Sprintf("%s (%s) holds %d MiB on GPU %d, which %s claimed", a.b.unit, orDash(a.b.profile), unitUsedMiB(d, a.b.status), d.Index, b.specOf(owner).Name()))
		}
	}
}

// servingTwice finds two lanes sharing a GPU that both serve (one
// started by hand: it may hold nothing yet, but the next request would
// load a model beside the other) and stops the one that did not claim the
// GPU last. It returns how many it found.
func (b *Box) servingTwice(ctx context.Context) int {
	found := 0
	for i, s := range b.lanes {
		for j := i + 1; j < len(b.lanes); j++ {
			o := b.lanes[j]
			if !b.specs[i].Shares(b.specs[j]) || !serving(s.State()) || !serving(o.State()) {
				continue
			}
			b.mu.Lock()
			var owner *Supervisor
			for _, g := range b.specs[i].GPUs {
				if w := b.owner[g]; w == s || w == o {
					owner = w
				}
			}
			b.mu.Unlock()
			if owner == nil {
				continue
			}
			loser := o
			if owner == o {
				loser = s
			}
			found++
			st := loser.State()
			b.evict(ctx, loser, fmt.Sprintf("%s (%s) serves on %s, which %s claimed for %s", st.Unit, st.Profile, sharedGPUs(b.specOf(loser), b.specOf(owner)), b.specOf(owner).Name(), owner.State().Profile))
		}
	}
	return found
}

// serving: active, settled, not switching.
func serving(st api.State) bool { return st.Phase == api.PhaseActive && st.Step == "" }

// evict stops a lane found on another lane's GPU, as a drift of that lane.
func (b *Box) evict(ctx context.Context, s *Supervisor, why string) {
	if !s.switchMu.TryLock() {
		return // its switch claims the GPUs itself
	}
	defer s.switchMu.Unlock()
	st := s.State()
	_ = s.vacate(ctx, why)
	s.noteDrift(driftWrongGPU, api.EventExclusion, st.Profile, why+": stopped", true, map[string]any{api.DetailUnit: st.Unit})
}
