package systemd

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/internal/testkit"
	"gpuhost/systemd/systemdtest"
)

// testUnits are the units the private systemd boots with.
var testUnits = map[string]string{
	// Type=exec: the start job is done once the program is exec'd (with
	// Type=simple, once forked, when MainPID may still run systemd's code).
	"sleeper.service": "[Unit]\nDescription=sleeps\n[Service]\nType=exec\nExecStart=/bin/sleep 1000\n",
	"multi.service": "[Service]\nType=oneshot\nRemainAfterExit=yes\n" +
		"ExecStart=/bin/true one \"two words\"\nExecStart=@/bin/echo fake-argv0 x\nExecStart=-/bin/false\n",
	"failing.service": "[Service]\nExecStart=/bin/false\n",
	// Conflicts= with an ordering (After=): stop jobs run before start jobs,
	// so the start returns only once the other unit is fully stopped.
	"backend-a.service": "[Service]\nExecStart=/bin/sleep 1001\nExecStop=/bin/sleep 0.2\n",
	// Read both ways (TestInsideUnitProperties): every property set.
	"props.service":     "[Unit]\nConflicts=never-started.service\n[Service]\nExecStart=/bin/sleep 1007\n",
	"backend-b.service": "[Unit]\nConflicts=backend-a.service\nAfter=backend-a.service\n[Service]\nExecStart=/bin/sleep 1002\nExecStop=/bin/sleep 0.2\n",
	// Conflicts= without an ordering: both jobs run at once.
	"slow-stop.service": "[Service]\nExecStart=/bin/sleep 1005\nExecStop=/bin/sleep 5\n",
	"unordered.service": "[Unit]\nConflicts=slow-stop.service\n[Service]\nExecStart=/bin/sleep 1006\n",
	// Slow to start and to stop, so every state is visible in signals.
	"phases.service": "[Service]\nExecStartPre=/bin/sleep 0.3\nExecStart=/bin/sleep 1003\nExecStop=/bin/sleep 0.3\n",
	"logger.service": "[Service]\nType=oneshot\n" +
		"ExecStart=/bin/sh -c 'echo line-one; echo line-two; printf \"bin\\\\001ary\\\\n\"'\n",
	"installable.service": "[Service]\nExecStart=/bin/sleep 1004\n[Install]\nWantedBy=" + systemdtest.Target + "\n",
}

// insideTests run inside the private systemd's namespace (D-Bus clients must),
// each re-executed by TestManager.
var insideTests = []string{
	"TestInsideStartStop",
	"TestInsideUnitProperties",
	"TestInsideFailingUnit",
	"TestInsideUnknownUnit",
	"TestInsideSubscribe",
	"TestInsideConflicts",
	"TestInsideConflictsWithoutOrdering",
	"TestInsideReload",
	"TestInsideLinkAndEnable",
	"TestInsideJournalTail",
	"TestInsideConcurrentCalls",
}

// TestManager boots one private systemd and runs the inside tests in it.
func TestManager(t *testing.T) {
	s := systemdtest.Start(t, systemdtest.Options{Units: testUnits})
	for _, name := range insideTests {
		t.Run(name, func(t *testing.T) { s.RunTest(t, name) })
	}
	// From outside the namespace the socket accepts, then drops us.
	t.Run("ConnectFromOutside", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		socket := s.HostPath(s.SocketPath())
		m, err := ConnectPrivate(ctx, socket)
		if err == nil {
			m.Close()
			t.Fatal("connecting from outside the PID namespace succeeded; the harness's premise changed")
		}
		if !strings.Contains(err.Error(), "connect to systemd at "+socket) || !strings.Contains(err.Error(), "PID namespace") {
			t.Errorf("error %q does not name the socket or explain the cause", err)
		}
		t.Logf("error from outside: %v", err)
	})
}

