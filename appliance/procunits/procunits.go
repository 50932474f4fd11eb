// Package procunits is the demo's stand-in for systemd: it runs the backend
// "units" as child processes of gpuhost, with the same interface the
// Supervisor uses for systemd.Manager (Start, Stop, Unit, Subscribe). It
// exists so that `gpuhost demo` works without root and without systemd; on a
// real box the systemd package is used.
//
// It honours the parts of a unit that matter to gpuhost: ExecStart with
// $VAR splitting from an EnvironmentFile, Conflicts= (starting one stops the
// others), stop with SIGTERM then SIGKILL, and the states inactive,
// activating, active, deactivating and failed. Like a system service, a
// backend gets a minimal environment (PATH, HOME, the locale, …) plus its
// EnvironmentFile, never the daemon's secrets.
package procunits

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"gpuhost/api"
	"gpuhost/systemd"
	"gpuhost/units"
)

// Spec describes one unit for the runner.
type Spec struct {
	Name string
	// Exec is the command prefix; the words of $GPUHOST_ARGS from EnvFile
	// are appended, as systemd does for `ExecStart=… $GPUHOST_ARGS`.
	Exec      []string
	EnvFile   string
	Conflicts []string
	// StopTimeout is how long SIGTERM may take before SIGKILL (default 10 s).
	StopTimeout time.Duration
	// LogDir, when set, receives <unit>.log with the process's output (the
	// demo's journal).
	LogDir string
}

// Runner runs units as child processes.
type Runner struct {
	mu    sync.Mutex
	units map[string]*unit
	subs  []subscriber
}

type subscriber struct {
	ctx   context.Context
	ch    chan systemd.UnitEvent
	names map[string]bool
}

type unit struct {
	spec     Spec
	state    string // inactive, activating, active, deactivating, failed
	sub      string
	result   string
	cmd      *exec.Cmd
	done     chan struct{}
	stopping bool
	restarts int
	since    time.Time
}

// New returns a runner for the given units.
func New(specs ...Spec) *Runner {
	r := &Runner{units: map[string]*unit{}}
	for _, s := range specs {
		if s.StopTimeout == 0 {
			s.StopTimeout = 10 * time.Second
		}
		r.units[s.Name] = &unit{spec: s, state: "inactive", sub: "dead", result: "success"}
	}
	return r
}

func (r *Runner) get(name string) (*unit, error) {
	u, ok := r.units[name]
	if !ok {
		return nil, fmt.Errorf("unit %s: not loaded (known units: %s)", name, strings.Join(r.names(), ", "))
	}
	return u, nil
}

func (r *Runner) names() []string {
	var out []string
	for n := range r.units {
		out = append(out, n)
	}
	return out
}

// setState must be called with r.mu held.
func (r *Runner) setState(u *unit, state, sub string) {
	u.state, u.sub, u.since = state, sub, time.Now()
	ev := systemd.UnitEvent{Unit: u.spec.Name, ActiveState: state, SubState: sub, At: u.since}
	for _, s := range r.subs {
		if s.ctx.Err() != nil || !s.names[u.spec.Name] {
			continue
		}
		select {
		case s.ch <- ev:
		default: // a slow subscriber re-reads the state anyway
		}
	}
}

