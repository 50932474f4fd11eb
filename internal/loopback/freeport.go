package loopback

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// FreePort finds an unused loopback port for a server another process
// will bind (a simulator the demo starts, a daemon under a test's
// systemd). Nothing listens on it when FreePort returns, so the port must
// not be one the kernel hands out on its own meanwhile: a port from the
// ephemeral range (what ":0" gives) goes back into the pool the kernel
// draws outgoing connections' source ports from, and on a busy box one of
// them can take it before the server binds it (the server then exits with
// "address already in use"). So the port is drawn at random below the
// ephemeral range, where only explicit binds land, and never handed out
// twice by one process.
func FreePort() (int, error) {
	lo, hi := portRange()
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
		return p, nil
	}
	return 0, fmt.Errorf("find a free loopback port in %d-%d: 1000 tries, all taken", lo, hi-1)
}

var (
	portsMu   sync.Mutex
	handedOut = map[int]bool{}
	// portRange reads the kernel's range once per process.
	portRange = sync.OnceValues(freePortRange)
)

// freePortRange is [lo, hi): from 20000 up to where the kernel's
// ephemeral range starts (net.ipv4.ip_local_port_range, 32768 by
// default), or 10000 ports above it when it starts too low to leave room
// below.
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
	switch {
	case ephemeralLo-20000 >= 2000:
		return 20000, ephemeralLo
	case ephemeralHi+1+10000 <= 65536:
		return ephemeralHi + 1, ephemeralHi + 1 + 10000
	default:
		return 20000, 30000 // no room outside: still better than ":0"
	}
}
