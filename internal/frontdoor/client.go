package frontdoor

import (
	"net"
	"net/netip"

	"gpuhost/internal/loopback"
)

// LoopbackClient is the client key of every loopback peer.
const LoopbackClient = "loopback"

// ClientKey is the client a peer address counts as in the per-client caps
// (connections, streams): its IP, except that every loopback address
// (127.0.0.0/8, ::1, and 127/8 mapped into IPv6) is one client. Any local
// user may bind any 127.x.y.z, so counting loopback per address let one of
// them hold 16 streams from each of 65 addresses; as one client, the local
// users share one allowance (a per-user answer would need the peer's uid,
// which a TCP socket does not carry).
func ClientKey(remote string) string {
	host := remote
	if h, _, err := net.SplitHostPort(remote); err == nil {
		host = h
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	a = a.Unmap()
	if loopback.IsAddr(a) {
		return LoopbackClient
	}
	return a.WithZone("").String()
}
