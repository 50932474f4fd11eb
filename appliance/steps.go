package appliance

// The steps of a switch's sequence (switchRun.sequence in supervisor.go),
// in their order: each is a stepFunc of one leg, with its helpers.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"gpuhost/api"
	"gpuhost/backend"
	"gpuhost/internal/atomicfile"
	"gpuhost/nvml"
	"gpuhost/systemd"
	"gpuhost/units"
)

// usedMiB is the GPU memory in use now; 0 when NVML cannot tell.
func (s *Supervisor) usedMiB(ctx context.Context) uint64 {
	if snap, err := s.snapshot(ctx); err == nil {
		if devs := s.releaseDevices(snap); len(devs) > 0 {
			return devs[0].MemoryUsedMiB
		}
	}
	return 0
}

// stopOld stops the backend units in the way, each within the stop timeout.
func (l *leg) stopOld(ctx context.Context) (string, map[string]any, error) {
	s := l.r.s
	var names []string
	for _, b := range l.toStop {
		cctx, cancel := context.WithTimeout(ctx, s.cfg.Switch.StopTimeout.D())
		err := s.units.Stop(cctx, b.unit)
		cancel()
		if err != nil {
			return "", nil, fmt.Errorf("stop %s: %w", b.unit, err)
		}
		s.standby.clear(b.unit)
		names = append(names, b.unit)
	}
	return "stopped " + strings.Join(names, ", "), nil, nil
}

// waitVRAMReleased waits until NVML shows used memory back near the idle
// baseline on every GPU the target may use (releaseDevices) and no GPU
// process from a stopped unit on any GPU.
func (l *leg) waitVRAMReleased(ctx context.Context) (string, map[string]any, error) {
	s := l.r.s
	ctx, cancel := context.WithTimeout(ctx, s.cfg.GPU.ReleaseTimeout.D())
	defer cancel()
	s.mu.Lock()
	// Backends in standby keep their residual: the release is complete
	// when everything else is back to the baseline.
	asleep := s.standby.residualsSum()
	s.mu.Unlock()
	pl := newPoller(releasePollCap)
	var last nvml.Device
	var lastErr error
	var holders []nvml.Process
	stoppedUnits := statuses(l.toStop)
	for {
		snap, err := s.snapshot(ctx)
		if err == nil {
			devs := s.releaseDevices(snap)
			if len(devs) == 0 {
				return "no GPU device reported; nothing to wait for", nil, nil
			}
			holders = holders[:0]
			// A stopped backend may have run on any GPU: its processes
			// must be gone from all of them.
			for _, dev := range snap.Devices {
				for _, proc := range dev.Processes {
					if systemd.InUnits(proc.PID, stoppedUnits...) {
						holders = append(holders, proc)
					}
				}
			}
			over, ok := s.overBaseline(devs, asleep)
			last = over
			if ok && len(holders) == 0 {
				return l.releasedMsg(devs)
			}
		} else {
			if errors.Is(err, nvml.ErrUnavailable) {
				// No NVML at all: waiting cannot help, and starting a backend
				// without proof that the VRAM is free is what we refuse.
				return "", nil, fmt.Errorf("cannot verify the VRAM release: %w", err)
			}
			lastErr = err
		}
		if werr := pl.wait(ctx); werr != nil {
			baseline := s.baselineOf(last.Index)
			detail := map[string]any{api.DetailUsedMiB: last.MemoryUsedMiB, "limit_mib": baseline + s.cfg.GPU.ReleaseToleranceMiB + asleep, "baseline_mib": baseline, api.DetailGPU: last.Index}
			return "", detail, s.notReleased(last, holders, baseline, lastErr)
		}
	}
}

// overBaseline returns the first of devs using more than its baseline,
// the tolerance and the standby residuals allow (ok false), or the first
// device (ok true) when none does.
func (s *Supervisor) overBaseline(devs []nvml.Device, asleep uint64) (nvml.Device, bool) {
	for _, d := range devs {
		if d.MemoryUsedMiB > s.baselineOf(d.Index)+s.cfg.GPU.ReleaseToleranceMiB+asleep {
			return d, false
		}
	}
	return devs[0], true
}

