package appliance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"gpuhost/api"
	"gpuhost/backend"
	"gpuhost/config"
	"gpuhost/nvml"
	"gpuhost/systemd"
	"gpuhost/units"
)

// GPU is what the Supervisor needs to know about the card: memory and the
// processes holding it. driver.NVML and nvml.Sim satisfy it.
type GPU interface {
	Snapshot(ctx context.Context) (nvml.Snapshot, error)
}

// Units is the unit control the Supervisor drives. systemd.Manager satisfies
// it on a real box; the demo's process runner satisfies it without systemd.
type Units interface {
	Start(ctx context.Context, unit string) error
	Stop(ctx context.Context, unit string) error
	Unit(ctx context.Context, unit string) (api.UnitStatus, error)
	Subscribe(ctx context.Context, units ...string) (<-chan systemd.UnitEvent, error)
}

// JournalFunc returns the last n log lines of a unit, attached to a failed
// start so the operator sees why the backend died without opening a shell.
type JournalFunc func(ctx context.Context, unit string, n int) ([]string, error)

// Supervisor owns the GPU: it is the only writer of backend unit state and
// guarantees that at most one backend runs, with the old one's VRAM released
// before the next starts.
type Supervisor struct {
	cfg     *config.Config
	gpu     GPU
	units   Units
	journal JournalFunc
	client  *http.Client
	engines map[units.Backend]backend.Factory // each engine's protocol; tests substitute
	apis    sync.Map                          // profile name → []string: the APIs its backend served at the last verify
	log     *slog.Logger
	bus     *eventBus

	baseCtx context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	switchMu sync.Mutex // held for the whole duration of a switch

	mu       sync.Mutex
	state    api.State
	baseline uint64
	// baselines is every GPU's idle baseline measured at start, by index
	// (measureBaseline); baseline is GPU 0's.
	baselines map[int]uint64
	current   *switchRun
	// gen counts switch starts and ends; a reconciliation whose reads
	// straddle one is stale and dropped.
	gen        uint64
	lastSwitch *api.SwitchSummary
	switches   uint64
	// standby is who is in standby, the residuals measured and the
	// exclusion violations found (standbybook.go; its own lock).
	standby standbyBook
	wake    *wakeBook // verified wake's references and failures (wakecheck.go)
	// watch is the watcher: every unit's rules beyond the switch, the
	// periodic verify and the drift found (watch.go, verify.go).
	watch *watcher
	heal  *healer // crashes and hand actions of the active backend (heal.go)
	// activePID is the active unit's main process as first seen active
	// after a switch (0 until then): another one without a switch is a
	// restart behind gpuhost's back (heal.go).
	activePID int

	telegram telegramSlot // the bot's status, for Status (SetTelegramStatus)
	drainer  drainSlot    // the drain step's Drainer (SetDrainer; drain.go)
	probes   probeLeases  // the probe leases out now (probelease.go)

	// ready closes once Run has reconciled from systemd and started the
	// restore switch, if any (see Ready).
	ready     chan struct{}
	readyOnce sync.Once
	// live is set while Run runs: only the daemon records what it learns
	// from hand actions (a Supervisor of `gpuhost status` only reads).
	live bool

	// box is the coordinator of a box with several lanes (box.go); nil
	// when the Supervisor is the box's only engine. Every switch of a lane
	// first claims the lane's GPUs from it.
	box *Box
	// vacating is set while the box stops this lane's backends for another
	// lane that takes its GPUs: Reconcile then leaves the state alone.
	vacating bool
}

// LastSwitch returns the most recent finished switch, or nil.
func (s *Supervisor) LastSwitch() *api.SwitchSummary {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lastSwitch == nil {
		return nil
	}
	c := *s.lastSwitch
	return &c
}

