package testkit

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestSyncBufferConcurrent(t *testing.T) {
	var b SyncBuffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				fmt.Fprint(&b, "x")
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if n := len(b.String()); n != 800 {
		t.Fatalf("%d bytes, want 800", n)
	}
}

func TestFreePortIsBindable(t *testing.T) {
	port := FreePort(t)
	if port <= 0 || port > 65535 {
		t.Fatalf("port %d", port)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatalf("the free port %d cannot be bound: %v", port, err)
	}
	ln.Close()
	if addr := FreeAddr(t); !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Errorf("FreeAddr = %q", addr)
	}
}

// fatalT records Fatalf instead of stopping the test.
type fatalT struct {
	testing.TB
	msg string
}

func (f *fatalT) Helper() {}
func (f *fatalT) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
}

func TestPollAndEventually(t *testing.T) {
	var n atomic.Int32
	if !Poll(10*time.Second, func() bool { return n.Add(1) >= 5 }) {
		t.Fatal("Poll gave up on a condition that holds on the 5th try")
	}
	if n.Load() != 5 {
		t.Errorf("cond tried %d times, want 5", n.Load())
	}

	// A condition that never holds: tried more than once, and once more at
	// the end of the budget.
	n.Store(0)
	if Poll(30*time.Millisecond, func() bool { n.Add(1); return false }) {
		t.Fatal("Poll reported a condition that never holds")
	}
	if n.Load() < 3 {
		t.Errorf("cond tried %d times within 30 ms, want several", n.Load())
	}
	n.Store(0)
	if Poll(0, func() bool { n.Add(1); return false }) || n.Load() != 1 {
		t.Errorf("zero budget: cond tried %d times, want exactly once", n.Load())
	}

	ft := &fatalT{}
	Eventually(ft, 20*time.Millisecond, func() bool { return false }, "the moon")
	if !strings.Contains(ft.msg, "timed out after 20ms waiting for the moon") {
		t.Errorf("failure message %q", ft.msg)
	}
	ft = &fatalT{}
	Eventually(ft, time.Second, func() bool { return true }, "now")
	if ft.msg != "" {
		t.Errorf("Eventually failed on a condition that holds: %q", ft.msg)
	}
}

func TestClock(t *testing.T) {
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	c := NewClock(start)
	if !c.Now().Equal(start) {
		t.Fatalf("Now = %v", c.Now())
	}
	c.Advance(time.Minute)
	if got := c.Now().Sub(start); got != time.Minute {
		t.Fatalf("after Advance(1m): %v past start", got)
	}
	select {
	case at := <-c.After(time.Hour):
		if want := start.Add(time.Hour + time.Minute); !at.Equal(want) || !c.Now().Equal(want) {
			t.Fatalf("After(1h) fired at %v, Now %v; want %v", at, c.Now(), want)
		}
	default:
		t.Fatal("After did not fire at once")
	}
}
