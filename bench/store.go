package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"gpuhost/internal/atomicfile"
)

// Store keeps results as one JSON file per run under <state_dir>/bench,
// named <id>.json, written atomically. Files are the interface: an operator
// may copy, delete or diff them, and a broken one only hides itself.
type Store struct {
	Dir string
	Log *slog.Logger
}

// NewStore returns the store under stateDir/bench.
func NewStore(stateDir string, log *slog.Logger) *Store {
	if log == nil {
		log = slog.Default()
	}
	return &Store{Dir: filepath.Join(stateDir, "bench"), Log: log}
}

// ErrNotFound is returned by Load for an ID with no result file.
var ErrNotFound = errors.New("no such bench result")

// validID is what NewID produces (and a collision suffix); anything else
// is refused before it reaches the file system, so an ID from an HTTP path
// cannot name another file.
var validID = regexp.MustCompile(`^[0-9]{8}T[0-9]{6}Z-[A-Za-z0-9._-]{1,80}$`)

// ValidID reports whether id can name a stored result.
func ValidID(id string) bool { return validID.MatchString(id) && !strings.Contains(id, "..") }

// Save writes r as <Dir>/<r.ID>.json. If that file exists (two runs in one
// second), a suffix -2, -3 … is added to the ID. It returns the path.
func (s *Store) Save(r *Result) (string, error) {
	if !ValidID(r.ID) {
		return "", fmt.Errorf("save bench result: invalid id %q", r.ID)
	}
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return "", fmt.Errorf("save bench result %s: create %s: %w", r.ID, s.Dir, err)
	}
	base := r.ID
	for n := 2; ; n++ {
		if _, err := os.Stat(s.path(r.ID)); errors.Is(err, fs.ErrNotExist) {
			break
		}
		if n > 100 {
			return "", fmt.Errorf("save bench result %s: 100 results with the same id", base)
		}
		r.ID = fmt.Sprintf("%s-%d", base, n)
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return "", fmt.Errorf("save bench result %s: encode: %w", r.ID, err)
	}
	path := s.path(r.ID)
	if err := atomicfile.Write(path, append(data, '\n'), 0o644); err != nil {
		return "", fmt.Errorf("save bench result: %w", err)
	}
	return path, nil
}

func (s *Store) logger() *slog.Logger {
	if s.Log == nil {
		return slog.Default()
	}
	return s.Log
}

func (s *Store) path(id string) string { return filepath.Join(s.Dir, id+".json") }

// Load reads one result by ID. "latest" names the newest one.
func (s *Store) Load(id string) (*Result, error) {
	if id == "latest" {
		all, _, err := s.List()
		if err != nil {
			return nil, err
		}
		if len(all) == 0 {
			return nil, fmt.Errorf("%w: the store %s is empty", ErrNotFound, s.Dir)
		}
		return all[len(all)-1], nil
	}
	if !ValidID(id) {
		return nil, fmt.Errorf("%w: %q is not a result id (like 20260102T150405Z-coder)", ErrNotFound, id)
	}
	r, err := readResult(s.path(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return r, err
}

// Warning names a result file that List skipped and why.
type Warning struct {
	File   string `json:"file"`
	Reason string `json:"reason"`
}

func (w Warning) String() string { return w.File + ": " + w.Reason }

// List returns every readable result, oldest first. Unreadable, corrupt or
// newer-schema files are skipped: each is logged and returned as a
// Warning naming the file, so one bad file never hides the others. The
// error is only for a store directory that cannot be read; a missing one
// is an empty store.
func (s *Store) List() ([]*Result, []Warning, error) {
	entries, err := os.ReadDir(s.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("list bench results in %s: %w", s.Dir, err)
	}
	var out []*Result
	var warns []Warning
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".json") || strings.HasPrefix(name, ".") {
			continue
		}
		path := filepath.Join(s.Dir, name)
		r, err := readResult(path)
		if err != nil {
			w := Warning{File: path, Reason: err.Error()}
			s.logger().Warn("skipping unreadable bench result", "file", path, "err", err)
			warns = append(warns, w)
			continue
		}
		out = append(out, r)
	}
	slices.SortStableFunc(out, func(a, b *Result) int {
		if c := a.StartedAt.Compare(b.StartedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, warns, nil
}

// readResult reads and checks one file.
func readResult(path string) (*Result, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseResult(data)
}

// ParseResult decodes a stored result and checks its schema version and
// ID, so that a stray or damaged JSON file is refused with a reason.
func ParseResult(data []byte) (*Result, error) {
	var head struct {
		SchemaVersion *int `json:"schema_version"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return nil, fmt.Errorf("not a bench result (corrupt JSON): %w", err)
	}
	switch {
	case head.SchemaVersion == nil:
		return nil, errors.New("not a bench result: no schema_version")
	case *head.SchemaVersion > SchemaVersion:
		return nil, fmt.Errorf("schema_version %d is newer than this gpuhost reads (%d); upgrade gpuhost", *head.SchemaVersion, SchemaVersion)
	case *head.SchemaVersion < 1:
		return nil, fmt.Errorf("schema_version %d is invalid", *head.SchemaVersion)
	}
	var r Result
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("not a bench result (corrupt JSON): %w", err)
	}
	if !ValidID(r.ID) {
		return nil, fmt.Errorf("bench result has an invalid id %q", r.ID)
	}
	return &r, nil
}