// connectInside connects to the private systemd; it skips outside.
func connectInside(t *testing.T) (*Manager, context.Context) {
	t.Helper()
	if !systemdtest.Inside() {
		t.Skip("runs inside the private systemd; started by TestManager")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	m, err := ConnectPrivate(ctx, "/run/systemd/private")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m, ctx
}

func mustUnit(t *testing.T, ctx context.Context, m *Manager, unit string) api.UnitStatus {
	t.Helper()
	st, err := m.Unit(ctx, unit)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestInsideStartStop(t *testing.T) {
	m, ctx := connectInside(t)
	before := time.Now()
	if err := m.Start(ctx, "sleeper.service"); err != nil {
		t.Fatal(err)
	}
	st := mustUnit(t, ctx, m, "sleeper.service")
	if st.ActiveState != "active" || st.SubState != "running" || !st.Active() {
		t.Errorf("after Start: %s/%s (Active %v), want active/running", st.ActiveState, st.SubState, st.Active())
	}
	if st.MainPID <= 0 {
		t.Fatalf("MainPID = %d", st.MainPID)
	}
	if want := []string{"/bin/sleep", "1000"}; !reflect.DeepEqual(cmdlineSoon(t, st.MainPID), want) {
		t.Errorf("CmdlineOf(MainPID) = %q, want %q", cmdlineSoon(t, st.MainPID), want)
	}
	if !strings.HasSuffix(st.ControlGroup, "/system.slice/sleeper.service") {
		t.Errorf("ControlGroup = %q", st.ControlGroup)
	}
	if st.ActiveEnterTimestamp.Before(before.Add(-time.Second)) || st.ActiveEnterTimestamp.After(time.Now().Add(time.Second)) {
		t.Errorf("ActiveEnterTimestamp = %v, want about %v", st.ActiveEnterTimestamp, before)
	}
	// Starting an active unit is a no-op job that is "done".
	if err := m.Start(ctx, "sleeper.service"); err != nil {
		t.Errorf("second Start: %v", err)
	}

	if err := m.Stop(ctx, "sleeper.service"); err != nil {
		t.Fatal(err)
	}
	st = mustUnit(t, ctx, m, "sleeper.service")
	if st.ActiveState != "inactive" || st.SubState != "dead" || st.Active() || st.MainPID != 0 {
		t.Errorf("after Stop: %s/%s MainPID %d Active %v", st.ActiveState, st.SubState, st.MainPID, st.Active())
	}
	if err := m.Stop(ctx, "sleeper.service"); err != nil {
		t.Errorf("stopping an inactive unit: %v", err)
	}
	if err := m.Stop(ctx, "never-heard-of.service"); err != nil {
		t.Errorf("stopping a unit systemd never loaded: %v", err)
	}
}

// cmdlineSoon reads pid's command line, allowing for the moment right after
// execve in which the kernel shows it empty.
func cmdlineSoon(t *testing.T, pid int) []string {
	t.Helper()
	var argv []string
	var err error
	if !testkit.Poll(5*time.Second, func() bool { argv, err = CmdlineOf(pid); return err == nil }) {
		t.Fatal(err)
	}
	return argv
}

func TestInsideUnitProperties(t *testing.T) {
	m, ctx := connectInside(t)
	st := mustUnit(t, ctx, m, "multi.service")
	want := [][]string{{"/bin/true", "one", "two words"}, {"/bin/echo", "x"}, {"/bin/false"}}
	if !reflect.DeepEqual(st.ExecStart, want) {
		t.Errorf("ExecStart = %q, want %q", st.ExecStart, want)
	}
	if st.Name != "multi.service" || st.LoadState != "loaded" || st.FragmentPath != "/etc/systemd/system/multi.service" {
		t.Errorf("Name %q LoadState %q FragmentPath %q", st.Name, st.LoadState, st.FragmentPath)
	}
	if err := m.Start(ctx, "multi.service"); err != nil {
		t.Fatalf("oneshot with an ignored failing line: %v", err)
	}
	if st := mustUnit(t, ctx, m, "multi.service"); st.ActiveState != "active" || st.SubState != "exited" || st.Result != "success" {
		t.Errorf("after Start: %s/%s result %q", st.ActiveState, st.SubState, st.Result)
	}

	b := mustUnit(t, ctx, m, "backend-b.service")
	if !slices.Contains(b.Conflicts, "backend-a.service") {
		t.Errorf("Conflicts of backend-b = %q", b.Conflicts)
	}
	target := mustUnit(t, ctx, m, systemdtest.Target)
	if target.MainPID != 0 || target.ExecStart != nil || target.ActiveState != "active" {
		t.Errorf("target: %+v", target)
	}
	// A service's status is read property by property: it must equal
	// what GetAll of every interface gives, for a running service with
	// every field set, a finished one and an unknown one.
	if err := m.Start(ctx, "props.service"); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Stop(ctx, "props.service") }()
	for _, u := range []string{"props.service", "multi.service", "no-such-unit.service"} {
		all, err := m.conn.GetAllPropertiesContext(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		want, got := statusFromProperties(u, all), mustUnit(t, ctx, m, u)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s read property by property:\n%+v\nby GetAll:\n%+v", u, got, want)
		}
		if u == "props.service" && (got.MainPID == 0 || got.ControlGroup == "" || got.ActiveEnterTimestamp.IsZero() || got.DropInPaths != nil || len(got.Conflicts) == 0) {
			t.Errorf("props.service: a field is missing: %+v", got)
		}
	}
	missing := mustUnit(t, ctx, m, "no-such-unit.service")
	if missing.LoadState != "not-found" || missing.Active() {
		t.Errorf("unknown unit: LoadState %q Active %v", missing.LoadState, missing.Active())
	}
	if _, err := m.Unit(ctx, "bad/name.service"); err == nil || !strings.Contains(err.Error(), "bad/name.service") {
		t.Errorf("Unit with a bad name: %v", err)
	}
}

func TestInsideFailingUnit(t *testing.T) {
	m, ctx := connectInside(t)
	// Type=simple: the job is done once forked; the unit fails right after.
	events, err := m.Subscribe(ctx, "failing.service")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ctx, "failing.service"); err != nil {
		t.Fatalf("Start of a Type=simple unit whose program fails: %v", err)
	}
	waitState(t, events, "failed")
	st := mustUnit(t, ctx, m, "failing.service")
	if st.Result != "exit-code" || st.Active() {
		t.Errorf("Result %q Active %v, want exit-code, false", st.Result, st.Active())
	}

	// A job that fails: a oneshot whose program fails.
	err = m.Start(ctx, "oneshot-false.service")
	if err == nil {
		t.Fatal("starting an unknown unit succeeded")
	}
	if !strings.Contains(err.Error(), "oneshot-false.service") {
		t.Errorf("error does not name the unit: %v", err)
	}
	if err := os.WriteFile("/etc/systemd/system/oneshot-false.service", []byte("[Service]\nType=oneshot\nExecStart=/bin/false\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := m.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	err = m.Start(ctx, "oneshot-false.service")
	var jobErr *JobError
	if !errors.As(err, &jobErr) || jobErr.Result != "failed" || jobErr.Unit != "oneshot-false.service" || jobErr.Op != "start" {
		t.Fatalf("Start = %v, want *JobError{oneshot-false.service start failed}", err)
	}
	if !strings.Contains(err.Error(), `"failed"`) || !strings.Contains(err.Error(), "journalctl -u oneshot-false.service") {
		t.Errorf("message %q lacks the result or the hint", err)
	}
}

func TestInsideUnknownUnit(t *testing.T) {
	m, ctx := connectInside(t)
	err := m.Start(ctx, "does-not-exist.service")
	if err == nil || !strings.Contains(err.Error(), "start unit does-not-exist.service") {
		t.Errorf("Start of an unknown unit: %v", err)
	}
	for _, bad := range []string{"", "noSuffix", "a/b.service", strings.Repeat("x", 300) + ".service"} {
		if err := m.Start(ctx, bad); err == nil {
			t.Errorf("Start(%q) succeeded", bad)
		}
	}
}

// waitState reads events until one has the given ActiveState.
func waitState(t *testing.T, events <-chan UnitEvent, state string) []UnitEvent {
	t.Helper()
	var seen []UnitEvent
	timeout := time.After(15 * time.Second)
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatalf("events closed before %s; saw %+v", state, seen)
			}
			seen = append(seen, ev)
			if ev.ActiveState == state {
				return seen
			}
		case <-timeout:
			t.Fatalf("no %s event within 15s; saw %+v", state, seen)
		}
	}
}