// releasedMsg is the release step's message: GPU 0's figures as on a box
// of one GPU, each GPU's when several were checked.
func (l *leg) releasedMsg(devs []nvml.Device) (string, map[string]any, error) {
	s := l.r.s
	d := devs[0]
	baseline := s.baselineOf(d.Index)
	msg := fmt.Sprintf("VRAM released: %d MiB used of %d (baseline %d)", d.MemoryUsedMiB, d.MemoryTotalMiB, baseline)
	if len(devs) > 1 || d.Index != 0 {
		var parts []string
		for _, d := range devs {
			parts = append(parts, fmt.Sprintf("GPU %d %d/%d MiB (baseline %d)", d.Index, d.MemoryUsedMiB, d.MemoryTotalMiB, s.baselineOf(d.Index)))
		}
		msg = "VRAM released: " + strings.Join(parts, ", ")
	}
	if l.heldBefore > d.MemoryUsedMiB && len(devs) == 1 {
		msg += fmt.Sprintf(", %d MiB freed", l.heldBefore-d.MemoryUsedMiB)
	}
	return msg, map[string]any{api.DetailUsedMiB: d.MemoryUsedMiB, api.DetailTotalMiB: d.MemoryTotalMiB, "baseline_mib": baseline}, nil
}

// notReleased is the error of a VRAM release that timed out: the memory
// still used against the limit, and who holds it.
func (s *Supervisor) notReleased(last nvml.Device, holders []nvml.Process, baseline uint64, lastErr error) error {
	limit := baseline + s.cfg.GPU.ReleaseToleranceMiB
	var hs []string
	for _, h := range holders {
		hs = append(hs, fmt.Sprintf("pid %d (%s) %d MiB", h.PID, h.Name, h.UsedMiB))
	}
	msg := fmt.Sprintf("VRAM not released within %s: %d MiB used, want ≤ %d (baseline %d + tolerance %d)",
		s.cfg.GPU.ReleaseTimeout.D(), last.MemoryUsedMiB, limit, baseline, s.cfg.GPU.ReleaseToleranceMiB)
	if len(hs) > 0 {
		msg += "; still held by " + strings.Join(hs, ", ")
	} else if len(last.Processes) > 0 {
		var others []string
		for _, p := range last.Processes {
			others = append(others, fmt.Sprintf("pid %d (%s) %d MiB", p.PID, p.Name, p.UsedMiB))
		}
		msg += "; GPU processes: " + strings.Join(others, ", ")
	}
	if lastErr != nil {
		msg += "; last NVML error: " + lastErr.Error()
	}
	return errors.New(msg)
}

// configure writes the target unit's env file: the profile and its
// backend's arguments, which the unit reads when it starts.
func (l *leg) configure(ctx context.Context) (string, map[string]any, error) {
	s := l.r.s
	path := s.cfg.EnvFilePath(l.unit)
	bc := s.cfg.BackendFor(l.p.Backend)
	p, pl, err := s.pinned(ctx, l.p)
	if err != nil {
		return "", nil, err
	}
	content := []byte(units.PinnedEnvFile(p, bc.Simulated, pl.pinning()))
	msg := "wrote " + path
	// A file that already says this (the profile's last start) stays: it
	// was written atomically and synced then, and a rewrite costs a sync.
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, content) {
		msg = path + " already as wanted"
	} else if err := atomicfile.Write(path, content, 0o644); err != nil {
		return "", nil, err
	}
	detail := map[string]any{"args": units.BackendArgs(p, bc.Simulated)}
	if len(pl.Indices) > 0 {
		detail["gpus"], detail["gpu_uuids"], detail["p2p"] = pl.Indices, pl.UUIDs, pl.P2PWhy
		msg += "; pinned to GPU " + units.IndicesString(pl.Indices)
	}
	return msg, detail, nil
}

// pinned places p on its GPUs by the NVML snapshot taken now (so auto sees
// the memory the stopped backends gave back) and returns the profile as
// placed. Without GPU facts a profile without gpus runs unpinned, as on a
// box before placements; one with gpus cannot be placed and fails.
func (s *Supervisor) pinned(ctx context.Context, p *units.Profile) (units.Profile, placement, error) {
	snap, err := s.snapshot(ctx)
	if err != nil {
		if !p.GPUs.Given {
			return *p, placement{}, nil
		}
		return units.Profile{}, placement{}, fmt.Errorf("place profile %q on GPUs %s: %w", p.Name, p.GPUs, err)
	}
	pl, err := placeProfile(p, snap)
	if err != nil {
		return units.Profile{}, placement{}, err
	}
	return placedProfile(*p, pl), pl, nil
}

// start starts the target unit; a failed start carries the unit's journal.
func (l *leg) start(ctx context.Context) (string, map[string]any, error) {
	cctx, cancel := context.WithTimeout(ctx, l.r.s.cfg.Switch.ReadyTimeout.D())
	defer cancel()
	if err := l.r.s.units.Start(cctx, l.unit); err != nil {
		return "", nil, &stepError{err: fmt.Errorf("start %s: %w", l.unit, err), journal: l.r.journalTail(l.unit)}
	}
	return "started " + l.unit, nil, nil
}

