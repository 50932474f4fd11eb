// Package atomicfile writes files so that a reader or a crash never sees a
// half-written one: temp file in the same directory, fsync, rename, fsync dir.
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
)

// Write replaces path with data atomically, creating parent directories.
func Write(path string, data []byte, perm os.FileMode) error {
	return WriteWith(path, data, perm, Options{})
}

// Options adjust WriteWith.
type Options struct {
	// TempPattern is the os.CreateTemp pattern of the temp file, created in
	// path's directory; default "."+base(path)+".tmp-*". A reader that
	// scans the directory can use its own pattern to recognise (skip, or
	// clean up after a killed writer) files still being written.
	TempPattern string
	// Owner, when set, is the file's owner and group (chown of the temp
	// file before the rename), so that a file rewritten by root keeps the
	// user who owned it.
	Owner *Owner
	// NoReplace fails with an error wrapping fs.ErrExist instead of
	// replacing a file already at path (the temp file is hard-linked into
	// place, which never overwrites): for backups that must not clobber
	// an earlier one.
	NoReplace bool
}

// Owner is a numeric user and group.
type Owner struct{ UID, GID int }

// WriteWith is Write with options; the semantics are the same (temp file
// in the same directory, fsync, rename, best-effort fsync of the
// directory).
func WriteWith(path string, data []byte, perm os.FileMode, o Options) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write %s: create directory: %w", path, err)
	}
	pattern := o.TempPattern
	if pattern == "" {
		pattern = "." + filepath.Base(path) + ".tmp-*"
	}
	tmp, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	name := tmp.Name()
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(name)
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if o.Owner != nil {
		if err := tmp.Chown(o.Owner.UID, o.Owner.GID); err != nil {
			return fmt.Errorf("write %s: chown: %w", path, err)
		}
	}
	if err := tmp.Chmod(perm); err != nil {
		return fmt.Errorf("write %s: chmod: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("write %s: fsync: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: close: %w", path, err)
	}
	if o.NoReplace {
		if err := os.Link(name, path); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
		os.Remove(name)
	} else if err := os.Rename(name, path); err != nil {
		return fmt.Errorf("write %s: rename: %w", path, err)
	}
	ok = true
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync() // make the rename durable; best effort on filesystems without dir fsync
		d.Close()
	}
	return nil
}