func TestInsideSubscribe(t *testing.T) {
	m, ctx := connectInside(t)
	subCtx, stop := context.WithCancel(ctx)
	events, err := m.Subscribe(subCtx, "phases.service", "sleeper.service")
	if err != nil {
		t.Fatal(err)
	}
	// First the current state of each unit.
	initial := map[string]string{}
	for range 2 {
		ev := <-events
		initial[ev.Unit] = ev.ActiveState
	}
	if initial["phases.service"] != "inactive" || initial["sleeper.service"] != "inactive" {
		t.Fatalf("initial events %v", initial)
	}
	if err := m.Start(ctx, "phases.service"); err != nil {
		t.Fatal(err)
	}
	seen := waitState(t, events, "active")
	if err := m.Stop(ctx, "phases.service"); err != nil {
		t.Fatal(err)
	}
	seen = append(seen, waitState(t, events, "inactive")...)

	var states []string
	for _, ev := range seen {
		if ev.Unit != "phases.service" {
			t.Errorf("event of a unit that did not change: %+v", ev)
		}
		if len(states) == 0 || states[len(states)-1] != ev.ActiveState {
			states = append(states, ev.ActiveState)
		}
	}
	if want := []string{"activating", "active", "deactivating", "inactive"}; !reflect.DeepEqual(states, want) {
		t.Errorf("ActiveState sequence %q, want %q (events %+v)", states, want, seen)
	}
	if seen[0].SubState != "start-pre" {
		t.Errorf("first SubState %q, want start-pre", seen[0].SubState)
	}
	for i := 1; i < len(seen); i++ {
		if seen[i].At.Before(seen[i-1].At) {
			t.Errorf("event times go backwards: %+v", seen)
		}
	}

	stop()
	select {
	case ev, ok := <-events:
		if ok {
			t.Errorf("event after cancel: %+v", ev)
		}
	case <-time.After(5 * time.Second):
		t.Error("events channel not closed after the context ended")
	}
	if _, err := m.Subscribe(ctx); err == nil {
		t.Error("Subscribe without units succeeded")
	}
}

