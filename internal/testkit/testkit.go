// Package testkit holds the small helpers every package's tests need, so
// each is written once: a log buffer safe for concurrent use, a free
// loopback port, polling for a condition within a budget, and a settable
// clock. It is a leaf: the standard library and testing only.
package testkit

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gpuhost/internal/loopback"
)

// SyncBuffer is a bytes.Buffer safe for concurrent writers and readers:
// a logger writing from server goroutines while the test reads the log.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// FreePort finds an unused loopback port for a server another process
// will bind (a daemon under systemd, a child): loopback.FreePort, which
// draws it outside the kernel's ephemeral range, failing the test when
// none is found.
func FreePort(t testing.TB) int {
	t.Helper()
	p, err := loopback.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// FreeAddr is FreePort as a "127.0.0.1:port" address.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return "127.0.0.1:" + strconv.Itoa(FreePort(t))
}

// Polling starts at pollMin between tries and doubles up to pollMax.
const (
	pollMin = time.Millisecond
	pollMax = 50 * time.Millisecond
)

// Poll calls cond until it returns true or budget has passed, sleeping
// between tries with a backoff from 1 ms up to 50 ms, and reports whether
// cond held. cond is tried at least once, and once more when the budget
// runs out. For callers that want their own failure message (with the
// last state they saw); Eventually is the common case.
func Poll(budget time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(budget)
	wait := pollMin
	for {
		if cond() {
			return true
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		time.Sleep(min(wait, left))
		wait = min(2*wait, pollMax)
	}
}

// Eventually fails the test unless cond holds within budget (see Poll).
// The budget is a generous bound for something that happens
// asynchronously, not a speed check: keep it well above the usual time.
func Eventually(t testing.TB, budget time.Duration, cond func() bool, msg string) {
	t.Helper()
	if !Poll(budget, cond) {
		t.Fatalf("timed out after %v waiting for %s", budget, msg)
	}
}

// Clock is a settable clock for code that takes a now func (or a Now
// method): it moves only when the test says so. Safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock that reads start until it is moved.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now is the clock's current time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// After moves the clock forward by d and returns a channel that already
// holds the new time: a sleep of d that costs no wall time.
func (c *Clock) After(d time.Duration) <-chan time.Time {
	c.Advance(d)
	ch := make(chan time.Time, 1)
	ch <- c.Now()
	return ch
}

// StartSleeper starts a real `sleep 300` child for tests that need a live
// process of their own (GPU claims, process names); it is killed and reaped at
// the end of the test unless the test did. It returns once /proc/<pid>/comm
// says "sleep", i.e. once exec has happened, so the name is never the parent's.
func StartSleeper(t testing.TB) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Fatalf("start sleep: %v", err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	comm := "/proc/" + strconv.Itoa(cmd.Process.Pid) + "/comm"
	Eventually(t, 10*time.Second, func() bool {
		b, err := os.ReadFile(comm)
		return err == nil && strings.TrimSpace(string(b)) == "sleep"
	}, "child to exec sleep")
	return cmd
}
