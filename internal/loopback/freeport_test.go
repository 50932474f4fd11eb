package loopback

import (
	"fmt"
	"os"
	"testing"
)

// TestFreePortAvoidsTheEphemeralRange: the ports handed out lie outside
// the range the kernel draws outgoing connections' source ports from,
// and one process never gets the same port twice.
func TestFreePortAvoidsTheEphemeralRange(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Skipf("no ephemeral range to compare with: %v", err)
	}
	var elo, ehi int
	if _, err := fmt.Sscan(string(b), &elo, &ehi); err != nil {
		t.Fatalf("parse %q: %v", b, err)
	}
	seen := map[int]bool{}
	for range 200 {
		p, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if p >= elo && p <= ehi {
			t.Fatalf("port %d lies in the ephemeral range %d-%d", p, elo, ehi)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
	}
}
