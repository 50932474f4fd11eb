// Package testkit holds the small helpers every package's tests need, so
// each is written once: a log buffer safe for concurrent use, a free
// loopback port, polling for a condition within a budget, and a settable
// clock. It is a leaf: the standard library and testing only.
package testkit

import (
	"bytes"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
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
// will bind (a daemon under systemd, a child). Nothing listens on it when
// FreePort returns, so the port must not be one the kernel hands out on
// its own meanwhile: a port from the ephemeral range (what ":0" gives)
// goes back into the pool the kernel draws outgoing connections' source
// ports from, and under load — many short connections on the box — one of
// them took such a port before the daemon bound it (the daemon exited
// with "address already in use"). So the port is drawn at random below
// the ephemeral range, where only explicit binds land, and never handed
// out twice by one test process.
func FreePort(t testing.TB) int {
	t.Helper()
	lo, hi := freePortRange()
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 1000 {
		p := lo + rand.IntN(hi-lo)
		if handedOut[p] {
			continue
		}
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		ln.Close()
		handedOut[p] = true
		return p
	}
	t.Fatalf("find a free loopback port in %d-%d: 1000 tries, all taken", lo, hi-1)
	return 0
}

var (
	portsMu   sync.Mutex
	handedOut = map[int]bool{}
)

// freePortRange is [lo, hi): from 20000 up to where the kernel's
// ephemeral range starts (net.ipv4.ip_local_port_range, 32768 by
// default), or 10000 ports above it when the ephemeral range starts too
// low to leave room below.
func freePortRange() (lo, hi int) {
	ephemeralLo, ephemeralHi := 32768, 60999
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if a, err := strconv.Atoi(f[0]); err == nil {
				ephemeralLo = a
			}
			if b, err := strconv.Atoi(f[1]); err == nil {
				ephemeralHi = b
			}
		}
	}
	if ephemeralLo-20000 >= 2000 {
		return 20000, ephemeralLo
	}
	if ephemeralHi+1+10000 <= 65536 {
		return ephemeralHi + 1, ephemeralHi + 1 + 10000
	}
	return 20000, 30000 // no room outside: still better than ":0"
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
