package appliance

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"time"
	"unicode/utf8"

	"gpuhost/internal/atomicfile"
	"gpuhost/units"
)

// lastWantedFile is state.json in the state directory, the one thing the
// Supervisor persists: the last profile a switch was asked for, which a
// restart restores.
type lastWantedFile struct {
	Profile string    `json:"last_wanted_profile"`
	At      time.Time `json:"at"`
	// Paused is the profile whose backend the operator stopped by hand
	// (Profile is "" then): what `gpuhost heal` resumes.
	Paused string `json:"paused,omitempty"`
}

func (s *Supervisor) statePath() string { return filepath.Join(s.cfg.StateDir, "state.json") }

// maxStateFileBytes bounds the read of state.json, which holds one profile
// name and a time: a file beyond it is not gpuhost's and is ignored rather
// than read whole into memory.
const maxStateFileBytes = 64 << 10

// readStateFile reads state.json (the last wanted profile, and a profile
// paused by hand); the zero value when there is none or the file is not
// usable (too large, not JSON, not a profile name). What it logs about the
// file is bounded too.
func (s *Supervisor) readStateFile() lastWantedFile {
	path := s.statePath()
	f, err := os.Open(path)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			s.log.Warn("ignoring unreadable state file", "file", path, "err", err)
		}
		return lastWantedFile{}
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxStateFileBytes+1))
	if err != nil {
		s.log.Warn("ignoring unreadable state file", "file", path, "err", err)
		return lastWantedFile{}
	}
	if len(data) > maxStateFileBytes {
		s.log.Warn("ignoring state file larger than its limit", "file", path, "limit_bytes", maxStateFileBytes)
		return lastWantedFile{}
	}
	var lw lastWantedFile
	if err := json.Unmarshal(data, &lw); err != nil {
		s.log.Warn("ignoring unreadable state file", "file", path, "err", err)
		return lastWantedFile{}
	}
	for _, name := range []string{lw.Profile, lw.Paused} {
		if name == "" {
			continue
		}
		if err := units.ValidProfileName(name); err != nil {
			s.log.Warn("ignoring state file: last_wanted_profile is not a profile name", "file", path,
				"profile_prefix", clipForLog(name, 64), "profile_bytes", len(name))
			return lastWantedFile{}
		}
	}
	return lw
}

// clipForLog shortens s to at most n bytes (on a rune boundary) for a log
// line, marking the cut.
func clipForLog(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// writeLastWanted records p as the last wanted profile, atomically.
func (s *Supervisor) writeLastWanted(p string) error {
	return s.writeStateFile(lastWantedFile{Profile: p})
}

// writePaused records that nothing is wanted since the operator stopped
// profile p's backend by hand.
func (s *Supervisor) writePaused(p string) error {
	return s.writeStateFile(lastWantedFile{Paused: p})
}

func (s *Supervisor) writeStateFile(lw lastWantedFile) error {
	lw.At = time.Now().UTC()
	data, _ := json.Marshal(lw)
	return atomicfile.Write(s.statePath(), append(data, '\n'), 0o644)
}
