package systemd

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestConnectPrivateMissingSocket(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "private")
	_, err := ConnectPrivate(context.Background(), socket)
	if err == nil {
		t.Fatal("connected to a missing socket")
	}
	if !strings.HasPrefix(err.Error(), "connect to systemd at "+socket+": ") || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("error %q: want it to name the socket and wrap ENOENT", err)
	}
	if _, err := ConnectPrivate(context.Background(), ""); err == nil {
		t.Error("empty socket path accepted")
	}
}

// serve runs a real unix socket server that hands each connection to handle.
func serve(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	// Unix socket paths are limited to 108 bytes; t.TempDir can be longer.
	dir, err := os.MkdirTemp("", "gpuhost-sd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	socket := filepath.Join(dir, "s")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go handle(c)
		}
	}()
	return socket
}

func TestConnectPrivateSilentPeerTimesOut(t *testing.T) {
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	socket := serve(t, func(c net.Conn) { <-hold; c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := ConnectPrivate(ctx, socket)
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), socket) {
		t.Errorf("err = %v, want a deadline error naming %s", err, socket)
	}
}

func TestConnectPrivatePeerHangsUp(t *testing.T) {
	socket := serve(t, func(c net.Conn) { c.Close() })
	_, err := ConnectPrivate(context.Background(), socket)
	if err == nil || !strings.Contains(err.Error(), "connect to systemd at "+socket) {
		t.Errorf("err = %v", err)
	}
}

// TestConnectSystem checks the error when there is no system bus, and that a
// real one (CI hosts run systemd) answers a read-only call.
func TestConnectSystem(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := ConnectSystem(ctx)
	if _, statErr := os.Stat("/run/dbus/system_bus_socket"); statErr != nil {
		if err == nil || !strings.Contains(err.Error(), "connect to systemd at the system bus") {
			t.Errorf("no system bus here, got err %v", err)
		}
		return
	}
	if err != nil {
		t.Skipf("system bus present but systemd not reachable on it: %v", err)
	}
	defer m.Close()
	st, err := m.Unit(ctx, "init.scope")
	if err != nil || st.ActiveState != "active" {
		t.Errorf("init.scope on the host: %+v, %v", st, err)
	}
	// On a bus, Subscribe adds match rules and calls Manager.Subscribe.
	subCtx, stop := context.WithCancel(ctx)
	events, err := m.Subscribe(subCtx, "init.scope")
	if err != nil {
		t.Fatal(err)
	}
	if ev := <-events; ev.Unit != "init.scope" || ev.ActiveState != "active" {
		t.Errorf("initial event %+v", ev)
	}
	stop()
	for range events {
	}
}

// TestConnectPrivateSilentAfterHandshake: a peer that completes the D-Bus
// handshake and then never answers a call must not hang ConnectPrivate.
func TestConnectPrivateSilentAfterHandshake(t *testing.T) {
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	socket := serve(t, func(c net.Conn) {
		defer c.Close()
		r := bufio.NewReader(c)
		if b, err := r.ReadByte(); err != nil || b != 0 {
			return
		}
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			switch {
			case strings.TrimSpace(line) == "AUTH":
				c.Write([]byte("REJECTED EXTERNAL\r\n"))
			case strings.HasPrefix(line, "AUTH EXTERNAL"):
				c.Write([]byte("OK 0123456789abcdef0123456789abcdef\r\n"))
			case strings.HasPrefix(line, "NEGOTIATE_UNIX_FD"):
				c.Write([]byte("AGREE_UNIX_FD\r\n"))
			case strings.HasPrefix(line, "BEGIN"):
				<-hold // authenticated; now say nothing
				return
			default:
				c.Write([]byte("ERROR\r\n"))
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := ConnectPrivate(ctx, socket)
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), socket) {
		t.Errorf("err = %v, want a deadline error naming %s", err, socket)
	}
}