func TestInsideConflicts(t *testing.T) {
	m, ctx := connectInside(t)
	if err := m.Start(ctx, "backend-a.service"); err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ctx, "backend-b.service"); err != nil {
		t.Fatal(err)
	}
	a := mustUnit(t, ctx, m, "backend-a.service")
	b := mustUnit(t, ctx, m, "backend-b.service")
	if a.ActiveState != "inactive" || !b.Active() {
		t.Errorf("after starting B: A %s, B %s; want A fully stopped by Conflicts= + After=", a.ActiveState, b.ActiveState)
	}
	// And back: starting A stops B first (stop jobs always run before start
	// jobs, whichever unit carries the ordering).
	if err := m.Start(ctx, "backend-a.service"); err != nil {
		t.Fatal(err)
	}
	if b := mustUnit(t, ctx, m, "backend-b.service"); b.ActiveState != "inactive" {
		t.Errorf("B is %s after starting A, want inactive", b.ActiveState)
	}
	if err := m.Stop(ctx, "backend-a.service"); err != nil {
		t.Fatal(err)
	}
}

// TestInsideConflictsWithoutOrdering pins down systemd's rule that
// Conflicts= alone does not order: the start job finishes while the
// conflicting unit is still stopping, so both run at once. Backend units must
// carry After= as well.
func TestInsideConflictsWithoutOrdering(t *testing.T) {
	m, ctx := connectInside(t)
	if err := m.Start(ctx, "slow-stop.service"); err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ctx, "unordered.service"); err != nil {
		t.Fatal(err)
	}
	if st := mustUnit(t, ctx, m, "slow-stop.service"); st.ActiveState != "deactivating" || !st.Active() {
		t.Errorf("slow-stop is %s right after starting its unordered conflict; want deactivating (still running)", st.ActiveState)
	}
}

