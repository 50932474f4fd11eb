// Package systemd controls systemd units over D-Bus: start and stop with the
// job's result, unit properties, change events, daemon-reload, linking and
// enabling unit files; plus the journal tail of a unit and the command line
// of a process.
//
// systemd is the source of truth for what runs on the box (docs/design.md), so the
// Manager reports what systemd says and never keeps its own copy of unit
// state. It speaks to systemd either over the system bus or directly over
// systemd's private socket (/run/systemd/private), which works without a
// D-Bus daemon and is what the test harness (package systemdtest) uses.
package systemd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"

	"gpuhost/api"
)

// CallTimeout bounds every single D-Bus method call, whatever the caller's
// context allows: systemd answers method calls in milliseconds, so a call
// that takes longer means a wedged manager or bus, and the caller should hear
// about it rather than hang. Waiting for a job's result (Start, Stop) is not
// a method call; the caller's context bounds it.
const CallTimeout = 30 * time.Second

// Manager is a connection to one systemd manager. It is safe for concurrent
// use. Close it when done.
type Manager struct {
	conn *sddbus.Conn
	// sig is a connection of our own for unit change signals, so that any
	// number of Subscribe calls can listen independently.
	sig *godbus.Conn
	// where names the endpoint in errors: "the system bus" or the socket.
	where string
	// bus is true on the system bus, where signals need match rules and a
	// Manager.Subscribe call; the private socket sends every signal.
	bus bool

	subscribeMu sync.Mutex
	subscribed  bool
}

// Connect is the one rule for reaching the configured systemd
// (systemd.socket): the system bus when socket is "", else its private
// socket. The daemon's units and `gpuhost units install` both connect
// through it.
func Connect(ctx context.Context, socket string) (*Manager, error) {
	if socket == "" {
		return ConnectSystem(ctx)
	}
	return ConnectPrivate(ctx, socket)
}

// ConnectSystem connects to systemd over the system bus (the normal way for
// the gpuhost daemon). ctx bounds connecting, not the connection's life.
func ConnectSystem(ctx context.Context) (*Manager, error) {
	const where = "the system bus"
	dial := func(ctx context.Context) (*godbus.Conn, error) {
		conn, err := godbus.SystemBusPrivate()
		if err != nil {
			return nil, err
		}
		if err := authenticate(ctx, conn, true); err != nil {
			return nil, err
		}
		return conn, nil
	}
	return connect(ctx, where, true, dial)
}

// ConnectPrivate connects to systemd directly over its private socket (such
// as /run/systemd/private): EXTERNAL authentication with our uid, no Hello,
// no D-Bus daemon involved. The socket only accepts peers that systemd can
// see, i.e. processes in its PID namespace, running as root. ctx bounds
// connecting, not the connection's life.
func ConnectPrivate(ctx context.Context, socket string) (*Manager, error) {
	if socket == "" {
		return nil, errors.New("connect to systemd: empty socket path")
	}
	dial := func(ctx context.Context) (*godbus.Conn, error) {
		conn, err := godbus.Dial("unix:path=" + godbus.EscapeBusAddressValue(socket))
		if err != nil {
			return nil, err
		}
		if err := authenticate(ctx, conn, false); err != nil {
			return nil, err
		}
		return conn, nil
	}
	return connect(ctx, socket, false, dial)
}

func connect(ctx context.Context, where string, bus bool, dial func(context.Context) (*godbus.Conn, error)) (*Manager, error) {
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	wrap := func(err error) error {
		if !bus && (errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) || errors.Is(err, syscall.EPIPE)) {
			err = fmt.Errorf("%w (systemd drops private-socket peers that are outside its PID namespace or not root)", err)
		}
		return fmt.Errorf("connect to systemd at %s: %w", where, err)
	}

	// go-systemd's NewConnection makes a D-Bus call (AddMatch) without a
	// deadline; closing the connections it dialled is what ends that call
	// if ctx ends first.
	var (
		mu     sync.Mutex
		dialed []*godbus.Conn
	)
	type result struct {
		conn *sddbus.Conn
		err  error
	}
	done := make(chan result, 1)
	go func() {
		conn, err := sddbus.NewConnection(func() (*godbus.Conn, error) {
			c, err := dial(ctx)
			if err == nil {
				mu.Lock()
				dialed = append(dialed, c)
				mu.Unlock()
			}
			return c, err
		})
		done <- result{conn, err}
	}()
	var conn *sddbus.Conn
	select {
	case r := <-done:
		if r.err != nil {
			return nil, wrap(r.err)
		}
		conn = r.conn
	case <-ctx.Done():
		mu.Lock()
		for _, c := range dialed {
			c.Close()
		}
		mu.Unlock()
		if r := <-done; r.conn != nil {
			r.conn.Close()
		}
		return nil, wrap(ctx.Err())
	}
	sig, err := dial(ctx)
	if err != nil {
		conn.Close()
		return nil, wrap(err)
	}
	m := &Manager{conn: conn, sig: sig, where: where, bus: bus}
	// A first call proves that the peer is a systemd that talks to us (the
	// private socket drops peers it cannot see, during or right after the
	// handshake).
	if _, err := m.conn.SystemStateContext(ctx); err != nil {
		m.Close()
		return nil, wrap(fmt.Errorf("read SystemState: %w", err))
	}
	return m, nil
}