// AwaitActive returns the active profile, waiting while a switch runs (the
// /v1 proxy holds requests this way instead of rejecting them). It returns
// ErrNoBackend when idle or failed, and ctx's error when ctx ends first.
func (s *Supervisor) AwaitActive(ctx context.Context) (*units.Profile, error) {
	// Fast path for the proxy's every request: active and settled.
	if st := s.State(); st.Phase == api.PhaseActive && st.Step == "" {
		if p, ok := s.cfg.Profiles[st.Profile]; ok {
			return p, nil
		}
	}
	ch, _, cancel := s.bus.subscribe(s.bus.lastSeq())
	defer cancel()
	for {
		st := s.State()
		switch st.Phase {
		case api.PhaseActive:
			if p, ok := s.cfg.Profiles[st.Profile]; ok && st.Step == "" {
				return p, nil
			}
			if st.Step == "" {
				return nil, fmt.Errorf("%w: the running backend's profile %q is not in the config", api.ErrNoBackend, st.Profile)
			}
		case api.PhaseIdle:
			return nil, api.ErrNoBackend
		case api.PhaseFailed:
			if !s.heal.healRunning() { // a failed restart of a heal is followed by the next
				return nil, fmt.Errorf("%w: %s", api.ErrNoBackend, st.Error)
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-ch:
		case <-time.After(time.Second): // belt and braces: re-read the state
		}
	}
}

// NewSupervisor wires the Supervisor; it does nothing until Run.
func NewSupervisor(cfg *config.Config, gpu GPU, u Units, journal JournalFunc, log *slog.Logger) *Supervisor {
	if log == nil {
		log = slog.Default()
	}
	if journal == nil {
		journal = func(context.Context, string, int) ([]string, error) { return nil, nil }
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Supervisor{
		cfg:     cfg,
		gpu:     gpu,
		units:   u,
		journal: journal,
		client:  backendClient(cfg),
		engines: backend.Engines(),
		log:     log,
		bus:     newEventBus(log),
		baseCtx: ctx,
		cancel:  cancel,
		state:   api.State{Phase: api.PhaseIdle, Since: time.Now()},
		ready:   make(chan struct{}),
	}
	s.baseline = cfg.GPU.IdleBaselineMiB
	s.probes.log = log
	s.wake = newWakeBook(cfg.StateDir, log)
	lw := s.readStateFile()
	s.state.LastWanted, s.state.Paused = lw.Profile, lw.Paused
	s.standby = newStandbyBook(cfg, log)
	s.watch = &watcher{s: s}
	s.heal = &healer{s: s}
	return s
}

// Config returns the configuration the Supervisor runs with.
func (s *Supervisor) Config() *config.Config { return s.cfg }

// State returns a copy of the current state.
func (s *Supervisor) State() api.State {
	s.mu.Lock()
	st := s.state
	s.mu.Unlock()
	st.NotServing = NotServing(st)
	return st
}

// Subscribe streams events after seq since (0: only the buffered ones
// still in memory, then live ones).
func (s *Supervisor) Subscribe(since uint64) (<-chan api.Event, []api.Event, func()) {
	return s.bus.subscribe(since)
}

// Publish puts an event from another component (for example a benchmark's
// progress, Kind "bench") on the bus, so the SSE stream, the panel and the
// log carry it like the Supervisor's own.
func (s *Supervisor) Publish(e api.Event) { s.bus.publish(e) }

// LastSeq is the sequence number of the newest event.
func (s *Supervisor) LastSeq() uint64 { return s.bus.lastSeq() }

// Run reconciles from systemd + NVML, restores the last wanted profile when
// nothing runs, and then follows unit events until ctx ends.
func (s *Supervisor) Run(ctx context.Context) error {
	defer s.cancel()
	// Ready also when Run fails early, so READY=1 is never held back for good.
	defer s.readyOnce.Do(func() { close(s.ready) })
	s.mu.Lock()
	s.live = true
	s.mu.Unlock()
	evs, err := s.units.Subscribe(ctx, s.unitNames()...)
	if err != nil {
		return fmt.Errorf("subscribe to backend unit changes: %w", err)
	}
	s.measureBaseline(ctx)
	s.checkStandbyAtStart(ctx)
	st := s.Reconcile(ctx)
	s.restore(ctx, st)
	s.readyOnce.Do(func() { close(s.ready) })
	watch := time.NewTicker(s.cfg.GPU.StandbyWatchInterval.D())
	defer watch.Stop()
	// After a hand action is found (handActionLocked), the watcher looks
	// every handWatchInterval for handWatchFor: what follows a hand start
	// without a unit event of its own (a model loaded by hand through the
	// socket) is found within that, not the watch interval.
	fast := time.NewTicker(handWatchInterval)
	defer fast.Stop()
	verify, stopVerify := s.watch.verifyTick()
	defer stopVerify()
	for {
		select {
		case <-verify:
			if !s.isSwitching() {
				s.watch.verifyIfDue(ctx)
			}
		case <-watch.C:
			if !s.isSwitching() {
				s.watch.enforceStandby(ctx)
				s.watch.watchBackends(ctx)
			}
		case now := <-fast.C:
			s.mu.Lock()
			watching := now.Before(s.watch.handWatchUntil)
			s.mu.Unlock()
			if watching && !s.isSwitching() {
				s.watch.enforceStandby(ctx)
				s.watch.watchBackends(ctx)
			}
		case <-ctx.Done():
			s.wg.Wait()
			return nil
		case ev, ok := <-evs:
			if !ok {
				if ctx.Err() != nil {
					s.wg.Wait()
					return nil
				}
				return errors.New("unit event subscription ended")
			}
			s.bus.publish(api.Event{Kind: api.EventUnit, Message: fmt.Sprintf("%s is %s (%s)", ev.Unit, ev.ActiveState, ev.SubState),
				Detail: map[string]any{api.DetailUnit: ev.Unit, "active_state": ev.ActiveState, "sub_state": ev.SubState,
					api.DetailLog: logHint(s.cfg, ev.Unit)}})
			if !s.isSwitching() {
				s.Reconcile(ctx)
				s.watch.watchBackends(ctx)
			}
		}
	}
}

// unitNames are the backend units of this Supervisor's lane.
func (s *Supervisor) unitNames() []string {
	var out []string
	for _, b := range []units.Backend{units.VLLM, units.Ollama} {
		if s.cfg.UsesBackend(b) {
			out = append(out, s.cfg.BackendFor(b).Unit)
		}
	}
	return out
}

// handWatchInterval and handWatchFor: how often and how long the watcher
// looks after it found a hand action (see Run).
const (
	handWatchInterval = 100 * time.Millisecond
	handWatchFor      = 30 * time.Second
)

// Close cancels running switches' background context and waits for them.
func (s *Supervisor) Close() {
	s.cancel()
	s.wg.Wait()
}

func (s *Supervisor) isSwitching() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current != nil
}

// measureBaseline sets the idle VRAM baseline when the config leaves it to
// us: used memory minus what GPU processes hold, i.e. what the driver keeps
// for itself, which stays put when backends come and go.
func (s *Supervisor) measureBaseline(ctx context.Context) {
	if s.cfg.GPU.IdleBaselineMiB != 0 {
		return
	}
	snap, err := s.snapshot(ctx)
	if err != nil {
		s.log.Warn("cannot measure idle VRAM baseline", "err", err)
		return
	}
	bases := map[int]uint64{}
	for _, d := range snap.Devices {
		bases[d.Index] = driverHeldMiB(d)
	}
	d, ok := snap.Device0()
	if !ok {
		return
	}
	s.mu.Lock()
	s.baseline = bases[d.Index]
	s.baselines = bases
	s.mu.Unlock()
	s.log.Info("idle VRAM baseline", "mib", bases[d.Index], "used_mib", d.MemoryUsedMiB, "gpus", len(bases))
}

// driverHeldMiB is what the driver keeps on d for itself: used memory
// minus what GPU processes hold, which stays put when backends come and go.
func driverHeldMiB(d nvml.Device) uint64 {
	var procs uint64
	for _, p := range d.Processes {
		procs += p.UsedMiB
	}
	if d.MemoryUsedMiB > procs {
		return d.MemoryUsedMiB - procs
	}
	return 0
}

// baselineOf is GPU index's idle baseline: measured per GPU at start, the
// configured one, or GPU 0's for a GPU measured later.
func (s *Supervisor) baselineOf(index int) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b, ok := s.baselines[index]; ok {
		return b
	}
	return s.baseline
}