func TestInsideReload(t *testing.T) {
	m, ctx := connectInside(t)
	const unit = "written-later.service"
	path := filepath.Join("/etc/systemd/system", unit)
	if st := mustUnit(t, ctx, m, unit); st.LoadState != "not-found" {
		t.Fatalf("before writing: LoadState %q", st.LoadState)
	}
	write := func(arg string) {
		if err := os.WriteFile(path, []byte("[Service]\nExecStart=/bin/sleep "+arg+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := m.Reload(ctx); err != nil {
			t.Fatal(err)
		}
	}
	write("2001")
	if st := mustUnit(t, ctx, m, unit); st.LoadState != "loaded" || !reflect.DeepEqual(st.ExecStart, [][]string{{"/bin/sleep", "2001"}}) {
		t.Errorf("after Reload: LoadState %q ExecStart %q", st.LoadState, st.ExecStart)
	}
	write("2002")
	if st := mustUnit(t, ctx, m, unit); !reflect.DeepEqual(st.ExecStart, [][]string{{"/bin/sleep", "2002"}}) {
		t.Errorf("after changing and reloading: ExecStart %q", st.ExecStart)
	}
	if err := m.Start(ctx, unit); err != nil {
		t.Fatal(err)
	}
	if err := m.Stop(ctx, unit); err != nil {
		t.Fatal(err)
	}
}

func TestInsideLinkAndEnable(t *testing.T) {
	m, ctx := connectInside(t)
	dir := t.TempDir() // in the private /tmp: outside the unit search path
	file := filepath.Join(dir, "linked.service")
	if err := os.WriteFile(file, []byte("[Service]\nExecStart=/bin/sleep 3001\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := m.LinkUnitFiles(ctx, []string{file}, true); err != nil {
		t.Fatal(err)
	}
	if target, err := os.Readlink("/run/systemd/system/linked.service"); err != nil || target != file {
		t.Errorf("runtime link: %q, %v", target, err)
	}
	// Linking again (same target) is fine.
	if err := m.LinkUnitFiles(ctx, []string{file}, true); err != nil {
		t.Errorf("linking again: %v", err)
	}
	if err := m.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ctx, "linked.service"); err != nil {
		t.Fatal(err)
	}
	if err := m.Stop(ctx, "linked.service"); err != nil {
		t.Fatal(err)
	}

	persistent := filepath.Join(dir, "linked-persistent.service")
	if err := os.WriteFile(persistent, []byte("[Service]\nExecStart=/bin/sleep 3002\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := m.LinkUnitFiles(ctx, []string{persistent}, false); err != nil {
		t.Fatal(err)
	}
	if target, err := os.Readlink("/etc/systemd/system/linked-persistent.service"); err != nil || target != persistent {
		t.Errorf("persistent link: %q, %v", target, err)
	}
	if err := m.LinkUnitFiles(ctx, []string{"relative.service"}, true); err == nil {
		t.Error("linking a relative path succeeded")
	}
	if err := m.LinkUnitFiles(ctx, []string{filepath.Join(dir, "missing.service")}, true); err == nil || !strings.Contains(err.Error(), "missing.service") {
		t.Errorf("linking a missing file: %v", err)
	}

	if err := m.EnableUnitFiles(ctx, []string{"installable.service"}, true); err != nil {
		t.Fatal(err)
	}
	link := "/run/systemd/system/" + systemdtest.Target + ".wants/installable.service"
	if _, err := os.Lstat(link); err != nil {
		t.Errorf("enable did not create %s: %v", link, err)
	}
	if err := m.EnableUnitFiles(ctx, []string{"no-such.service"}, true); err == nil || !strings.Contains(err.Error(), "no-such.service") {
		t.Errorf("enabling a missing unit: %v", err)
	}
}

func TestInsideJournalTail(t *testing.T) {
	m, ctx := connectInside(t)
	if lines, err := JournalTail(ctx, "never-ran.service", 10); err != nil || len(lines) != 0 {
		t.Errorf("journal of a unit that never ran: %q, %v", lines, err)
	}
	if err := m.Start(ctx, "logger.service"); err != nil {
		t.Fatal(err)
	}
	// journald reads the unit's stdout stream asynchronously: wait for it.
	want := []string{"line-one", "line-two", "bin\x01ary"}
	var lines []string
	deadline := time.Now().Add(10 * time.Second)
	for {
		var err error
		lines, err = JournalTail(ctx, "logger.service", 50)
		if err != nil {
			t.Fatal(err)
		}
		if containsInOrder(lines, want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !containsInOrder(lines, want) {
		t.Fatalf("journal of logger.service = %q, want %q in order", lines, want)
	}
	last, err := JournalTail(ctx, "logger.service", 1)
	if err != nil || len(last) != 1 {
		t.Errorf("last line: %q, %v", last, err)
	}
	if _, err := JournalTail(ctx, "logger.service", 0); err == nil {
		t.Error("n=0 accepted")
	}
}

func containsInOrder(lines, want []string) bool {
	i := 0
	for _, l := range lines {
		if i < len(want) && l == want[i] {
			i++
		}
	}
	return i == len(want)
}

// TestInsideConcurrentCalls: one Manager serves many goroutines (the panel,
// the bot and the Supervisor share it).
func TestInsideConcurrentCalls(t *testing.T) {
	m, ctx := connectInside(t)
	errs := make(chan error, 20)
	for i := range 20 {
		go func() {
			if i%2 == 0 {
				_, err := m.Unit(ctx, "multi.service")
				errs <- err
				return
			}
			errs <- m.Start(ctx, "multi.service")
		}()
	}
	for range 20 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