// waitReady polls the backend's health endpoint on the adaptive schedule and
// watches the unit, so a backend that dies while loading fails the switch at
// once (with its journal) instead of at the ready timeout. An answer counts
// only from the unit's own listener (portowner.go): another program on the
// profile's port fails the switch at once, naming it.
//
// The unit's state is a D-Bus round trip that PID 1 answers, so it is
// read beside a health GET only every readyUnitEvery, not on every poll:
// the health poll can then run at the early gap without keeping systemd
// busy, and a ready backend is seen within a couple of milliseconds. The
// listener proof uses the latest read; when that read is older than the
// poll and the proof fails, the unit is read afresh once (it may have been
// restarted meanwhile) before the answer is judged.
func (l *leg) waitReady(ctx context.Context) (string, map[string]any, error) {
	s := l.r.s
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Switch.ReadyTimeout.D())
	defer cancel()
	url := l.be.HealthURL()
	pl := newEarlyPoller(readyPollCap, readyPollEarlyCap, readyPollEarlyFor)
	polls := 0
	var ownerErr error
	u := &unitReads{s: s, unit: l.unit}
	for {
		polls++
		fresh := u.due()
		var uerrc chan error
		if fresh {
			uerrc = make(chan error, 1)
			go func() { uerrc <- u.read(ctx) }()
		}
		hctx, hcancel := context.WithTimeout(ctx, time.Second)
		gerr := l.be.Health(hctx)
		hcancel()
		if fresh && <-uerrc == nil && !u.st.Active() {
			return "", nil, l.stoppedWhileLoading(u.st)
		}
		if gerr == nil && u.ok() {
			owner, oerr := provePortOwner(l.p.Port, u.st)
			if oerr != nil && !fresh && u.read(ctx) == nil {
				if !u.st.Active() {
					return "", nil, l.stoppedWhileLoading(u.st)
				}
				owner, oerr = provePortOwner(l.p.Port, u.st)
			}
			if oerr == nil {
				st := u.st
				l.readySt = &st
				return fmt.Sprintf("%s answered after %d polls; %s", url, polls, owner), map[string]any{"polls": polls}, nil
			}
			if !errors.Is(oerr, errPortUnproven) {
				return "", map[string]any{"polls": polls}, &stepError{err: oerr, journal: l.r.journalTail(l.unit)}
			}
			ownerErr = oerr
		}
		if werr := pl.wait(ctx); werr != nil {
			return "", map[string]any{"polls": polls}, l.notReady(polls, url, ownerErr)
		}
	}
}

// readyUnitEvery is how often the ready poll reads the unit's state: how
// late at most a backend that dies while loading is seen.
const readyUnitEvery = 20 * time.Millisecond

// unitReads is the ready poll's latest successful read of its unit.
type unitReads struct {
	s    *Supervisor
	unit string
	st   api.UnitStatus
	have bool      // a read succeeded: st holds the latest
	last time.Time // when the latest read (successful or not) began
}

func (u *unitReads) due() bool { return u.last.IsZero() || time.Since(u.last) >= readyUnitEvery }
func (u *unitReads) ok() bool  { return u.have }

func (u *unitReads) read(ctx context.Context) error {
	u.last = time.Now()
	st, err := u.s.units.Unit(ctx, u.unit)
	if err == nil {
		u.st, u.have = st, true
	}
	return err
}

// stoppedWhileLoading is the ready step's error for a unit that left
// active before its backend answered.
func (l *leg) stoppedWhileLoading(st api.UnitStatus) error {
	return &stepError{
		err:     fmt.Errorf("%s stopped while loading (state %s, result %s)", l.unit, st.ActiveState, st.Result),
		journal: l.r.journalTail(l.unit),
	}
}

// notReady is the error of a ready step that timed out after polls polls
// of url, naming whatever holds the port, which may be why.
func (l *leg) notReady(polls int, url string, ownerErr error) error {
	s := l.r.s
	err := fmt.Errorf("%s not ready within %s (%d polls of %s)", l.unit, s.cfg.Switch.ReadyTimeout.D(), polls, url)
	if st, uerr := s.units.Unit(s.baseCtx, l.unit); uerr == nil {
		if _, oerr := provePortOwner(l.p.Port, st); oerr != nil && !errors.Is(oerr, errPortUnproven) {
			err = fmt.Errorf("%w; %w", err, oerr)
		} else if ownerErr != nil {
			err = fmt.Errorf("%w; %w", err, ownerErr)
		}
	}
	return &stepError{err: err, journal: l.r.journalTail(l.unit)}
}