// authenticate runs the D-Bus handshake (EXTERNAL with our uid, then Hello
// on a bus) within ctx: godbus's handshake has no deadline of its own.
func authenticate(ctx context.Context, conn *godbus.Conn, hello bool) error {
	done := make(chan error, 1)
	go func() {
		err := conn.Auth([]godbus.Auth{godbus.AuthExternal(strconv.Itoa(os.Getuid()))})
		if err == nil && hello {
			err = conn.Hello()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			conn.Close()
			return fmt.Errorf("authenticate: %w", err)
		}
		return nil
	case <-ctx.Done():
		conn.Close() // unblocks the handshake
		<-done
		return fmt.Errorf("authenticate: %w", ctx.Err())
	}
}

// Close ends the connection. Subscriptions end and their channels close.
func (m *Manager) Close() {
	m.conn.Close()
	m.sig.Close()
}

// JobError is a start or stop job that finished with a result other than
// "done". Result is systemd's job result: "failed", "dependency", "timeout",
// "canceled", "skipped", "invalid", "assert", "unsupported", ...
type JobError struct {
	Unit   string
	Op     string // "start" or "stop"
	Result string
}

func (e *JobError) Error() string {
	msg := fmt.Sprintf("%s unit %s: job finished with result %q", e.Op, e.Unit, e.Result)
	if hint := jobResultHints[e.Result]; hint != "" {
		msg += " (" + strings.ReplaceAll(hint, "UNIT", e.Unit) + ")"
	}
	return msg
}

var jobResultHints = map[string]string{
	"failed":      "the unit failed; see systemctl status UNIT and journalctl -u UNIT",
	"dependency":  "a unit it requires failed",
	"timeout":     "the job timed out",
	"canceled":    "another job replaced or canceled it",
	"skipped":     "the job did not apply to the unit's state",
	"invalid":     "the job type does not apply to this unit",
	"assert":      "an Assert*= setting of the unit failed",
	"unsupported": "the unit type is not supported on this system",
}

// Start starts unit (job mode "replace", so conflicting units are stopped)
// and waits for the job to finish; ctx bounds the wait. A result other than
// "done" is a *JobError. What "done" means depends on the service type:
// Type=simple, forked (MainPID may not have exec'd the program yet);
// Type=exec, the program was exec'd; Type=notify, it sent READY=1.
//
// Conflicts= in a unit makes the start stop the other unit, but only an
// ordering (After= or Before=) between the two makes the start wait until
// the other is fully stopped; without it both run at once for a while.
func (m *Manager) Start(ctx context.Context, unit string) error {
	return m.runJob(ctx, "start", unit, m.conn.StartUnitContext)
}

// Stop stops unit and waits for the job to finish; ctx bounds the wait.
// Stopping an inactive unit, or one systemd has not loaded (unknown or
// garbage-collected), succeeds: afterwards nothing of it runs.
func (m *Manager) Stop(ctx context.Context, unit string) error {
	return m.runJob(ctx, "stop", unit, m.conn.StopUnitContext)
}

// noSuchUnit is systemd's D-Bus error for a unit that is not loaded.
const noSuchUnit = "org.freedesktop.systemd1.NoSuchUnit"

type jobFunc func(ctx context.Context, name, mode string, ch chan<- string) (int, error)