// Start starts a unit, stopping the units it conflicts with first, and
// returns once the process runs (like Type=exec).
func (r *Runner) Start(ctx context.Context, name string) error {
	r.mu.Lock()
	u, err := r.get(name)
	if err != nil {
		r.mu.Unlock()
		return err
	}
	conflicts := append([]string(nil), u.spec.Conflicts...)
	for other, ou := range r.units {
		for _, c := range ou.spec.Conflicts {
			if c == name && other != name {
				conflicts = append(conflicts, other)
			}
		}
	}
	r.mu.Unlock()
	for _, c := range conflicts {
		if err := r.Stop(ctx, c); err != nil {
			return fmt.Errorf("start %s: stop conflicting %s: %w", name, c, err)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if u.state == "active" || u.state == "activating" {
		return nil
	}
	argv, env, err := commandLine(u.spec)
	if err != nil {
		u.result = "resources"
		r.setState(u, "failed", "failed")
		return fmt.Errorf("start %s: %w", name, err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(baseEnv(os.Environ()), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if u.spec.LogDir != "" {
		if err := os.MkdirAll(u.spec.LogDir, 0o755); err == nil {
			if f, err := os.OpenFile(logPath(u.spec), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
				cmd.Stdout, cmd.Stderr = f, f
				defer f.Close()
			}
		}
	}
	r.setState(u, "activating", "start")
	if err := cmd.Start(); err != nil {
		u.result = "exit-code"
		r.setState(u, "failed", "failed")
		return fmt.Errorf("start %s: exec %s: %w", name, argv[0], err)
	}
	u.cmd, u.done, u.stopping, u.result = cmd, make(chan struct{}), false, "success"
	r.setState(u, "active", "running")
	go r.wait(u, cmd, u.done)
	return nil
}

func (r *Runner) wait(u *unit, cmd *exec.Cmd, done chan struct{}) {
	err := cmd.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	close(done)
	if u.cmd != cmd {
		return
	}
	u.cmd = nil
	if u.stopping {
		u.result = "success"
		r.setState(u, "inactive", "dead")
		return
	}
	if err != nil {
		var ee *exec.ExitError
		u.result = "exit-code"
		if errors.As(err, &ee) && ee.ProcessState != nil {
			if ws, ok := ee.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				u.result = "signal"
			}
		}
		r.setState(u, "failed", "failed")
		return
	}
	r.setState(u, "inactive", "dead")
}

// Stop sends SIGTERM to the unit's process group, SIGKILL after the stop
// timeout, and returns when the process is gone.
func (r *Runner) Stop(ctx context.Context, name string) error {
	r.mu.Lock()
	u, err := r.get(name)
	if err != nil {
		r.mu.Unlock()
		return err
	}
	if u.cmd == nil {
		if u.state == "failed" {
			r.setState(u, "inactive", "dead") // like systemctl stop on a failed unit
		}
		r.mu.Unlock()
		return nil
	}
	cmd, done := u.cmd, u.done
	u.stopping = true
	r.setState(u, "deactivating", "stop-sigterm")
	r.mu.Unlock()

	pgid := cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	t := time.NewTimer(u.spec.StopTimeout)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C:
	case <-ctx.Done():
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	select {
	case <-done:
		return nil
	case <-time.After(5 * time.Second):
		return fmt.Errorf("stop %s: pid %d did not exit after SIGKILL", name, pgid)
	}
}

// Unit reports the unit's state in systemd's vocabulary.
func (r *Runner) Unit(ctx context.Context, name string) (api.UnitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	u, err := r.get(name)
	if err != nil {
		return api.UnitStatus{}, err
	}
	st := api.UnitStatus{
		Name: name, LoadState: "loaded", ActiveState: u.state, SubState: u.sub, Result: u.result,
		Conflicts: u.spec.Conflicts, NRestarts: u.restarts, ActiveEnterTimestamp: u.since,
	}
	if u.cmd != nil && u.cmd.Process != nil {
		st.MainPID = u.cmd.Process.Pid
		argv, _, _ := commandLine(u.spec)
		st.ExecStart = [][]string{argv}
	}
	return st, nil
}

// Subscribe streams state changes of the named units until ctx ends.
func (r *Runner) Subscribe(ctx context.Context, names ...string) (<-chan systemd.UnitEvent, error) {
	ch := make(chan systemd.UnitEvent, 64)
	set := map[string]bool{}
	for _, n := range names {
		set[n] = true
	}
	r.mu.Lock()
	r.subs = append(r.subs, subscriber{ctx: ctx, ch: ch, names: set})
	r.mu.Unlock()
	go func() {
		<-ctx.Done()
		r.mu.Lock()
		for i, s := range r.subs {
			if s.ch == ch {
				r.subs = append(r.subs[:i], r.subs[i+1:]...)
				break
			}
		}
		close(ch)
		r.mu.Unlock()
	}()
	return ch, nil
}

// StopAll stops every unit; the demo calls it on exit.
func (r *Runner) StopAll(ctx context.Context) {
	r.mu.Lock()
	names := r.names()
	r.mu.Unlock()
	for _, n := range names {
		_ = r.Stop(ctx, n)
	}
}

// Journal returns the last n lines of the unit's log file.
func (r *Runner) Journal(ctx context.Context, name string, n int) ([]string, error) {
	r.mu.Lock()
	u, err := r.get(name)
	r.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if u.spec.LogDir == "" {
		return nil, nil
	}
	f, err := os.Open(logPath(u.spec))
	if err != nil {
		return nil, fmt.Errorf("journal of %s: %w", name, err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return lines, sc.Err()
}

func logPath(s Spec) string { return LogPath(s.LogDir, s.Name) }

// LogPath is the file in dir that receives the output of unit (the
// runner's stand-in for its journal), for hints that say where to look.
func LogPath(dir, unit string) string {
	return strings.TrimSuffix(dir, "/") + "/" + strings.TrimSuffix(unit, ".service") + ".log"
}

// passEnv are the variables of the daemon's environment that a backend
// inherits: what a system service gets from systemd (PATH, the locale) and
// the basics a login would set. Everything else, such as
// GPUHOST_TELEGRAM_TOKEN, API keys and mail passwords, stays with the
// daemon; a backend gets only these and what its unit's EnvironmentFile
// sets, as under systemd.
var passEnv = map[string]bool{
	"PATH": true, "HOME": true, "USER": true, "LOGNAME": true, "SHELL": true,
	"LANG": true, "LANGUAGE": true, "TZ": true, "TMPDIR": true,
}

// baseEnv filters the daemon's environment down to passEnv and LC_*;
// without PATH it sets systemd's default.
func baseEnv(environ []string) []string {
	var out []string
	havePath := false
	for _, kv := range environ {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || (!passEnv[k] && !strings.HasPrefix(k, "LC_")) {
			continue
		}
		havePath = havePath || k == "PATH"
		out = append(out, kv)
	}
	if !havePath {
		out = append(out, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	}
	return out
}

// commandLine builds argv and extra environment like systemd would from
// `ExecStart=<Exec> $GPUHOST_ARGS` and `EnvironmentFile=-<EnvFile>`.
func commandLine(s Spec) ([]string, []string, error) {
	if len(s.Exec) == 0 {
		return nil, nil, fmt.Errorf("unit %s has no Exec", s.Name)
	}
	argv := append([]string(nil), s.Exec...)
	var env []string
	if s.EnvFile != "" {
		// Like EnvironmentFile=-path: a missing file is no error.
		data, err := os.ReadFile(s.EnvFile)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, nil, fmt.Errorf("read environment file of %s: %w", s.Name, err)
		}
		vars := units.ParseEnvFile(string(data))
		for k, v := range vars {
			env = append(env, k+"="+v)
		}
		argv = append(argv, strings.Fields(vars["GPUHOST_ARGS"])...)
	}
	return argv, env, nil
}