// releaseDevices are the GPUs a release wait proves free: the lane's on a
// box of several lanes; every GPU on a box of one (a profile placed by
// auto may have run on any).
func (s *Supervisor) releaseDevices(snap nvml.Snapshot) []nvml.Device {
	if s.box == nil {
		return snap.Devices
	}
	var out []nvml.Device
	for _, g := range s.box.specOf(s).GPUs {
		if d, ok := snap.Device(g); ok {
			out = append(out, d)
		}
	}
	return out
}

// Snapshot reads the GPU with a short timeout.
func (s *Supervisor) Snapshot(ctx context.Context) (nvml.Snapshot, error) { return s.snapshot(ctx) }

func (s *Supervisor) snapshot(ctx context.Context) (nvml.Snapshot, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return s.gpu.Snapshot(ctx)
}

// backendState is what systemd says about one backend unit.
type backendState struct {
	backend units.Backend
	unit    string
	status  api.UnitStatus
	profile string // from the process environment or the env file
}

func (s *Supervisor) backends(ctx context.Context) ([]backendState, error) {
	var names []string
	var kinds []units.Backend
	for _, b := range []units.Backend{units.VLLM, units.Ollama} {
		if s.cfg.UsesBackend(b) { // a lane without this backend's profiles has no unit for it
			names, kinds = append(names, s.cfg.BackendFor(b).Unit), append(kinds, b)
		}
	}
	// The units are read side by side: every switch reads them in its plan
	// and again when it ends, and each read is a D-Bus round trip.
	sts := make([]api.UnitStatus, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			sts[i], errs[i] = s.units.Unit(cctx, name)
		})
	}
	wg.Wait()
	out := make([]backendState, 0, len(names))
	for i, name := range names {
		if errs[i] != nil {
			return nil, fmt.Errorf("read state of %s: %w", name, errs[i])
		}
		bs := backendState{backend: kinds[i], unit: name, status: sts[i]}
		if sts[i].Active() {
			bs.profile = s.profileOf(sts[i])
		}
		out = append(out, bs)
	}
	return out, nil
}

