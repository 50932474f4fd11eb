package appliance

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"gpuhost/api"
	"gpuhost/config"
	"gpuhost/internal/atomicfile"
)

// standbyBook is who is in standby (unit → entry), the GPU memory each
// profile holds while in standby as measured at its first sleep, and the
// exclusion violations found. Both the units and the residuals are kept in
// standby.json. Its lock is its own and nests inside the switch engine's
// state lock (Reconcile reads and clears entries under s.mu); it never
// calls out of the book.
type standbyBook struct {
	path string
	log  *slog.Logger

	mu        sync.Mutex
	units     map[string]standbyEntry
	residuals map[string]uint64
	exclusion exclusionStats
}

// exclusionStats counts standby backends found holding more than their
// residual (someone called wake_up by hand, or a load reached an unloaded
// Ollama), for the doctor and the metrics.
type exclusionStats struct {
	Violations uint64
	Last       time.Time
	LastMsg    string
}

// standbyFile is standby.json in the state directory: the measured
// residuals (kept across restarts: they are facts about the profile on this
// card) and the units in standby (checked against the backends at start).
type standbyFile struct {
	ResidualMiB map[string]uint64       `json:"residual_mib"`
	Units       map[string]standbyEntry `json:"units"`
}

func standbyPath(cfg *config.Config) string { return filepath.Join(cfg.StateDir, "standby.json") }

// newStandbyBook loads the book from standby.json.
func newStandbyBook(cfg *config.Config, log *slog.Logger) standbyBook {
	sf := readStandbyFile(cfg, log)
	return standbyBook{path: standbyPath(cfg), log: log, units: sf.Units, residuals: sf.ResidualMiB}
}

// readStandbyFile loads standby.json; a missing or unusable file is an
// empty one (the residuals are then measured again at the next sleep).
func readStandbyFile(cfg *config.Config, log *slog.Logger) standbyFile {
	out := standbyFile{ResidualMiB: map[string]uint64{}, Units: map[string]standbyEntry{}}
	f, err := os.Open(standbyPath(cfg))
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			log.Warn("ignoring unreadable standby file", "file", standbyPath(cfg), "err", err)
		}
		return out
	}
	defer f.Close()
	var in standbyFile
	if err := json.NewDecoder(io.LimitReader(f, maxStateFileBytes)).Decode(&in); err != nil {
		log.Warn("ignoring unreadable standby file", "file", standbyPath(cfg), "err", err)
		return out
	}
	for p, mib := range in.ResidualMiB {
		if _, ok := cfg.Profiles[p]; ok {
			out.ResidualMiB[p] = mib
		}
	}
	for u, e := range in.Units {
		if p, ok := cfg.Profiles[e.Profile]; ok && p.StandbyEnabled() && cfg.BackendFor(p.Backend).Unit == u {
			out.Units[u] = e
		}
	}
	return out
}

// writeLocked persists residuals and standby units; b.mu is held.
func (b *standbyBook) writeLocked() {
	data, _ := json.MarshalIndent(standbyFile{ResidualMiB: b.residuals, Units: b.units}, "", "  ")
	if err := atomicfile.Write(b.path, append(data, '\n'), 0o644); err != nil {
		b.log.Error("persist standby state", "err", err)
	}
}

// set records unit as in standby.
func (b *standbyBook) set(unit string, e standbyEntry) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.units == nil {
		b.units = map[string]standbyEntry{}
	}
	b.units[unit] = e
	b.writeLocked()
}

// clear forgets unit's standby, if any.
func (b *standbyBook) clear(unit string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.units[unit]; ok {
		delete(b.units, unit)
		b.writeLocked()
	}
}

// of returns unit's entry; ok is false when it is not in standby.
func (b *standbyBook) of(unit string) (standbyEntry, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.units[unit]
	return e, ok
}

// residualOf returns profile's measured residual; ok is false when none.
func (b *standbyBook) residualOf(profile string) (uint64, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.residuals[profile]
	return r, ok
}

// setResidual records profile's measured residual.
func (b *standbyBook) setResidual(profile string, mib uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.residuals == nil {
		b.residuals = map[string]uint64{}
	}
	b.residuals[profile] = mib
	b.writeLocked()
}

// residualsCopy returns every measured residual by profile.
func (b *standbyBook) residualsCopy() map[string]uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string]uint64, len(b.residuals))
	for k, v := range b.residuals {
		out[k] = v
	}
	return out
}

// infos lists the units in standby for State.
func (b *standbyBook) infos() []api.StandbyInfo {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []api.StandbyInfo
	for u, e := range b.units {
		out = append(out, api.StandbyInfo{Profile: e.Profile, Unit: u, Mode: string(e.Mode), ResidualMiB: b.residuals[e.Profile], Since: e.Since})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Unit < out[j].Unit })
	return out
}

// residualsSum is what the units in standby may hold together, which the
// VRAM release before a start allows for.
func (b *standbyBook) residualsSum() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var sum uint64
	for _, e := range b.units {
		sum += b.residuals[e.Profile] + residualToleranceMiB
	}
	return sum
}

// standbyWatched is one unit in standby with its residual, for the watch.
type standbyWatched struct {
	unit     string
	e        standbyEntry
	residual uint64
	known    bool
}

// watched lists the units in standby with their residuals.
func (b *standbyBook) watched() []standbyWatched {
	b.mu.Lock()
	defer b.mu.Unlock()
	var ws []standbyWatched
	for u, e := range b.units {
		r, ok := b.residuals[e.Profile]
		ws = append(ws, standbyWatched{u, e, r, ok})
	}
	return ws
}

// anyOf reports a unit in standby that runs profile or is unit (for the
// probe lease), with its entry.
func (b *standbyBook) anyOf(profile, unit string) (string, standbyEntry, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var (
		found string
		fe    standbyEntry
		ok    bool
	)
	for u, e := range b.units {
		if e.Profile == profile || u == unit {
			found, fe, ok = u, e, true
		}
	}
	return found, fe, ok
}

// violation counts a backend found above its residual.
func (b *standbyBook) violation(msg string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.exclusion.Violations++
	b.exclusion.Last, b.exclusion.LastMsg = time.Now(), msg
}

// exclusionSeen reports the violations counted and the last one.
func (b *standbyBook) exclusionSeen() (violations uint64, last time.Time, lastMsg string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.exclusion.Violations, b.exclusion.Last, b.exclusion.LastMsg
}