// load has the engine load the model (Ollama), bounded by the ready timeout.
func (l *leg) load(ctx context.Context) (string, map[string]any, error) {
	ctx, cancel := context.WithTimeout(ctx, l.r.s.cfg.Switch.ReadyTimeout.D())
	defer cancel()
	msg, err := l.loader.Load(ctx)
	return msg, nil, err
}

// verify is the last step: Supervisor.verify, whose listener proof takes
// the unit's main process and cgroup from the ready step's read of them
// (the listener and the processes holding it are read afresh).
func (l *leg) verify(ctx context.Context) (string, map[string]any, error) {
	return l.r.s.verifyUnit(ctx, l.p, l.readySt)
}

// verify checks that the backend serves the profile's name, from the unit's
// own listener, and reports the VRAM it now holds. The doctor asks it too.
func (s *Supervisor) verify(ctx context.Context, p *units.Profile) (string, map[string]any, error) {
	return s.verifyUnit(ctx, p, nil)
}

// verifyUnit is verify with the unit's state read just before (st), or
// read now when st is nil.
func (s *Supervisor) verifyUnit(ctx context.Context, p *units.Profile, st *api.UnitStatus) (string, map[string]any, error) {
	be, err := s.engineOf(p)
	if err != nil {
		return "", nil, err
	}
	// Which agent APIs it serves is asked beside the check (it decides
	// nothing about it) and recorded only when the check passes.
	apisc := make(chan []string, 1)
	actx, acancel := context.WithTimeout(ctx, 5*time.Second)
	defer acancel()
	go func() { apisc <- backend.ServedAPIs(actx, s.client, fmt.Sprintf("http://127.0.0.1:%d", p.Port)) }()
	vctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	detail, err := be.Verify(vctx)
	cancel()
	if err != nil {
		return "", detail, err
	}
	if detail == nil {
		detail = map[string]any{}
	}
	// The answers above must have come from the unit's own listener.
	if err := s.proveUnitListens(ctx, p, st); err != nil {
		return "", detail, err
	}
	msg := "serving " + p.ServedName
	apis := <-apisc
	s.apis.Store(p.Name, apis)
	detail["apis"] = apis
	if s.gpu == nil {
		return msg, detail, nil
	}
	if snap, err := s.snapshot(ctx); err == nil {
		if err := s.proveOnLaneGPUs(ctx, p, snap); err != nil {
			return "", detail, err
		}
		// The lane's first GPU: on a box of one lane GPU 0, as before.
		if devs := s.releaseDevices(snap); len(devs) > 0 {
			d := devs[0]
			detail[api.DetailUsedMiB], detail[api.DetailTotalMiB] = d.MemoryUsedMiB, d.MemoryTotalMiB
			msg += fmt.Sprintf(" · VRAM %.1f/%.1f GiB", float64(d.MemoryUsedMiB)/1024, float64(d.MemoryTotalMiB)/1024)
		}
	}
	return msg, detail, nil
}

// proveOnLaneGPUs refuses, on a box of several lanes, a backend whose
// processes hold memory on a GPU outside its lane: another lane may serve
// there (an environment file edited by hand pins another card). On a box of
// one lane a backend may run on any GPU (auto placement).
func (s *Supervisor) proveOnLaneGPUs(ctx context.Context, p *units.Profile, snap nvml.Snapshot) error {
	if s.box == nil {
		return nil
	}
	unit := s.cfg.BackendFor(p.Backend).Unit
	st, err := s.units.Unit(ctx, unit)
	if err != nil {
		return nil // the unit's state is the other steps' business
	}
	lane := s.box.specOf(s)
	for _, d := range snap.Devices {
		if slices.Contains(lane.GPUs, d.Index) {
			continue
		}
		if used := unitUsedMiB(d, st); used > residualToleranceMiB {
			return fmt.Errorf("%s holds %d MiB on GPU %d, outside its lane %s: its environment file pins another GPU (%s)", unit, used, d.Index, lane.Name(), s.cfg.EnvFilePath(unit))
		}
	}
	return nil
}

// proveUnitListens checks that the listener on p's port belongs to p's
// backend unit (provePortOwner), described by st or, when st is nil, by
// its state read now.
func (s *Supervisor) proveUnitListens(ctx context.Context, p *units.Profile, st *api.UnitStatus) error {
	if st == nil {
		unit := s.cfg.BackendFor(p.Backend).Unit
		now, err := s.units.Unit(ctx, unit)
		if err != nil {
			return fmt.Errorf("read state of %s: %w", unit, err)
		}
		st = &now
	}
	_, err := provePortOwner(p.Port, *st)
	return err
}