// profileOf tells which profile a running unit was started with: the
// GPUHOST_PROFILE variable in its main process's environment (the truth),
// else the env file we wrote (what it will run after a restart).
func (s *Supervisor) profileOf(st api.UnitStatus) string {
	return systemd.UnitEnv(st, s.cfg.EnvFilePath(st.Name), units.EnvProfile)
}

// statuses are the units' systemd states, for systemd.InUnits.
func statuses(bs []backendState) []api.UnitStatus {
	out := make([]api.UnitStatus, len(bs))
	for i, b := range bs {
		out[i] = b.status
	}
	return out
}

// engineOf returns the protocol of p's engine, talking to its server on
// loopback.
func (s *Supervisor) engineOf(p *units.Profile) (backend.Backend, error) {
	f, ok := s.engines[p.Backend]
	if !ok {
		return nil, fmt.Errorf("profile %s: no protocol for backend %q", p.Name, p.Backend)
	}
	return f(*p, s.client, "http://127.0.0.1:"+strconv.Itoa(p.Port)), nil
}

// Reconcile derives the state from systemd when no switch runs.
func (s *Supervisor) Reconcile(ctx context.Context) api.State {
	s.mu.Lock()
	gen := s.gen
	s.mu.Unlock()
	bs, err := s.backends(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.current != nil || s.gen != gen || s.heal.running || s.vacating {
		return s.state
	}
	prev := s.state
	next := api.State{Phase: api.PhaseIdle, LastWanted: prev.LastWanted, Paused: prev.Paused, LastError: prev.LastError, Since: prev.Since}
	if err != nil {
		next.Phase = api.PhaseFailed
		next.Error = err.Error()
	} else {
		var active []backendState
		for _, b := range bs {
			e, asleep := s.standby.of(b.unit)
			switch {
			case asleep && (!b.status.Active() || b.profile != e.Profile):
				// Stopped or restarted behind our back: no longer in standby.
				s.standby.clear(b.unit)
				s.heal.publishStandbyLostLocked(b, e)
			case asleep:
				continue // in standby: holds its residual, serves nothing
			}
			if b.status.Active() {
				active = append(active, b)
			}
		}
		if l, ok := s.heal.lostActiveLocked(prev, bs, active); ok {
			next = healState(prev, l.profile, stepHealCheck)
			next.Standby = s.standby.infos()
			s.bus.publish(api.Event{Kind: api.EventState, Profile: next.Target, Message: fmt.Sprintf("%s (%s) left active (%s, result %s) without gpuhost asking",
				l.unit, l.profile, l.status.ActiveState, orDash(l.status.Result)), Detail: map[string]any{"phase": next.Phase, api.DetailUnit: l.unit}})
			s.state = next
			s.heal.startHealLocked(l)
			return next
		}
		if held, ok := s.heal.resumeOnHandStartLocked(prev, active); ok {
			return held
		}
		switch len(active) {
		case 0:
			// A failed switch stays "failed" (with its reason) until the
			// next switch or until something runs again.
			if prev.Phase == api.PhaseFailed && prev.Error != "" && prev.Error == prev.LastError {
				next.Phase, next.Error = api.PhaseFailed, prev.Error
			}
		case 1:
			a := active[0]
			next.Phase = api.PhaseActive
			next.Profile, next.Backend, next.Unit = a.profile, a.backend, a.unit
			if a.status.ActiveState != "active" {
				next.Step = a.status.ActiveState
			}
		default:
			if a, ok := stillServing(prev, active); ok {
				// A second unit came up beside the active one: it keeps
				// serving while the watcher decides on the other (watch.go).
				next.Phase = api.PhaseActive
				next.Profile, next.Backend, next.Unit = a.profile, a.backend, a.unit
				break
			}
			if a, ok := s.heal.pickServingLocked(prev, active); ok {
				// Several units run and none is active (started by
				// hand): the wanted one serves, the watcher puts the
				// others into standby or stops them (watch.go).
				next.Phase = api.PhaseActive
				next.Profile, next.Backend, next.Unit = a.profile, a.backend, a.unit
				break
			}
			next.Phase = api.PhaseFailed
			next.Error = fmt.Sprintf("two backends active at once: %s (%s) and %s (%s)",
				active[0].unit, active[0].status.ActiveState, active[1].unit, active[1].status.ActiveState)
		}
	}
	next.Standby = s.standby.infos()
	if next.Phase != prev.Phase || next.Profile != prev.Profile || next.Unit != prev.Unit || next.Error != prev.Error {
		next.Since = time.Now()
		// The bus never takes s.mu, so publishing under it keeps the order
		// of state events equal to the order of state changes.
		s.bus.publish(api.Event{Kind: api.EventState, Profile: next.Profile, Message: describeState(next),
			Detail: map[string]any{"phase": next.Phase, api.DetailUnit: next.Unit}})
	}
	s.state = next
	return next
}

func describeState(st api.State) string {
	switch st.Phase {
	case api.PhaseActive:
		return fmt.Sprintf("active: %s (%s)", st.Profile, st.Unit)
	case api.PhaseFailed:
		return "failed: " + st.Error
	case api.PhaseSwitching:
		return fmt.Sprintf("switching to %s: %s", st.Target, st.Step)
	}
	return "idle: no backend runs"
}

// Switch starts a switch to profile and returns at once with its id and a
// channel that receives its result. The switch runs detached from ctx (an
// HTTP client going away must not leave the GPU half-switched); ctx only
// bounds the synchronous checks.
func (s *Supervisor) Switch(ctx context.Context, profile string, opts api.SwitchOptions) (string, <-chan error, error) {
	p, ok := s.cfg.Profiles[profile]
	if !ok {
		return "", nil, fmt.Errorf("%w %q (profiles: %s)", api.ErrUnknownProfile, profile, strings.Join(s.cfg.ProfileNames(), ", "))
	}
	if c, bad := s.placementCheck(ctx, p); bad {
		// Not even force: a backend pinned to a GPU that is not there
		// cannot start.
		return "", nil, &api.DoctorError{Profile: profile, Checks: []units.Check{c}}
	}
	if !opts.Force {
		if failing := s.failingChecks(ctx, p); len(failing) > 0 {
			return "", nil, &api.DoctorError{Profile: profile, Checks: failing}
		}
	}
	s.mu.Lock()
	s.heal.resetHealLocked() // a switch asked for ends a heal's wait and its crash count
	s.mu.Unlock()
	if !s.lockSwitch(ctx) {
		s.mu.Lock()
		defer s.mu.Unlock()
		be := &api.BusyError{Target: s.state.Target, Step: s.state.Step}
		if s.current != nil {
			be.SwitchID = s.current.id
		}
		return "", nil, be
	}
	id, done := s.startSwitch(p, opts)
	return id, done, nil
}

// startSwitch runs a switch to p in the background; switchMu is held, and
// the switch releases it when it ends.
func (s *Supervisor) startSwitch(p *units.Profile, opts api.SwitchOptions) (string, <-chan error) {
	return s.launch(&switchRun{s: s, id: newID(), target: p, opts: opts, started: time.Now()})
}

// launch runs r in the background; switchMu is held, and the switch
// releases it when it ends.
func (s *Supervisor) launch(r *switchRun) (string, <-chan error) {
	p := r.target
	s.mu.Lock()
	r.prev = s.state.Profile
	if s.state.Phase != api.PhaseActive {
		r.prev = ""
	}
	s.current = r
	s.activePID = 0
	s.gen++
	s.probes.revoke()
	s.state.Phase, s.state.Target, s.state.SwitchID, s.state.Step, s.state.Error = api.PhaseSwitching, p.Name, r.id, "starting", ""
	s.state.Since = time.Now()
	s.state.LastWanted, s.state.Paused = p.Name, ""
	s.mu.Unlock()
	if err := s.writeLastWanted(p.Name); err != nil {
		s.log.Error("persist last wanted profile", "err", err)
	}
	done := make(chan error, 1)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.probes.awaitRevoked()
		release := s.box.claim(s.baseCtx, s, r)
		err := r.run(s.baseCtx)
		release()
		s.mu.Lock()
		s.current = nil
		s.gen++
		s.switches++
		s.lastSwitch = &api.SwitchSummary{ID: r.id, Profile: r.target.Name, OK: err == nil, StartedAt: r.started,
			DurationMS: float64(time.Since(r.started).Microseconds()) / 1000}
		if err != nil {
			s.lastSwitch.Error = err.Error()
		}
		s.mu.Unlock()
		s.switchMu.Unlock()
		// Unit events during the switch were not reconciled; catch up so a
		// backend that died right after verify is not reported active.
		s.Reconcile(s.baseCtx)
		done <- err
	}()
	return r.id, done
}

