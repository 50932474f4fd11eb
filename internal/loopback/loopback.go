// Package loopback answers, one way for the whole daemon, the questions
// about "this machine only" addresses. It is a leaf (standard library
// only) so that config, the front door, triage and package main can share
// it.
//
// There are four different questions, and they have different answers
// for a wildcard host (0.0.0.0, ::, or the empty host of ":8080") or a
// name under .localhost:
//
//   - IsHost: does a host name or address a client uses name this machine
//     only? A wildcard is not a host anyone can be reached at, so no.
//     Names under .localhost are (browsers resolve them to loopback).
//   - DialsLoopback: does this machine, dialing a host, stay on itself
//     whatever DNS answers, so that a secret may go there without TLS?
//     Only a loopback IP literal or localhost: a name under .localhost is
//     looked up like any other name by resolvers that do not special-case
//     it, and DNS may answer it with any address.
//   - ListensOnly: does a listen address accept local clients only? A
//     wildcard binds every interface, so it accepts clients from the whole
//     network: no. This is the one that decides whether the daemon needs
//     a bearer token.
//   - DialHost: which host does a client on this machine dial to reach a
//     listener? A listener on a wildcard is reached over 127.0.0.1.
package loopback

import (
	"net"
	"net/netip"
	"strings"
)

// IsHost reports whether a host name or address (no port) names this
// machine: localhost, *.localhost, or a loopback IP (127.0.0.0/8, ::1).
// Case, IPv6 brackets and a trailing dot are ignored. A wildcard or empty
// host is not loopback (see the package comment).
func IsHost(host string) bool {
	h := strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if h == "localhost" || strings.HasSuffix(h, ".localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// DialsLoopback reports whether a host (no port, no brackets) that a
// client on this machine dials is this machine whatever DNS answers: a
// loopback IP literal (127.0.0.0/8, ::1) or "localhost" in any case. It
// decides where plain http or IMAP without TLS may carry a secret (the
// bot token, a mailbox password). Unlike IsHost it refuses names under
// .localhost, "localhost." and bracketed addresses.
func DialsLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// ListensOnly reports whether a listen address (host:port) binds loopback
// only, so that only clients on this machine can connect. A wildcard or
// empty host binds every interface and is therefore not loopback; an
// address that is not host:port is not loopback either.
func ListensOnly(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil || IsWildcard(host) {
		return false
	}
	return IsHost(host)
}

// IsWildcard reports whether a listen host (no port, brackets allowed)
// binds every interface: the empty host or an unspecified address
// (0.0.0.0, ::, and other spellings of them).
func IsWildcard(host string) bool {
	if host == "" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsUnspecified()
}

// DialHost is the host a client on this machine dials to reach a listener
// bound to host: 127.0.0.1 for a wildcard (IsWildcard), host itself
// otherwise.
func DialHost(host string) string {
	if IsWildcard(host) {
		return "127.0.0.1"
	}
	return host
}

// IsAddr reports whether a client's parsed address is loopback
// (127.0.0.0/8, ::1, or 127.x written as an IPv4-mapped IPv6 address).
func IsAddr(a netip.Addr) bool { return a.Unmap().IsLoopback() }
