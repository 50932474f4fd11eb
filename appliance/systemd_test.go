package appliance

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/config"
	"gpuhost/internal/loopback"
	"gpuhost/internal/testkit"
	"gpuhost/systemd"
	"gpuhost/systemd/systemdtest"
	"gpuhost/units"
)

// e2e is gpuhost deployed into a private systemd: the rendered backend
// units and gpuhost.service (Type=notify, watchdog, Restart=on-failure),
// the daemon reached over loopback HTTP from outside.
type e2e struct {
	sd      *systemdtest.Systemd
	cfg     *config.Config
	cfgPath string
	client  *api.Client
	base    string
}

// startE2EWith deploys gpuhost into a private systemd with the config text
// rewritten by mutate and extra drop-ins (path under the unit folder →
// content).
func startE2EWith(t testing.TB, vllmLoad, state string, mutate func(string) string, dropIns map[string]string) *e2e {
	t.Helper()
	bin := gpuhostBinary(t)
	listenPort := testkit.FreePort(t)
	yaml := testConfigYAML(bin, state, "systemd", "/run/systemd/private", testkit.FreePort(t), testkit.FreePort(t), vllmLoad)
	yaml = strings.Replace(yaml, "listen: 127.0.0.1:0", "listen: 127.0.0.1:"+strconv.Itoa(listenPort), 1)
	// Nothing is wanted at first boot; after a switch, the last wanted
	// profile is what a restart restores.
	yaml = strings.Replace(yaml, "default_profile: coder\n", "", 1)
	if mutate != nil {
		yaml = mutate(yaml)
	}
	cfgPath := filepath.Join(state, "gpuhost.yaml")
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	unitFiles := map[string]string{}
	var sockets []string
	for _, bu := range cfg.BackendUnits() {
		unitFiles[bu.Name] = units.RenderBackendUnit(bu)
		// Each backend in its own network namespace, reached through its
		// socket units, as installed.
		for _, f := range units.RenderProxyUnits(bu) {
			unitFiles[f.Name] = f.Content
		}
		sockets = append(sockets, bu.ProxySocketUnits()...)
	}
	unitFiles["gpuhost.service"] = units.RenderDaemonUnit(units.DaemonUnit{
		Binary: bin, Config: cfgPath, WatchdogSec: 10, ReadWritePaths: []string{state}, Sockets: sockets,
	})
	sd := systemdtest.Start(t, systemdtest.Options{Units: unitFiles, Keep: []string{filepath.Dir(bin), state}, NetAdmin: true})
	// The test's files live under the host's /tmp, bound into the private
	// systemd's /tmp: the daemon must see that /tmp, and must not create
	// /var/lib/gpuhost or /etc/gpuhost on the host.
	dropIn := "[Service]\nPrivateTmp=no\nStateDirectory=\nConfigurationDirectory=\n"
	if err := os.MkdirAll(filepath.Join(sd.UnitDir, "gpuhost.service.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sd.UnitDir, "gpuhost.service.d", "test.conf"), []byte(dropIn), 0o644); err != nil {
		t.Fatal(err)
	}
	for p, content := range dropIns {
		full := filepath.Join(sd.UnitDir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if out, err := sd.Systemctl(ctx, "daemon-reload"); err != nil {
		t.Fatalf("daemon-reload: %v %s", err, out)
	}
	// Type=notify: this returns once gpuhost sent READY=1.
	if out, err := sd.Systemctl(ctx, "start", "gpuhost.service"); err != nil {
		st, _ := sd.Systemctl(ctx, "status", "--no-pager", "gpuhost.service")
		log, _ := sd.Command(ctx, "journalctl", "--no-pager", "-o", "cat", "-n", "40", "-u", "gpuhost.service").CombinedOutput()
		t.Fatalf("start gpuhost.service: %v %s\n%s\nits journal:\n%s", err, out, st, log)
	}
	base := "http://127.0.0.1:" + strconv.Itoa(listenPort)
	return &e2e{sd: sd, cfg: cfg, cfgPath: cfgPath, client: api.NewClient(base, ""), base: base}
}

func (e *e2e) switchTo(t testing.TB, profile string) []api.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var evs []api.Event
	if err := e.client.SwitchAndFollow(ctx, api.SwitchRequest{Profile: profile}, func(ev api.Event) { evs = append(evs, ev) }); err != nil {
		t.Fatalf("switch to %s: %v%s", profile, err, describe(evs))
	}
	return evs
}

func (e *e2e) isActive(t testing.TB, unit string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, _ := e.sd.Systemctl(ctx, "is-active", unit) // non-zero exit for inactive
	return strings.TrimSpace(out)
}

func (e *e2e) waitState(t testing.TB, what string, timeout time.Duration, ok func(api.Status) bool) api.Status {
	t.Helper()
	var last api.Status
	var lastErr error
	if testkit.Poll(timeout, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		last, lastErr = e.client.Status(ctx)
		return lastErr == nil && ok(last)
	}) {
		return last
	}
	t.Fatalf("%s not reached within %s: last state %+v, err %v", what, timeout, last.State, lastErr)
	return last
}

// logOnFailure logs, when t fails, the daemon's events after seq and PID
// 1's start and stop lines of the backend units: what gpuhost decided and
// what systemd did, in order.
func (e *e2e) logOnFailure(t *testing.T, seq uint64) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = e.client.Events(ctx, fmt.Sprintf("/api/events?since=%d", seq), func(ev api.Event) bool {
			t.Logf("event %s %s %s %s %s: %s", ev.Time.Format("15:04:05.000"), ev.Kind, ev.Step, ev.Status, ev.Profile, ev.Message)
			return true
		})
		evs, err := e.sd.UnitEvents(context.Background(), e.cfg.Backends.VLLM.Unit, e.cfg.Backends.Ollama.Unit)
		if err != nil {
			t.Logf("PID 1's journal: %v", err)
		}
		for _, ev := range evs {
			t.Logf("PID 1: %s", ev)
		}
	})
}

