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
	"sync"
	"time"

	"gpuhost/internal/atomicfile"
)

// Store keeps results as one JSON file per run under <state_dir>/bench,
// named <id>.json, written atomically. Files are the interface: an operator
// may copy, delete or diff them, and a broken one only hides itself.
//
// The store is bounded: after each Save the earliest stored results
// beyond MaxResults files, MaxBytes on disk or maxStoreValues JSON values
// are deleted (storebound.go). List parses a file only
// when it is new or changed (by size and modification time) and keeps what
// it parsed; before, every /bench, /api/bench, chart.svg and MCP call
// parsed every file whole (50 uploads of ~4 MB, then 4 concurrent GET
// /bench: RSS 63 → 1,323 MB, 12.3 s).
type Store struct {
	Dir string
	Log *slog.Logger
	// MaxResults and MaxBytes bound the results kept (bench.max_results,
	// bench.max_bytes); 0 is no bound (a store the CLI reads).
	MaxResults int
	MaxBytes   int64

	mu     sync.Mutex // serialises List's refresh and Save's pruning
	cache  map[string]cachedResult
	counts map[string]storedFile // prune's value counts per file
}

// cachedResult is one file as List last read it.
type cachedResult struct {
	size int64
	mod  time.Time
	r    *Result
	err  error
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
	s.prune(r.ID + ".json")
	return path, nil
}

// prune deletes the earliest arrivals (by the files' modification time,
// which Save sets, never by the ID or started_at a client chose: an upload
// dated 2999 must not outlive every genuine result) while more than
// MaxResults files, MaxBytes or maxStoreValues values are stored; keep,
// the file just saved, is never deleted. Failures are logged: a full store
// must not fail the run that was just stored.
func (s *Store) prune(keep string) {
	if s.MaxResults <= 0 && s.MaxBytes <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	files, err := s.storedFiles()
	if err != nil {
		s.logger().Warn("bench store not pruned", "dir", s.Dir, "err", err)
		return
	}
	var total int64
	values := 0
	for _, f := range files {
		total += f.size
		values += f.values
	}
	over := func(n int) bool {
		return s.MaxResults > 0 && n > s.MaxResults || s.MaxBytes > 0 && total > s.MaxBytes || values > maxStoreValues
	}
	n := len(files)
	for _, f := range files {
		if !over(n) {
			break
		}
		if f.name == keep {
			continue
		}
		path := filepath.Join(s.Dir, f.name)
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			s.logger().Warn("bench result not pruned", "file", path, "err", err)
			continue
		}
		n--
		total -= f.size
		values -= f.values
		delete(s.cache, f.name)
		delete(s.counts, f.name)
		s.logger().Info("bench result pruned (bench.max_results / bench.max_bytes)", "file", path, "bytes", f.size)
	}
}

// storedFile is one result file as prune sees it.
type storedFile struct {
	name   string
	size   int64
	mod    time.Time
	values int
}

// storedFiles lists the result files, earliest arrival first (ties by
// name), with their values counted once per size and modification time.
// Called with s.mu held.
func (s *Store) storedFiles() ([]storedFile, error) {
	entries, err := os.ReadDir(s.Dir)
	if err != nil {
		return nil, err
	}
	if s.counts == nil {
		s.counts = map[string]storedFile{}
	}
	var files []storedFile
	for _, e := range entries {
		if !resultFile(e) {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue // deleted meanwhile
		}
		f := storedFile{name: e.Name(), size: info.Size(), mod: info.ModTime()}
		if c, ok := s.counts[f.name]; ok && c.size == f.size && c.mod.Equal(f.mod) {
			f.values = c.values
		} else if data, err := os.ReadFile(filepath.Join(s.Dir, f.name)); err == nil {
			f.values = countValues(data)
		}
		s.counts[f.name] = f
		files = append(files, f)
	}
	slices.SortStableFunc(files, func(a, b storedFile) int {
		if c := a.mod.Compare(b.mod); c != 0 {
			return c
		}
		return strings.Compare(a.name, b.name)
	})
	return files, nil
}

// resultFile reports whether a directory entry is a stored result (not a
// directory, not a hidden or temporary file).
func resultFile(e fs.DirEntry) bool {
	name := e.Name()
	return !e.IsDir() && strings.HasSuffix(name, ".json") && !strings.HasPrefix(name, ".")
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
// newer-schema files are skipped: each is logged (once, when read) and
// returned as a Warning naming the file, so one bad file never hides the
// others. The error is only for a store directory that cannot be read; a
// missing one is an empty store. A file is parsed only when it is new or
// changed since the last List; the results are shared between callers,
// who must not modify them.
func (s *Store) List() ([]*Result, []Warning, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	entries, err := os.ReadDir(s.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		s.cache = nil
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("list bench results in %s: %w", s.Dir, err)
	}
	if s.cache == nil {
		s.cache = map[string]cachedResult{}
	}
	seen := make(map[string]bool, len(entries))
	var out []*Result
	var warns []Warning
	for _, e := range entries {
		if !resultFile(e) {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue // deleted since ReadDir
		}
		name, path := e.Name(), filepath.Join(s.Dir, e.Name())
		seen[name] = true
		c, ok := s.cache[name]
		if !ok || c.size != info.Size() || !c.mod.Equal(info.ModTime()) {
			c = cachedResult{size: info.Size(), mod: info.ModTime()}
			if c.r, c.err = readResult(path); c.err != nil {
				s.logger().Warn("skipping unreadable bench result", "file", path, "err", c.err)
			}
			s.cache[name] = c
		}
		if c.err != nil {
			warns = append(warns, Warning{File: path, Reason: c.err.Error()})
			continue
		}
		out = append(out, c.r)
	}
	for name := range s.cache {
		if !seen[name] {
			delete(s.cache, name)
		}
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

// ParseResult decodes a stored result and checks its size in values
// (MaxResultValues, before decoding), schema version and ID, so that a
// stray, damaged or inflated JSON file is refused with a reason.
func ParseResult(data []byte) (*Result, error) {
	if err := checkValues(data); err != nil {
		return nil, err
	}
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
