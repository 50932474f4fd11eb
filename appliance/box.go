package appliance

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"gpuhost/api"
	"gpuhost/config"
	"gpuhost/nvml"
	"gpuhost/units"
)

// Box is the daemon's core: one switch engine (a Supervisor) per lane —
// a GPU set and the profiles placed on it (config.Lanes) — and the
// coordination between them. Lanes on disjoint GPUs switch and serve at
// once; a switch on a lane first claims the lane's GPUs (claim), so that
// switches on lanes sharing a GPU run one after the other, and stops the
// backends of every other lane on those GPUs (vacate). A box with one lane
// is that lane's Supervisor and nothing more: it behaves as the
// single-GPU appliance did.
type Box struct {
	cfg   *config.Config
	lanes []*Supervisor
	specs []config.Lane
	bus   *eventBus
	log   *slog.Logger

	// locks holds one token per GPU of any lane; a claim takes its lane's
	// in index order, so two claims never wait on each other in a cycle.
	locks map[int]chan struct{}

	mu sync.Mutex
	// owner is the lane that claimed each GPU last: the one that keeps it
	// when another lane's backend is found holding memory there.
	owner map[int]*Supervisor
	excl  boxExclusion

	ready chan struct{}
}

// boxExclusion counts the box's own exclusion checks (checkExclusion):
// samples taken and instants with two backends above their residual on one
// GPU.
type boxExclusion struct {
	samples    uint64
	violations uint64
	last       time.Time
	lastMsg    string
}

// NewBox wires one Supervisor per lane of cfg; nothing runs until Run.
func NewBox(cfg *config.Config, gpu GPU, u Units, journal JournalFunc, log *slog.Logger) *Box {
	if log == nil {
		log = slog.Default()
	}
	b := &Box{cfg: cfg, specs: cfg.Lanes(), log: log, locks: map[int]chan struct{}{}, owner: map[int]*Supervisor{}, ready: make(chan struct{})}
	for i, l := range b.specs {
		llog := log
		if len(b.specs) > 1 {
			llog = log.With("lane", l.Name())
		}
		s := NewSupervisor(cfg.LaneConfig(l), gpu, u, journal, llog)
		if i == 0 {
			b.bus = s.bus
		} else {
			s.bus = b.bus // one event stream, one sequence, for the whole box
		}
		if len(b.specs) > 1 {
			s.box = b
		}
		b.lanes = append(b.lanes, s)
		for _, g := range l.GPUs {
			if b.locks[g] == nil {
				b.locks[g] = make(chan struct{}, 1)
			}
		}
	}
	return b
}

// Lanes returns the switch engines, GPU 0's first.
func (b *Box) Lanes() []*Supervisor { return b.lanes }

// Lane returns the engine of the lane with slot (config.Lane.Slot), GPU
// 0's for an unknown slot.
func (b *Box) Lane(slot string) *Supervisor {
	for i, l := range b.specs {
		if l.Slot == slot {
			return b.lanes[i]
		}
	}
	return b.lanes[0]
}

// laneOf returns the engine a profile's lane runs; nil for an unknown
// profile.
func (b *Box) laneOf(profile string) *Supervisor {
	for _, s := range b.lanes {
		if _, ok := s.cfg.Profiles[profile]; ok {
			return s
		}
	}
	return nil
}

// LaneOf returns the engine of profile's lane, GPU 0's for a profile that
// is not configured (its switch then fails with the unknown profile).
func (b *Box) LaneOf(profile string) *Supervisor {
	if s := b.laneOf(profile); s != nil {
		return s
	}
	return b.lanes[0]
}

// specOf is the lane s runs.
func (b *Box) specOf(s *Supervisor) config.Lane {
	for i, l := range b.lanes {
		if l == s {
			return b.specs[i]
		}
	}
	return config.Lane{}
}

