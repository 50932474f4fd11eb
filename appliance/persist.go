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
}

func (s *Supervisor) statePath() string { return filepath.Join(s.cfg.StateDir, "state.json") }

// maxStateFileBytes bounds the read of state.json, which holds one profile
// name and a time: a file beyond it is not gpuhost's and is ignored rather
// than read whole into memory.
const maxStateFileBytes = 64 << 10

// readLastWanted returns the last wanted profile from state.json, or "" when
// there is none or the file is not usable (too large, not JSON, not a
// profile name). What it logs about the file is bounded too.
func (s *Supervisor) readLastWanted() string {
	path := s.statePath()
	f, err := os.Open(path)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			s.log.Warn("ignoring unreadable state file", "file", path, "err", err)
		}
		return ""
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxStateFileBytes+1))
	if err != nil {
		s.log.Warn("ignoring unreadable state file", "file", path, "err", err)
		return ""
	}
	if len(data) > maxStateFileBytes {
		s.log.Warn("ignoring state file larger than its limit", "file", path, "limit_bytes", maxStateFileBytes)
		return ""
	}
	var lw lastWantedFile
	if err := json.Unmarshal(data, &lw); err != nil {
		s.log.Warn("ignoring unreadable state file", "file", path, "err", err)
		return ""
	}
	if lw.Profile != "" {
		if err := units.ValidProfileName(lw.Profile); err != nil {
			s.log.Warn("ignoring state file: last_wanted_profile is not a profile name", "file", path,
				"profile_prefix", clipForLog(lw.Profile, 64), "profile_bytes", len(lw.Profile))
			return ""
		}
	}
	return lw.Profile
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
	data, _ := json.Marshal(lastWantedFile{Profile: p, At: time.Now().UTC()})
	return atomicfile.Write(s.statePath(), append(data, '\n'), 0o644)
}