func (m *Manager) runJob(ctx context.Context, op, unit string, call jobFunc) error {
	if err := checkUnitName(unit); err != nil {
		return fmt.Errorf("%s unit %q: %w", op, unit, err)
	}
	// Buffered: go-systemd sends the result while holding its job-table
	// lock, so a result nobody reads (ctx ended) must not block it.
	result := make(chan string, 1)
	callCtx, cancel := context.WithTimeout(ctx, CallTimeout)
	_, err := call(callCtx, unit, "replace", result)
	cancel()
	var dbusErr godbus.Error
	if op == "stop" && errors.As(err, &dbusErr) && dbusErr.Name == noSuchUnit {
		return nil // not loaded: nothing runs, which is what stop wants
	}
	if err != nil {
		return fmt.Errorf("%s unit %s via %s: %w", op, unit, m.where, err)
	}
	select {
	case res := <-result:
		if res != "done" {
			return &JobError{Unit: unit, Op: op, Result: res}
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s unit %s: waiting for the job to finish: %w", op, unit, ctx.Err())
	case <-m.sig.Context().Done():
		return fmt.Errorf("%s unit %s: waiting for the job to finish: connection to systemd at %s lost", op, unit, m.where)
	}
}

// checkUnitName rejects names that cannot be units before they reach D-Bus,
// so that errors say what is wrong; systemd validates the rest.
func checkUnitName(unit string) error {
	switch {
	case unit == "":
		return errors.New("empty unit name")
	case len(unit) > 255:
		return errors.New("unit name longer than 255 bytes")
	case strings.ContainsAny(unit, "/\x00\n"):
		return errors.New("unit name contains '/', NUL or newline")
	case !strings.Contains(unit, "."):
		return errors.New("unit name has no type suffix (such as .service)")
	}
	return nil
}

// Unit reads the unit's state and settings. A unit systemd does not know is
// not an error: its LoadState is "not-found".
func (m *Manager) Unit(ctx context.Context, unit string) (api.UnitStatus, error) {
	if err := checkUnitName(unit); err != nil {
		return api.UnitStatus{}, fmt.Errorf("read properties of unit %q: %w", unit, err)
	}
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	if !strings.HasSuffix(unit, ".service") {
		// An empty interface name returns the properties of every
		// interface (Unit, Socket, ...) in one call.
		props, err := m.conn.GetAllPropertiesContext(ctx, unit)
		if err != nil {
			return api.UnitStatus{}, fmt.Errorf("read properties of unit %s via %s: %w", unit, m.where, err)
		}
		return statusFromProperties(unit, props), nil
	}
	props, err := m.serviceProperties(ctx, unit)
	if err != nil {
		return api.UnitStatus{}, fmt.Errorf("read properties of unit %s via %s: %w", unit, m.where, err)
	}
	return statusFromProperties(unit, props), nil
}

// Of a service, only the properties UnitStatus holds are read, each with
// its own Get, all sent at once on the one connection: every switch reads
// its backend units several times, and PID 1 answers a dozen small Gets
// in about half the time it takes to marshal the 300-odd properties of
// GetAll (which it does while it cannot answer anyone else).
var (
	unitIfaceProps    = []string{"Id", "LoadState", "ActiveState", "SubState", "FragmentPath", "Conflicts", "DropInPaths", "ActiveEnterTimestamp"}
	serviceIfaceProps = []string{"Result", "MainPID", "NRestarts", "ControlGroup", "ExecStart"}
)

func (m *Manager) serviceProperties(ctx context.Context, unit string) (map[string]any, error) {
	type answer struct {
		name string
		val  any
		err  error
	}
	n := len(unitIfaceProps) + len(serviceIfaceProps)
	answers := make(chan answer, n)
	get := func(name string, fn func(context.Context, string, string) (*sddbus.Property, error)) {
		p, err := fn(ctx, unit, name)
		if err != nil {
			answers <- answer{name: name, err: err}
			return
		}
		answers <- answer{name: name, val: p.Value.Value()}
	}
	for _, name := range unitIfaceProps {
		go get(name, m.conn.GetUnitPropertyContext)
	}
	for _, name := range serviceIfaceProps {
		go get(name, m.conn.GetServicePropertyContext)
	}
	props := make(map[string]any, n)
	var firstErr error
	for range n { // every answer is awaited: no Get outlives the call
		a := <-answers
		if a.err != nil && firstErr == nil {
			firstErr = fmt.Errorf("%s: %w", a.name, a.err)
		}
		props[a.name] = a.val
	}
	if firstErr != nil {
		return nil, firstErr
	}
	return props, nil
}

// Reload makes systemd re-read all unit files (systemctl daemon-reload). The
// call returns when the reload is done.
func (m *Manager) Reload(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	if err := m.conn.ReloadContext(ctx); err != nil {
		return fmt.Errorf("reload systemd units (daemon-reload) via %s: %w", m.where, err)
	}
	return nil
}

// LinkUnitFiles links unit files that live outside the unit search path (by
// absolute path) into /etc/systemd/system, or /run/systemd/system when
// runtime is true. Existing symlinks of the same name are replaced, regular
// files never. Call Reload afterwards.
func (m *Manager) LinkUnitFiles(ctx context.Context, files []string, runtime bool) error {
	if len(files) == 0 {
		return nil
	}
	for _, f := range files {
		if !strings.HasPrefix(f, "/") {
			return fmt.Errorf("link unit files %v: %q is not an absolute path", files, f)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	if _, err := m.conn.LinkUnitFilesContext(ctx, files, runtime, true); err != nil {
		return fmt.Errorf("link unit files %v (runtime=%v) via %s: %w", files, runtime, m.where, err)
	}
	return nil
}

// EnableUnitFiles enables units (names, or absolute paths of unit files) by
// creating the symlinks of their [Install] sections, in /etc or, when runtime
// is true, /run. Existing symlinks are replaced. A unit without an [Install]
// section is not an error; nothing happens for it. Call Reload afterwards.
func (m *Manager) EnableUnitFiles(ctx context.Context, names []string, runtime bool) error {
	if len(names) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	if _, _, err := m.conn.EnableUnitFilesContext(ctx, names, runtime, true); err != nil {
		return fmt.Errorf("enable unit files %v (runtime=%v) via %s: %w", names, runtime, m.where, err)
	}
	return nil
}