// checkJournal checks the exclusion on PID 1's own journal: no backend
// unit's start began while another backend unit had not finished stopping.
// The journal has no blind spots between samples, so unlike the sampler its
// verdict does not depend on the machine's speed. It waits (journald reads
// PID 1's messages asynchronously) until at least minStarts backend starts
// are there, so an empty journal cannot pass, and returns their number.
func (e *e2e) checkJournal(t testing.TB, minStarts int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		evs, err := e.sd.UnitEvents(ctx, e.cfg.Backends.VLLM.Unit, e.cfg.Backends.Ollama.Unit)
		if err != nil {
			t.Fatalf("read PID 1's journal: %v", err)
		}
		violations, starts := systemdtest.Overlaps(evs)
		for _, v := range violations {
			t.Errorf("PID 1's journal: two backends at once: %s", v)
		}
		if len(violations) > 0 || starts >= minStarts {
			return starts
		}
		if ctx.Err() != nil {
			t.Fatalf("PID 1's journal shows %d backend starts, want ≥ %d:\n%v", starts, minStarts, evs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// sampler runs inside the private systemd's PID namespace (the private bus
// refuses peers outside it) and reads both backend units' states, aiming at
// 50 Hz (under -race on a loaded machine it reaches less: the rate is
// logged, and checkJournal is the check that does not depend on it).
type sampler struct {
	cmd   *exec.Cmd
	out   *bufio.Scanner
	stdin io.WriteCloser
	ready string // the child's "SAMPLER READY" line (the residual mode puts what it read there)
}

type samplerReport struct {
	Samples int     `json:"samples"`
	Both    int     `json:"both"`
	Seconds float64 `json:"seconds"`
	Errors  int     `json:"errors"`
	First   string  `json:"first_violation"`
}

func startSampler(t testing.TB, e *e2e) *sampler {
	t.Helper()
	return startSamplerEnv(t, e)
}

// startSamplerEnv is startSampler with extra environment for the child
// (GPUHOST_SAMPLER_MODE=residual selects the standby sampler of
// systemd_standby_test.go).
func startSamplerEnv(t testing.TB, e *e2e, env ...string) *sampler {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := e.sd.Command(context.Background(), exe, "-test.run=^TestSamplerChild$", "-test.v")
	cmd.Env = append(os.Environ(), "GPUHOST_SAMPLER=1",
		"GPUHOST_SAMPLER_UNITS="+e.cfg.Backends.VLLM.Unit+","+e.cfg.Backends.Ollama.Unit)
	cmd.Env = append(cmd.Env, env...)
	// nsenter does not forward signals to the process it forks, so the
	// sampler stops when its stdin closes.
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &sampler{cmd: cmd, out: bufio.NewScanner(stdout), stdin: stdin}
	// Wait for the child to be connected and sampling.
	for s.out.Scan() {
		if strings.HasPrefix(s.out.Text(), "SAMPLER READY") {
			s.ready = s.out.Text()
			return s
		}
	}
	t.Fatalf("sampler did not start: %v", s.out.Err())
	return nil
}

func (s *sampler) stop(t testing.TB) samplerReport {
	t.Helper()
	var rep samplerReport
	s.stopInto(t, &rep)
	return rep
}

// stopInto stops the sampler and decodes its report into rep.
func (s *sampler) stopInto(t testing.TB, rep any) {
	t.Helper()
	_ = s.stdin.Close()
	found := false
	for s.out.Scan() {
		if j, ok := strings.CutPrefix(s.out.Text(), "SAMPLER REPORT "); ok {
			if err := json.Unmarshal([]byte(j), rep); err != nil {
				t.Fatal(err)
			}
			found = true
		}
	}
	_ = s.cmd.Wait()
	if !found {
		t.Fatal("sampler printed no report")
	}
}

// log reports the sampler's rate, which depends on the machine's load and
// is therefore not asserted.
func (r samplerReport) log(t testing.TB) {
	t.Helper()
	hz := 0.0
	if r.Seconds > 0 {
		hz = float64(r.Samples) / r.Seconds
	}
	t.Logf("sampler: %d samples in %.1f s (%.0f Hz), %d errors, %d with two backends active", r.Samples, r.Seconds, hz, r.Errors, r.Both)
}

// TestSamplerChild is the sampler's body; it only runs when re-executed by
// startSampler inside the private systemd.
func TestSamplerChild(t *testing.T) {
	if os.Getenv("GPUHOST_SAMPLER") != "1" {
		t.Skip("helper process for the end-to-end tests")
	}
	switch os.Getenv("GPUHOST_SAMPLER_MODE") {
	case "residual":
		residualSamplerChild(t)
		return
	case "gpus":
		gpuSamplerChild(t)
		return
	}
	names := strings.Split(os.Getenv("GPUHOST_SAMPLER_UNITS"), ",")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m, err := systemd.ConnectPrivate(ctx, "/run/systemd/private")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	rep := samplerReport{}
	sampleUntilStdinCloses(20*time.Millisecond, &rep.Seconds, &rep, func() {
		// The two reads are not one atomic snapshot: A may stop and B start
		// between them. So read A, B, A again: a violation needs A active
		// both before and after B was seen active.
		var active []string
		read := func(n string) (string, bool) {
			st, err := m.Unit(ctx, n)
			if err != nil {
				rep.Errors++
				return "", false
			}
			return st.ActiveState, st.Active()
		}
		a1, aOn1 := read(names[0])
		b, bOn := read(names[1])
		a2, aOn2 := read(names[0])
		if aOn1 && aOn2 {
			active = append(active, names[0]+"="+a1+"→"+a2)
		}
		if bOn {
			active = append(active, names[1]+"="+b)
		}
		rep.Samples++
		if len(active) > 1 {
			rep.Both++
			if rep.First == "" {
				rep.First = strings.Join(active, " ")
			}
		}
	})
}

// sampleUntilStdinCloses is a sampler child's loop: it says SAMPLER READY,
// calls sample every interval until the test closes stdin, then prints the
// report (its running time in *seconds) as SAMPLER REPORT.
func sampleUntilStdinCloses(interval time.Duration, seconds *float64, report any, sample func()) {
	stop := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin) // returns when the test closes stdin
		close(stop)
	}()
	fmt.Println("SAMPLER READY")
	t0 := time.Now()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			*seconds = time.Since(t0).Seconds()
			b, _ := json.Marshal(report)
			fmt.Println("SAMPLER REPORT " + string(b))
			return
		case <-tick.C:
		}
		sample()
	}
}