// finishingWait bounds how long Switch waits for a switch that has reached
// its end state but not yet released the lock (it records its summary and
// reconciles once more): long enough for that, far shorter than any switch.
const finishingWait = 5 * time.Second

// lockSwitch takes the switch lock. When another switch holds it but its
// state already shows the end (the switch is recording its summary), it
// waits for the lock instead of refusing: a client that saw the previous
// switch finish must not get 409 for a switch that no longer runs.
func (s *Supervisor) lockSwitch(ctx context.Context) bool {
	deadline := time.Now().Add(finishingWait)
	for {
		if s.switchMu.TryLock() {
			return true
		}
		s.mu.Lock()
		running := s.state.Phase == api.PhaseSwitching
		s.mu.Unlock()
		if running || time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(time.Millisecond)
	}
}

// failingChecks runs the profile checks (the pure ones against the GPU's
// size, and the model cache's) and returns the failing ones.
func (s *Supervisor) failingChecks(ctx context.Context, p *units.Profile) []units.Check {
	facts := units.GPUFacts{}
	if snap, err := s.snapshot(ctx); err == nil {
		if d, ok := fitDevice(p, snap); ok {
			facts = units.GPUFacts{TotalMiB: d.MemoryTotalMiB, Name: d.Name, Count: len(p.GPUs.Resolved())}
			facts.ReservedMiB = reservedMiB(s.cfg, s.standby.residualsCopy(), p)
		}
	}
	var out []units.Check
	// The model cache too: a fenced backend cannot fetch a missing model,
	// and its start would fail only after the ready timeout.
	for _, c := range append(units.ProfileChecks(*p, facts, *s.cfg.Policy), modelCacheCheck(ctx, s.cfg, s.units, p)) {
		if c.Severity == units.SeverityFail {
			out = append(out, c)
		}
	}
	return out
}