// claim takes the GPUs of s's lane for the switch r, waiting while a
// switch on a lane sharing one of them runs, and stops the backends of
// every other lane on those GPUs. The returned func gives the GPUs back.
// A Supervisor without a box (a box of one lane) claims nothing.
func (b *Box) claim(ctx context.Context, s *Supervisor, r *switchRun) func() {
	if b == nil {
		return func() {}
	}
	spec := b.specOf(s)
	gpus := slices.Sorted(slices.Values(spec.GPUs))
	var held []int
	release := func() {
		for _, g := range held {
			<-b.locks[g]
		}
	}
	for _, g := range gpus {
		select {
		case b.locks[g] <- struct{}{}:
		default:
			r.event(api.Event{Kind: api.EventSwitch, Status: api.StatusInfo,
				Message: fmt.Sprintf("waiting for GPU %d: a switch on a lane sharing it runs", g), Detail: map[string]any{api.DetailGPU: g}})
			select {
			case b.locks[g] <- struct{}{}:
			case <-ctx.Done():
				release()
				return func() {}
			}
		}
		held = append(held, g)
	}
	b.mu.Lock()
	for _, g := range gpus {
		b.owner[g] = s
	}
	b.mu.Unlock()
	for i, o := range b.lanes {
		if o != s && b.specs[i].Shares(spec) {
			if msg := o.vacate(ctx, fmt.Sprintf("%s takes %s for %s", spec.Name(), sharedGPUs(spec, b.specs[i]), r.target.Name)); msg != "" {
				r.event(api.Event{Kind: api.EventSwitch, Status: api.StatusInfo, Message: msg})
			}
		}
	}
	return release
}

// sharedGPUs names the GPUs two lanes have in common: "GPU 0", "GPU 0, 1".
func sharedGPUs(a, o config.Lane) string {
	var words []string
	for _, g := range a.GPUs {
		if slices.Contains(o.GPUs, g) {
			words = append(words, fmt.Sprint(g))
		}
	}
	return "GPU " + strings.Join(words, ", ")
}

// vacate stops every backend of s's lane, in standby or not, because
// another lane takes a GPU it shares. Nothing of the lane is wanted after
// it (its last wanted profile is cleared), so neither the heal nor a
// restart of the daemon brings it back over the other lane. A switch of
// this lane that waits for its own claim keeps its state: it runs once the
// claiming switch has ended. It returns what it did ("" when nothing ran
// and nothing was wanted).
func (s *Supervisor) vacate(ctx context.Context, why string) string {
	bs, err := s.backends(ctx)
	if err != nil {
		s.log.Error("vacate lane: read its units", "err", err)
		return ""
	}
	var running []backendState
	for _, b := range bs {
		if b.status.Active() || b.status.ActiveState == "activating" {
			running = append(running, b)
		}
	}
	s.mu.Lock()
	waiting := s.current != nil
	wanted := s.state.LastWanted
	if !waiting {
		s.heal.resetHealLocked()
		s.gen++
		s.vacating = true
		s.state = api.State{Phase: api.PhaseIdle, Since: time.Now(), LastError: s.state.LastError}
	}
	s.mu.Unlock()
	if !waiting && wanted != "" {
		if err := s.writeLastWanted(""); err != nil {
			s.log.Error("persist last wanted profile", "err", err)
		}
	}
	var stopped []string
	for _, b := range running {
		cctx, cancel := context.WithTimeout(ctx, s.cfg.Switch.StopTimeout.D())
		err := s.units.Stop(cctx, b.unit)
		cancel()
		if err != nil {
			s.log.Error("vacate lane: stop", "unit", b.unit, "err", err)
			continue
		}
		s.standby.clear(b.unit)
		stopped = append(stopped, b.unit)
	}
	s.mu.Lock()
	s.vacating = false
	s.state.Standby = s.standby.infos()
	s.mu.Unlock()
	msg := ""
	if len(stopped) > 0 || (!waiting && wanted != "") {
		msg = why + ": stopped " + orDash(strings.Join(stopped, ", "))
		if wanted != "" && !waiting {
			msg += "; " + wanted + " is no longer wanted"
		}
		s.bus.publish(api.Event{Kind: api.EventState, Profile: wanted, Message: msg, Detail: map[string]any{"phase": api.PhaseIdle}})
	}
	if !waiting {
		s.Reconcile(ctx)
	}
	return msg
}

