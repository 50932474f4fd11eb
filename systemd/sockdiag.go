package systemd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
)

// Reading /proc/net/tcp makes the kernel walk its whole TCP hash table
// (milliseconds on a big box, whatever the number of sockets), so the
// listeners on a port are asked for over NETLINK_SOCK_DIAG first, which
// walks only the listening sockets; /proc/net/tcp{,6} is the fallback.

const (
	netlinkSockDiag   = 4  // NETLINK_SOCK_DIAG
	sockDiagByFamily  = 20 // SOCK_DIAG_BY_FAMILY
	inetDiagReqV2Len  = 56 // sizeof(struct inet_diag_req_v2)
	inetDiagMsgLen    = 72 // sizeof(struct inet_diag_msg)
	tcpListenStateBit = 1 << TCPListen
)

// listenersDiag returns the listening TCP sockets on port, IPv4 and IPv6,
// from the kernel's sock_diag interface.
func listenersDiag(port int) ([]Socket, error) {
	fd, err := syscall.Socket(syscall.AF_NETLINK, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, netlinkSockDiag)
	if err != nil {
		return nil, fmt.Errorf("open sock_diag netlink socket: %w", err)
	}
	defer syscall.Close(fd)
	var out []Socket
	for _, family := range []uint8{syscall.AF_INET, syscall.AF_INET6} {
		socks, err := dumpListeners(fd, family)
		if err != nil {
			return nil, err
		}
		for _, s := range socks {
			if int(s.Local.Port()) == port {
				out = append(out, s)
			}
		}
	}
	return out, nil
}

func dumpListeners(fd int, family uint8) ([]Socket, error) {
	req := make([]byte, syscall.NLMSG_HDRLEN+inetDiagReqV2Len)
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:], sockDiagByFamily)
	binary.NativeEndian.PutUint16(req[6:], syscall.NLM_F_REQUEST|syscall.NLM_F_DUMP)
	binary.NativeEndian.PutUint32(req[8:], 1)
	r := req[syscall.NLMSG_HDRLEN:]
	r[0], r[1] = family, syscall.IPPROTO_TCP
	binary.NativeEndian.PutUint32(r[4:], tcpListenStateBit)
	if err := syscall.Sendto(fd, req, 0, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("sock_diag request: %w", err)
	}
	var out []Socket
	buf := make([]byte, 64<<10)
	for {
		n, _, err := syscall.Recvfrom(fd, buf, 0)
		if err != nil {
			return nil, fmt.Errorf("sock_diag reply: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return nil, fmt.Errorf("sock_diag reply: %w", err)
		}
		for _, m := range msgs {
			switch m.Header.Type {
			case syscall.NLMSG_DONE:
				return out, nil
			case syscall.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if errno := int32(binary.NativeEndian.Uint32(m.Data)); errno != 0 {
						return nil, fmt.Errorf("sock_diag: %w", syscall.Errno(-errno))
					}
				}
				return nil, errors.New("sock_diag: error reply")
			}
			s, err := parseInetDiagMsg(m.Data)
			if err != nil {
				return nil, err
			}
			out = append(out, s)
		}
	}
}

// parseInetDiagMsg reads a struct inet_diag_msg.
func parseInetDiagMsg(d []byte) (Socket, error) {
	if len(d) < inetDiagMsgLen {
		return Socket{}, fmt.Errorf("sock_diag: message of %d bytes, want %d", len(d), inetDiagMsgLen)
	}
	family, state := d[0], d[1]
	id := d[4:52]
	port := binary.BigEndian.Uint16(id[0:2])
	var addr netip.Addr
	if family == syscall.AF_INET {
		addr = netip.AddrFrom4([4]byte(id[4:8]))
	} else {
		addr = netip.AddrFrom16([16]byte(id[4:20]))
	}
	uid := binary.NativeEndian.Uint32(d[64:68])
	inode := binary.NativeEndian.Uint32(d[68:72])
	return Socket{Local: netip.AddrPortFrom(addr, port), State: state, UID: int(uid), Inode: uint64(inode)}, nil
}