func newID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// switchRun is one switch in flight.
type switchRun struct {
	s        *Supervisor
	id       string
	target   *units.Profile
	prev     string
	opts     api.SwitchOptions
	started  time.Time
	rollback bool
	// recheck: the target runs awake but failed a check outside a switch
	// (verify.go); it is checked again as after a wake, and restarted cold
	// when that fails too.
	recheck bool
	// follow: the target was restarted by hand and is only proved again
	// (heal.go); a unit the operator started meanwhile is theirs, not in
	// the way: the switch gives way instead of stopping it.
	follow bool
}

// stepError carries the journal tail of a failed step.
type stepError struct {
	err     error
	journal []string
}

func (e *stepError) Error() string { return e.err.Error() }
func (e *stepError) Unwrap() error { return e.err }

func (r *switchRun) event(e api.Event) {
	e.SwitchID = r.id
	if e.Profile == "" {
		e.Profile = r.target.Name
	}
	r.s.bus.publish(e)
}

// stepFunc is the work of one step: the message and detail of its done
// event, or the error (and detail) of its failed one.
type stepFunc func(ctx context.Context) (string, map[string]any, error)

// step runs fn as a named step, with started/done/failed events and timing.
func (r *switchRun) step(ctx context.Context, name string, fn stepFunc) error {
	if r.rollback {
		name = api.StepRollback + name
	}
	r.s.mu.Lock()
	r.s.state.Step = name
	r.s.mu.Unlock()
	r.event(api.Event{Kind: api.EventStep, Step: name, Status: api.StatusStarted, Message: name + " started"})
	t0 := time.Now()
	msg, detail, err := fn(ctx)
	dur := float64(time.Since(t0).Microseconds()) / 1000
	if err != nil {
		e := api.Event{Kind: api.EventStep, Step: name, Status: api.StatusFailed, DurationMS: dur, Message: err.Error(), Detail: detail}
		var se *stepError
		if errors.As(err, &se) {
			e.Journal = se.journal
		}
		r.event(e)
		return fmt.Errorf("%s: %w", name, err)
	}
	r.event(api.Event{Kind: api.EventStep, Step: name, Status: api.StatusDone, DurationMS: dur, Message: msg, Detail: detail})
	return nil
}