func TestSystemdEndToEnd(t *testing.T) {
	// The periodic verify runs every 3 s (a look every 1.5 s; twice the
	// simulated vLLM's load, so a unit started by hand has loaded by its
	// first check), so checks run among the hand actions below: a hand
	// action must not read as a failed check.
	e := startE2EWith(t, "1500ms", t.TempDir(), func(y string) string {
		return strings.Replace(y, "  release_timeout: 20s\n", "  release_timeout: 20s\n  verify_interval: 3s\n", 1)
	}, nil)

	t.Run("rendered units conflict", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		e.logOnFailure(t, e.lastSeq(t))
		// Without gpuhost's help: systemd's Conflicts= alone. The units
		// read the environment files gpuhost would have written.
		for _, p := range []string{"coder", "llama"} {
			prof := e.cfg.Profiles[p]
			unit := e.cfg.BackendFor(prof.Backend).Unit
			if err := os.MkdirAll(filepath.Dir(e.cfg.EnvFilePath(unit)), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(e.cfg.EnvFilePath(unit), []byte(units.EnvFile(*prof, true)), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		// Real backends take a while to stop (vLLM: seconds). A slow stop
		// is what makes the ordering matter: without After= the other unit
		// would start while this one is still deactivating.
		var dropIns []string
		for _, u := range []string{e.cfg.Backends.VLLM.Unit, e.cfg.Backends.Ollama.Unit} {
			d := filepath.Join(e.sd.UnitDir, u+".d")
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
			f := filepath.Join(d, "slow-stop.conf")
			if err := os.WriteFile(f, []byte("[Service]\nExecStop=/bin/sleep 0.3\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			dropIns = append(dropIns, f)
		}
		defer func() {
			for _, f := range dropIns {
				os.Remove(f)
			}
			_, _ = e.sd.Systemctl(context.Background(), "daemon-reload")
		}()
		if out, err := e.sd.Systemctl(ctx, "daemon-reload"); err != nil {
			t.Fatalf("%v %s", err, out)
		}
		before := e.checkJournal(t, 0)
		s := startSampler(t, e)
		for i := 0; i < 3; i++ {
			if out, err := e.sd.Systemctl(ctx, "start", e.cfg.Backends.Ollama.Unit); err != nil {
				t.Fatalf("%v %s", err, out)
			}
			if out, err := e.sd.Systemctl(ctx, "start", e.cfg.Backends.VLLM.Unit); err != nil {
				t.Fatalf("%v %s", err, out)
			}
		}
		// With Conflicts= and After=, systemd finishes the stop of one
		// before the start of the other returns: never both.
		rep := s.stop(t)
		rep.log(t)
		if rep.Both != 0 {
			t.Errorf("hand starts ran two backends at once %d times, first: %s", rep.Both, rep.First)
		}
		e.checkJournal(t, before+6)
		if got := e.isActive(t, e.cfg.Backends.Ollama.Unit); got != "inactive" {
			t.Errorf("starting the vLLM unit left the Ollama unit %q", got)
		}
		if got := e.isActive(t, e.cfg.Backends.VLLM.Unit); got != "active" {
			t.Errorf("vLLM unit is %q", got)
		}
		if out, err := e.sd.Systemctl(ctx, "stop", e.cfg.Backends.VLLM.Unit); err != nil {
			t.Fatalf("%v %s", err, out)
		}
	})

	t.Run("switch vllm-ollama-vllm never runs two backends", func(t *testing.T) {
		before := e.checkJournal(t, 0)
		e.logOnFailure(t, 0)
		s := startSampler(t, e)
		for _, p := range []string{"coder", "llama", "coder"} {
			evs := e.switchTo(t, p)
			if _, ok := stepEvent(evs, "verify", "done"); !ok {
				t.Errorf("switch to %s has no verify step:%s", p, describe(evs))
			}
		}
		rep := s.stop(t)
		rep.log(t)
		if rep.Both != 0 {
			t.Errorf("sampler saw two backends active %d times, first: %s", rep.Both, rep.First)
		}
		if rep.Errors > 0 {
			t.Errorf("sampler had %d D-Bus errors", rep.Errors)
		}
		// The sampler's rate depends on the machine's load (11–19 Hz under
		// -race on a busy 2-core machine); PID 1's journal does not.
		e.checkJournal(t, before+3)
		st := e.waitState(t, "coder active", 10*time.Second, func(s api.Status) bool { return s.State.Phase == api.PhaseActive && s.State.Profile == "coder" })
		if d, ok := st.GPU.Device0(); !ok || d.MemoryUsedMiB < 22000 {
			t.Errorf("GPU after switching to vLLM at 0.92: %+v", st.GPU)
		}
	})

	t.Run("backend reachable only through gpuhost", func(t *testing.T) {
		e.backendOnlyThroughGpuhost(t, "coder")
	})

	t.Run("reconcile after a hand-started backend", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		before := e.checkJournal(t, 0)
		e.logOnFailure(t, e.lastSeq(t))
		if out, err := e.sd.Systemctl(ctx, "start", e.cfg.Backends.Ollama.Unit); err != nil {
			t.Fatalf("%v %s", err, out)
		}
		e.waitState(t, "state follows the hand-started Ollama unit", 10*time.Second, func(s api.Status) bool {
			return s.State.Phase == api.PhaseActive && s.State.Unit == e.cfg.Backends.Ollama.Unit && s.State.Profile == "llama"
		})
		if got := e.isActive(t, e.cfg.Backends.VLLM.Unit); got != "inactive" {
			t.Errorf("vLLM unit %q after the Ollama unit was started by hand", got)
		}
		if out, err := e.sd.Systemctl(ctx, "stop", e.cfg.Backends.Ollama.Unit); err != nil {
			t.Fatalf("%v %s", err, out)
		}
		e.waitState(t, "idle after the hand stop", 10*time.Second, func(s api.Status) bool { return s.State.Phase == api.PhaseIdle })
		e.checkJournal(t, before+1)
	})

	t.Run("kill -9 mid-switch converges", func(t *testing.T) {
		before := e.checkJournal(t, 0)
		s := startSampler(t, e)
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		acc, err := e.client.Switch(ctx, api.SwitchRequest{Profile: "coder"})
		if err != nil {
			t.Fatal(err)
		}
		// Kill the daemon while the vLLM simulator is loading (1.5 s).
		err = e.client.Events(ctx, acc.Events, func(ev api.Event) bool {
			return !(ev.Kind == "step" && ev.Step == "ready" && ev.Status == "started")
		})
		if err != nil {
			t.Fatal(err)
		}
		if out, err := e.sd.Systemctl(ctx, "kill", "--signal=SIGKILL", "gpuhost.service"); err != nil {
			t.Fatalf("%v %s", err, out)
		}
		// systemd restarts it (Restart=on-failure); it reconciles and
		// finishes what was wanted.
		st := e.waitState(t, "converged on coder after kill -9", 45*time.Second, func(s api.Status) bool {
			return s.State.Phase == api.PhaseActive && s.State.Profile == "coder" && s.State.Step == ""
		})
		n := 0
		for _, u := range st.Units {
			if u.Active() {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%d backends active after convergence: %+v", n, st.Units)
		}
		// Through the daemon's /v1: the backend's own port is in its
		// private network.
		resp, err := http.Get(e.base + "/v1/models")
		if err != nil {
			t.Fatalf("backend not serving after convergence: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET /v1/models after convergence: %s", resp.Status)
		}
		out, _ := e.sd.Systemctl(ctx, "show", "-p", "NRestarts", "gpuhost.service")
		if strings.TrimSpace(out) == "NRestarts=0" {
			t.Errorf("gpuhost.service was not restarted by systemd: %s", out)
		}
		rep := s.stop(t)
		rep.log(t)
		if rep.Both != 0 {
			t.Errorf("two backends active during the crash recovery: %s", rep.First)
		}
		e.checkJournal(t, before+1)
	})
}

// backendOnlyThroughGpuhost checks, with profile active: its backend's port
// is not reachable from the host's network namespace (a TCP connect from
// this process and a curl POST /sleep from inside the private systemd,
// which shares that namespace, both fail), while the daemon's /v1 still
// reaches it through the unit's socket, and the backend was not changed.
func (e *e2e) backendOnlyThroughGpuhost(t *testing.T, profile string) {
	t.Helper()
	e.waitState(t, profile+" active", 30*time.Second, func(s api.Status) bool {
		return s.State.Phase == api.PhaseActive && s.State.Profile == profile && s.State.Step == ""
	})
	port := e.cfg.Profiles[profile].Port
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if c, err := net.DialTimeout("tcp", addr, 5*time.Second); err == nil {
		c.Close()
		t.Errorf("TCP connect to the backend's port %s from the host namespace succeeded", addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := e.sd.Command(ctx, "curl", "-sS", "--max-time", "5", "-X", "POST", "http://"+addr+"/sleep?level=1").CombinedOutput(); err == nil {
		t.Errorf("curl -X POST http://%s/sleep succeeded: %q", addr, out)
	}
	model := e.cfg.Profiles[profile].ServedModelName()
	body := `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST /v1/chat/completions through gpuhost: %v", err)
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"choices"`) {
		t.Errorf("POST /v1/chat/completions through gpuhost: %s %s", resp.Status, b)
	}
	st := e.waitState(t, profile+" still active", 10*time.Second, func(s api.Status) bool {
		return s.State.Phase == api.PhaseActive && s.State.Profile == profile
	})
	if st.State.Profile != profile {
		t.Errorf("state after the probes: %+v", st.State)
	}
}

// backendHTTP is a client of the backends as the daemon inside reaches
// them: the same loopback.Dialer, with each backend's socket reached from
// the host through the private systemd's root (/proc/<PID>/root/run/...).
func (e *e2e) backendHTTP(timeout time.Duration) *http.Client {
	sockets := map[int]string{}
	for port, path := range e.cfg.BackendSockets() {
		sockets[port] = e.sd.HostPath(path)
	}
	d := &loopback.Dialer{Sockets: sockets}
	return &http.Client{Timeout: timeout, Transport: &http.Transport{Proxy: nil, DialContext: d.DialContext}}
}