// Config returns the whole box's configuration.
func (b *Box) Config() *config.Config { return b.cfg }

// Run runs every lane's engine, and with several lanes the box's own
// exclusion check, until ctx ends.
func (b *Box) Run(ctx context.Context) error {
	if len(b.lanes) == 1 {
		go func() {
			<-b.lanes[0].Ready()
			close(b.ready)
		}()
		return b.lanes[0].Run(ctx)
	}
	errs := make(chan error, len(b.lanes))
	for _, s := range b.lanes {
		go func() { errs <- s.Run(ctx) }()
	}
	go func() {
		for _, s := range b.lanes {
			select {
			case <-s.Ready():
			case <-ctx.Done():
				return
			}
		}
		close(b.ready)
	}()
	go b.watchExclusion(ctx)
	var first error
	for range b.lanes {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Ready closes once every lane has reconciled and started its restore.
func (b *Box) Ready() <-chan struct{} { return b.ready }

// Close ends every lane's switches.
func (b *Box) Close() {
	for _, s := range b.lanes {
		s.Close()
	}
}

// State is GPU 0's lane's state; with several lanes, Lanes carries every
// lane's own (GPU 0's included), each with its GPUs.
func (b *Box) State() api.State {
	st := b.lanes[0].State()
	if len(b.lanes) == 1 {
		return st
	}
	st.Lane, st.GPUs = b.specs[0].Name(), b.specs[0].GPUs
	st.Lanes = make([]api.State, len(b.lanes))
	for i, s := range b.lanes {
		ls := st
		if i > 0 {
			ls = s.State()
		}
		ls.Lanes = nil
		ls.Lane, ls.GPUs = b.specs[i].Name(), b.specs[i].GPUs
		st.Lanes[i] = ls
	}
	return st
}

// Switch starts a switch on the lane of profile.
func (b *Box) Switch(ctx context.Context, profile string, opts api.SwitchOptions) (string, <-chan error, error) {
	return b.LaneOf(profile).Switch(ctx, profile, opts)
}

// AwaitActive is GPU 0's lane's: the profile a request naming no model
// goes to.
func (b *Box) AwaitActive(ctx context.Context) (*units.Profile, error) {
	return b.lanes[0].AwaitActive(ctx)
}

// AwaitFirstActive waits for GPU 0's lane's first active backend.
func (b *Box) AwaitFirstActive(ctx context.Context) error { return b.lanes[0].AwaitFirstActive(ctx) }

// Subscribe streams the box's events (every lane's).
func (b *Box) Subscribe(since uint64) (<-chan api.Event, []api.Event, func()) {
	return b.bus.subscribe(since)
}

// Publish adds an event to the box's stream.
func (b *Box) Publish(e api.Event) { b.bus.publish(e) }

// LastSeq is the sequence number of the newest event.
func (b *Box) LastSeq() uint64 { return b.bus.lastSeq() }

// Snapshot reads the GPUs.
func (b *Box) Snapshot(ctx context.Context) (nvml.Snapshot, error) { return b.lanes[0].Snapshot(ctx) }

// Reconcile derives every lane's state from systemd.
func (b *Box) Reconcile(ctx context.Context) api.State {
	for _, s := range b.lanes {
		s.Reconcile(ctx)
	}
	return b.State()
}

// LastSwitch is the most recently started of the lanes' last switches.
func (b *Box) LastSwitch() *api.SwitchSummary {
	var last *api.SwitchSummary
	for _, s := range b.lanes {
		if ls := s.LastSwitch(); ls != nil && (last == nil || ls.StartedAt.After(last.StartedAt)) {
			last = ls
		}
	}
	return last
}

// Profiles lists every lane's profiles, by name.
func (b *Box) Profiles() []api.ProfileInfo {
	if len(b.lanes) == 1 {
		return b.lanes[0].Profiles()
	}
	var out []api.ProfileInfo
	for _, s := range b.lanes {
		out = append(out, s.Profiles()...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Status is the box's status: every lane's state, profiles and units,
// and every GPU with who holds memory on it.
func (b *Box) Status(ctx context.Context) api.Status {
	if len(b.lanes) == 1 {
		return b.lanes[0].Status(ctx)
	}
	out := api.Status{State: b.State(), Profiles: b.Profiles(), Units: []api.UnitStatus{}, LastSwitch: b.LastSwitch(), Telegram: b.TelegramStatus()}
	snap, err := b.Snapshot(ctx)
	if err != nil {
		out.GPUError = err.Error()
	} else {
		out.GPU = &snap
	}
	var all []backendState
	for _, s := range b.lanes {
		if bs, err := s.backends(ctx); err == nil {
			all = append(all, bs...)
		}
	}
	for _, bs := range all {
		out.Units = append(out.Units, bs.status)
	}
	if out.GPU != nil {
		out.GPUs = gpuStatuses(*out.GPU, all, b.cfg)
	}
	return out
}

// Heal heals the first lane with something to heal, GPU 0's first.
func (b *Box) Heal(ctx context.Context) (string, string, <-chan error, error) {
	for _, s := range b.lanes[1:] {
		if st := s.State(); NotServing(st) != "" && HealTarget(st) != "" {
			return s.Heal(ctx)
		}
	}
	return b.lanes[0].Heal(ctx)
}

// LeaseProbe leases a probe of profile from its lane.
func (b *Box) LeaseProbe(ctx context.Context, profile string) (context.Context, func(), error) {
	return b.LaneOf(profile).LeaseProbe(ctx, profile)
}

// SetTelegramStatus gives every lane the bot's status.
func (b *Box) SetTelegramStatus(fn api.TelegramStatusFunc) {
	for _, s := range b.lanes {
		s.SetTelegramStatus(fn)
	}
}

// TelegramStatus is the bot's status.
func (b *Box) TelegramStatus() *api.TelegramStatus { return b.lanes[0].TelegramStatus() }

// SetDrainer gives every lane the drain step's Drainer.
func (b *Box) SetDrainer(d Drainer) {
	for _, s := range b.lanes {
		s.SetDrainer(d)
	}
}

// Exclusion sums the lanes' standby exclusion violations and the box's
// per-GPU ones.
func (b *Box) Exclusion() (violations uint64, last time.Time, lastMsg string) {
	for _, s := range b.lanes {
		v, l, m := s.Exclusion()
		violations += v
		if l.After(last) {
			last, lastMsg = l, m
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	violations += b.excl.violations
	if b.excl.last.After(last) {
		last, lastMsg = b.excl.last, b.excl.lastMsg
	}
	return violations, last, lastMsg
}

// ExclusionSamples says how often the box checked every GPU for two
// backends above their residual, and how often it found that.
func (b *Box) ExclusionSamples() (samples, violations uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.excl.samples, b.excl.violations
}

// Drift merges the lanes' drift findings.
func (b *Box) Drift() (byKind map[string]uint64, last time.Time, lastMsg, unresolved string) {
	byKind = map[string]uint64{}
	for _, s := range b.lanes {
		k, l, m, u := s.Drift()
		for kind, n := range k {
			byKind[kind] += n
		}
		if l.After(last) {
			last, lastMsg = l, m
		}
		if unresolved == "" {
			unresolved = u
		}
	}
	return byKind, last, lastMsg, unresolved
}

// WakeFailures merges the lanes' failed verified wakes.
func (b *Box) WakeFailures() (byReason map[string]uint64, last time.Time, lastMsg string) {
	byReason = map[string]uint64{}
	for _, s := range b.lanes {
		r, l, m := s.WakeFailures()
		for k, n := range r {
			byReason[k] += n
		}
		if l.After(last) {
			last, lastMsg = l, m
		}
	}
	return byReason, last, lastMsg
}