func (r *switchRun) run(ctx context.Context) error {
	s := r.s
	r.event(api.Event{Kind: api.EventSwitch, Status: api.StatusStarted, Message: fmt.Sprintf("switch to %s (%s) requested", r.target.Name, r.target.Backend)})
	err := r.sequence(ctx, r.target)
	if err == nil {
		total := float64(time.Since(r.started).Microseconds()) / 1000
		// State first, then the event: whoever reacts to the event sees it.
		s.finish(r.target, "")
		r.event(api.Event{Kind: api.EventSwitch, Status: api.StatusDone, DurationMS: total, Message: fmt.Sprintf("%s is active", r.target.Name)})
		return nil
	}
	failMsg := fmt.Sprintf("switch to %s failed: %v", r.target.Name, err)
	if *s.cfg.Switch.Rollback && r.prev != "" && r.prev != r.target.Name {
		prev := s.cfg.Profiles[r.prev]
		r.rollback = true
		r.event(api.Event{Kind: api.EventSwitch, Status: api.StatusInfo, Profile: prev.Name, Message: "rolling back to " + prev.Name})
		if rerr := r.sequence(ctx, prev); rerr == nil {
			_ = s.writeLastWanted(prev.Name)
			s.mu.Lock()
			s.state.LastWanted = prev.Name
			s.mu.Unlock()
			msg := failMsg + "; rolled back to " + prev.Name
			s.finish(prev, msg)
			r.event(api.Event{Kind: api.EventSwitch, Status: api.StatusFailed, Message: msg})
			return errors.New(msg)
		} else {
			failMsg += fmt.Sprintf("; rollback to %s failed too: %v", prev.Name, rerr)
		}
	}
	s.mu.Lock()
	s.state = api.State{Phase: api.PhaseFailed, Error: failMsg, LastError: failMsg, Since: time.Now(), LastWanted: s.state.LastWanted, Standby: s.standby.infos()}
	s.mu.Unlock()
	r.event(api.Event{Kind: api.EventSwitch, Status: api.StatusFailed, Message: failMsg})
	return errors.New(failMsg)
}

