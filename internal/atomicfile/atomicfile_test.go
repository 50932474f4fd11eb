package atomicfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestWriteReplacesAndLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "sub", "state.json")
	for _, content := range []string{"first", "second, longer content"} {
		if err := Write(p, []byte(content), 0o640); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p)
		if err != nil || string(got) != content {
			t.Fatalf("read back %q, %v; want %q", got, err, content)
		}
	}
	st, _ := os.Stat(p)
	if st.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want 0640", st.Mode().Perm())
	}
	entries, _ := os.ReadDir(filepath.Dir(p))
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only the file (no temp files left)", len(entries))
	}
}

func TestWriteFailureKeepsOldContent(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := Write(p, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A directory in the way of the rename makes the write fail.
	bad := filepath.Join(dir, "isdir")
	if err := os.MkdirAll(filepath.Join(bad, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Write(bad, []byte("new"), 0o644); err == nil {
		t.Fatal("want an error when the target is a non-empty directory")
	}
	got, _ := os.ReadFile(p)
	if string(got) != "old" {
		t.Fatalf("unrelated file changed: %q", got)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.Name() != "f" && e.Name() != "isdir" {
			t.Errorf("left behind %s", e.Name())
		}
	}
}

func TestWriteWithTempPattern(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "1.json")
	if err := WriteWith(p, []byte("x"), 0o600, Options{TempPattern: ".claim-*"}); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(p); err != nil || string(got) != "x" {
		t.Fatalf("read back %q, %v", got, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only the file", len(entries))
	}
	// The pattern is the one os.CreateTemp gets: a separator in it fails.
	if err := WriteWith(p, []byte("y"), 0o600, Options{TempPattern: "sub/x-*"}); err == nil {
		t.Error("want an error for a temp pattern with a path separator")
	}
	if got, _ := os.ReadFile(p); string(got) != "x" {
		t.Errorf("failed write changed the file: %q", got)
	}
}

// TestNoReplaceKeepsTheFirst: a backup written with NoReplace never
// clobbers one already there, and leaves no temp file behind.
func TestNoReplaceKeepsTheFirst(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f.bak")
	if err := WriteWith(p, []byte("first"), 0o600, Options{NoReplace: true}); err != nil {
		t.Fatal(err)
	}
	err := WriteWith(p, []byte("second"), 0o600, Options{NoReplace: true})
	if !errors.Is(err, fs.ErrExist) {
		t.Errorf("second write = %v, want fs.ErrExist", err)
	}
	if got, _ := os.ReadFile(p); string(got) != "first" {
		t.Errorf("content %q, want the first", got)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("directory holds %d entries, want 1", len(entries))
	}
}

// TestOwnerIsSet: Owner chowns the file (as root, to another user).
func TestOwnerIsSet(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown to another user needs root")
	}
	p := filepath.Join(t.TempDir(), "f")
	if err := WriteWith(p, []byte("x"), 0o644, Options{Owner: &Owner{UID: 65534, GID: 65534}}); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if sys := st.Sys().(*syscall.Stat_t); sys.Uid != 65534 || sys.Gid != 65534 {
		t.Errorf("owner %d:%d, want 65534:65534", sys.Uid, sys.Gid)
	}
}
