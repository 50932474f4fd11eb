package ollamatest

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"gpuhost/internal/testkit"
)

func TestBuildLogCounts(t *testing.T) {
	b := &buildLog{}
	// Written in pieces that split lines, as a pipe delivers them.
	for _, chunk := range []string{
		"go: downloading github.com/gin-gonic/gin v1.10.0\ngo: down", "loading golang.org/x/sys v0.37.0\n",
		"github.com/ollama/ollama/fs/ggml\n# github.com/ollama/ollama/llama\nwarning: unused variable\n",
		"github.com/ollama/ollama/llama\ngithub.com/ollama/ollama/ml/back", "end\n", "\n",
	} {
		if n, err := b.Write([]byte(chunk)); n != len(chunk) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	pkgs, downloads, last := b.progress()
	if pkgs != 3 || downloads != 2 || last != "github.com/ollama/ollama/ml/backend" {
		t.Errorf("progress = %d packages, %d downloads, last %q; want 3, 2, github.com/ollama/ollama/ml/backend", pkgs, downloads, last)
	}
	if !strings.Contains(b.String(), "warning: unused variable") {
		t.Errorf("the log lost the compiler's output: %q", b.String())
	}
}

// TestEnsureProgressWaitsForAnotherBuild: while another process holds the
// build lock, EnsureProgress says that it waits (CI printed nothing for many
// minutes), then uses the binary that process built instead of building.
func TestEnsureProgressWaitsForAnotherBuild(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	t.Setenv("GPUHOST_OLLAMA_BIN", "")
	path, err := CachePath()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	lock, err := os.OpenFile(filepath.Join(filepath.Dir(path), ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	progress := &testkit.SyncBuffer{}
	type result struct {
		path string
		skip bool
		err  error
	}
	done := make(chan result, 1)
	go func() {
		p, skip, err := EnsureProgress(progress)
		done <- result{p, skip, err}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(progress.String(), "another process is building ollama") {
		select {
		case r := <-done:
			t.Fatalf("EnsureProgress returned while the lock was held: %+v (progress %q)", r, progress.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no waiting message while the lock was held; progress %q", progress.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The other process finishes its build and lets go.
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil || r.path != path {
			t.Fatalf("EnsureProgress = %+v, want %s", r, path)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("EnsureProgress did not return after the lock was released")
	}
	if strings.Contains(progress.String(), "compiling") {
		t.Errorf("it built although the other process had: %q", progress.String())
	}
}