func (s *Supervisor) finish(p *units.Profile, lastErr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Every successful sequence ends in a check (verify, and the wake
	// check after a start or a wake): the backend is verified now.
	s.watch.verified.at, s.watch.verified.profile = time.Now(), p.Name
	s.state = api.State{
		Phase: api.PhaseActive, Profile: p.Name, Backend: p.Backend, Unit: s.cfg.BackendFor(p.Backend).Unit,
		Since: time.Now(), LastWanted: s.state.LastWanted, LastError: lastErr, Standby: s.standby.infos(),
	}
	if lastErr == "" {
		s.state.LastError = ""
	}
}

// leg is one pass of the sequence towards one profile: the switch's
// target, or after its failure the rollback to the previous profile. Its
// methods in steps.go are the sequence's steps.
type leg struct {
	r    *switchRun
	p    *units.Profile
	unit string          // the profile's backend unit
	be   backend.Backend // its engine's protocol
	// loader is be when the engine loads its model by request (Ollama),
	// else nil: the leg has no load_model step.
	loader backend.Loader
	// toStop are the active backend units in the way. running is set when
	// the target unit already runs the profile (a no-op switch, or a
	// restart after a crash mid-switch): it then only has to be ready.
	toStop     []backendState
	running    bool
	heldBefore uint64 // MiB in use before the stop, for the release message
	// toStandby are the active backends in the way that go into standby
	// instead of being stopped (their profile has standby, and the target
	// runs on the other unit). wake is set when the target unit runs the
	// profile in standby: it is woken instead of started.
	toStandby []backendState
	wake      bool
	// wokeLevel is the sleep level the target was woken from (0: not
	// woken, or Ollama's unload), for the wake check.
	wokeLevel int
	// readySt is the unit's state as the ready step read it when it
	// traced the listener; verify's proof starts from it.
	readySt *api.UnitStatus
	// pre is the cold check's first look, running beside verify after a
	// cold start (verifyThenCheck); nil otherwise.
	pre *coldProbe
}

// sequence is the switch proper: drain the requests running on what is in
// the way (drain.go), stop it, wait for the VRAM,
// configure and start the target, wait until it answers, load, verify. From
// the start on, a failed step stops the target again (leg.upStep).
func (r *switchRun) sequence(ctx context.Context, p *units.Profile) error {
	l, err := r.plan(ctx, p)
	if err != nil {
		return err
	}
	l.heldBefore = r.s.usedMiB(ctx)
	if err := l.drainStep(ctx); err != nil {
		return err
	}
	if len(l.toStandby) > 0 {
		if err := r.step(ctx, api.StepStandby, l.standbyOld); err != nil {
			return err
		}
	}
	if len(l.toStop) > 0 {
		if err := r.step(ctx, api.StepStop, l.stopOld); err != nil {
			return err
		}
	}
	if l.running && !l.wake && r.recheck && !r.rollback {
		if l.afterWake(ctx) { // passed this time; else stopped, and started cold below
			return nil
		}
	}
	if l.wake {
		// A backend stopped on the way (standby off) must have given its
		// memory back before the woken one takes its own again, as before
		// a start: its processes exiting is not the driver freeing it.
		if len(l.toStop) > 0 {
			if err := r.step(ctx, api.StepVRAMRelease, l.waitVRAMReleased); err != nil {
				return err
			}
		}
		if err := r.step(ctx, api.StepWake, l.wakeTarget); err != nil {
			// A backend that cannot wake is started afresh: slower, as
			// without standby, but the switch still gets there.
			r.cleanup(l.unit)
			r.s.standby.clear(l.unit)
			l.running, l.wake = false, false
		} else if l.afterWake(ctx) { // verified wake (wakecheck.go); else cold
			return nil
		}
	}
	if !l.running {
		if err := r.step(ctx, api.StepVRAMRelease, l.waitVRAMReleased); err != nil {
			return err
		}
		if err := r.step(ctx, api.StepConfigure, l.configure); err != nil {
			return err
		}
		if err := l.upStep(ctx, api.StepStart, l.start); err != nil {
			return err
		}
	}
	if err := l.upStep(ctx, api.StepReady, l.waitReady); err != nil {
		return err
	}
	if l.loader != nil {
		if err := l.upStep(ctx, api.StepLoadModel, l.load); err != nil {
			return err
		}
	}
	return l.verifyThenCheck(ctx)
}

// plan reads systemd to find what is in the way of p: every active backend
// unit, except the target unit when it already runs p (and is not
// stopping).
func (r *switchRun) plan(ctx context.Context, p *units.Profile) (*leg, error) {
	s := r.s
	l := &leg{r: r, p: p, unit: s.cfg.BackendFor(p.Backend).Unit}
	be, err := s.engineOf(p)
	if err != nil {
		return nil, err
	}
	l.be = be
	l.loader, _ = be.(backend.Loader)
	bs, err := s.backends(ctx)
	if err != nil {
		return nil, err
	}
	for _, b := range bs {
		if !b.status.Active() {
			continue
		}
		_, asleep := s.standby.of(b.unit)
		if b.unit == l.unit && b.profile == p.Name && b.status.ActiveState != "deactivating" {
			l.running = true
			// Asleep without gpuhost's record (a hand /sleep): woken too.
			l.wake = asleep || (p.StandbyEnabled() && s.engineSleeping(ctx, p))
			continue
		}
		if b.unit != l.unit {
			if asleep {
				continue // stays in standby, holding its residual
			}
			if r.follow && !r.rollback {
				return nil, fmt.Errorf("%s was started meanwhile (%s): the operator moved on, gpuhost does not stop it", b.unit, b.status.ActiveState)
			}
			if bp := s.cfg.Profiles[b.profile]; bp != nil && bp.StandbyEnabled() {
				l.toStandby = append(l.toStandby, b)
				continue
			}
		}
		l.toStop = append(l.toStop, b)
	}
	return l, nil
}

// upStep runs a step of a target that has been started (or found running):
// when the step fails the target is stopped again, so it cannot keep VRAM
// that the rollback needs.
func (l *leg) upStep(ctx context.Context, name string, fn stepFunc) error {
	if err := l.r.step(ctx, name, fn); err != nil {
		l.r.cleanup(l.unit)
		return err
	}
	return nil
}

// cleanup stops a unit whose start failed, so it cannot keep VRAM that the
// rollback needs.
//
// A unit found stopping or stopped already was stopped by someone else
// (a hand `systemctl stop` that made the step fail): the healer is told,
// so that it reads the loss as the hand stop it was, not as a crash of its
// own stop.
func (r *switchRun) cleanup(unit string) {
	ctx, cancel := context.WithTimeout(r.s.baseCtx, r.s.cfg.Switch.StopTimeout.D())
	defer cancel()
	if st, err := r.s.units.Unit(ctx, unit); err == nil && (st.ActiveState == "deactivating" || (st.ActiveState == "inactive" && (st.Result == "success" || st.Result == ""))) {
		r.s.heal.noteStoppedByOther(unit)
	}
	if err := r.s.units.Stop(ctx, unit); err != nil {
		r.s.log.Error("stop failed backend", "unit", unit, "err", err)
	}
}

func (r *switchRun) journalTail(unit string) []string {
	ctx, cancel := context.WithTimeout(r.s.baseCtx, 5*time.Second)
	defer cancel()
	lines, err := r.s.journal(ctx, unit, 20)
	if err != nil {
		return []string{"(journal unavailable: " + err.Error() + ")"}
	}
	return lines
}
