package appliance

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/backend"
	"gpuhost/internal/testkit"
	"gpuhost/units"
)

// shortRelease makes the standby step give up after 3 s instead of 20 s,
// so a reloaded backend fails the test quickly instead of slowly.
func shortRelease(yaml func(bin, state string) string) func(bin, state string) string {
	return func(bin, state string) string {
		return strings.Replace(yaml(bin, state), "  release_timeout: 20s\n", "  release_timeout: 3s\n", 1)
	}
}

// requestsAfter lists the requests the simulator logged (its unit log is
// the order in which it answered them) after the last line containing
// marker.
func requestsAfter(t *testing.T, f *procFixture, unit, marker string) (after []string, found bool) {
	t.Helper()
	lines, err := f.sup.journal(context.Background(), unit, 10000)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range lines {
		switch {
		case strings.Contains(l, marker):
			after, found = nil, true
		case found && strings.Contains(l, "msg=request"):
			after = append(after, l)
		}
	}
	return after, found
}

// The race that once turned a 0.2 s wake into a 20 s stall: the doctor's tool-call probe is under way on the
// active Ollama when a switch to the vLLM starts; the probe's chat request
// must not reach Ollama after the standby step unloaded it (it loads the
// model again, and the step waits out its release timeout, then stops the
// unit). The hook holds the probe just before its first request until
// Ollama has unloaded: without leases the probe then sends it, with them
// the switch has already cut it.
func TestDoctorProbeNeverReloadsABackendGoingToStandby(t *testing.T) {
	f := newProcFixtureYAML(t, shortRelease(standbyYAML(t)))
	awaitReconciled(t, f.sup)
	for _, p := range []string{"coder", "llama"} {
		if evs, err := f.switchTo(t, p); err != nil {
			t.Fatalf("switch to %s: %v\n%s", p, err, describe(evs))
		}
	}
	ollama := f.cfg.Profiles["llama"]
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	toolProbeHook = func(ctx context.Context) {
		entered <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
	}
	t.Cleanup(func() { toolProbeHook = nil })
	reports := make(chan api.DoctorReport, 1)
	go func() {
		reports <- (&Doctor{Cfg: f.cfg, GPU: f.gpu, Units: f.sup.units, Gate: f.sup}).Run(context.Background())
	}()
	<-entered // endpoint.health passed; the tool-call probe is about to send

	since := f.sup.LastSeq()
	id, done, err := f.sup.Switch(context.Background(), "coder", api.SwitchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Ollama has unloaded the model: only now may the held probe go on.
	be, err := f.sup.engineOf(ollama)
	if err != nil {
		t.Fatal(err)
	}
	if !testkit.Poll(30*time.Second, func() bool {
		asleep, err := be.(backend.Sleeper).Sleeping(context.Background())
		return err == nil && asleep
	}) {
		t.Fatal("Ollama did not unload for the standby step")
	}
	close(release)
	evs := collect(t, f.sup, since, id, 60*time.Second)
	if err := <-done; err != nil {
		t.Fatalf("switch to coder: %v%s", err, describe(evs))
	}
	rep := <-reports

	after, found := requestsAfter(t, f, f.cfg.Backends.Ollama.Unit, "path=/api/generate")
	if !found {
		t.Fatal("the simulator logged no unload (POST /api/generate)")
	}
	for _, l := range after {
		if strings.Contains(l, "/v1/chat/completions") {
			t.Errorf("a probe reached Ollama after its unload: %s", l)
		}
	}
	if got := strings.Join(stepsOf(evs), " "); got != "standby wake ready verify wake_check" {
		t.Errorf("llama → coder steps = %q, want standby and wake only (no stop after a reload)%s", got, describe(evs))
	}
	if st := f.sup.State(); len(st.Standby) != 1 || st.Standby[0].Profile != "llama" {
		t.Errorf("llama is not in standby after the switch: %+v", st.Standby)
	}
	c, ok := checkByID(rep, "endpoint.tool_calls", "llama")
	if !ok || c.Severity != units.SeverityOK || !strings.Contains(c.Message, "switching to coder") {
		t.Errorf("endpoint.tool_calls cut by the switch = %+v, want ok naming the switch", c)
	}
}

// A lease is refused while a switch runs and for a profile that is not
// the active one, and a starting switch cancels the leases out.
func TestLeaseProbeRefusesAndIsRevoked(t *testing.T) {
	f := newProcFixtureYAML(t, standbyYAML(t))
	awaitReconciled(t, f.sup)
	if evs, err := f.switchTo(t, "coder"); err != nil {
		t.Fatalf("switch to coder: %v%s", err, describe(evs))
	}
	var ref *ProbeRefused
	if _, _, err := f.sup.LeaseProbe(context.Background(), "llama"); !errors.As(err, &ref) || ref.Switching {
		t.Errorf("lease for the profile that does not run: %v", err)
	}
	ctx, done, err := f.sup.LeaseProbe(context.Background(), "coder")
	if err != nil {
		t.Fatalf("lease on the active profile: %v", err)
	}
	defer done()
	since := f.sup.LastSeq()
	id, swDone, err := f.sup.Switch(context.Background(), "llama", api.SwitchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ctx.Err() == nil {
		t.Error("the lease was not revoked when the switch started")
	}
	if _, _, err := f.sup.LeaseProbe(context.Background(), "coder"); !errors.As(err, &ref) || !ref.Switching || ref.Target != "llama" {
		t.Errorf("lease during the switch: %v", err)
	}
	done() // the probe returns: the switch's wait for it ends
	evs := collect(t, f.sup, since, id, 60*time.Second)
	if err := <-swDone; err != nil {
		t.Fatalf("switch to llama: %v%s", err, describe(evs))
	}
	// coder is in standby now: no lease for it either.
	if _, _, err := f.sup.LeaseProbe(context.Background(), "coder"); !errors.As(err, &ref) || ref.Switching {
		t.Errorf("lease on the profile in standby: %v", err)
	}
}

// A probe that ignores its revoked lease does not hold a switch up longer
// than probeRevokeWait: the switch goes ahead.
func TestSwitchDoesNotWaitOnAProbe(t *testing.T) {
	f := newProcFixtureYAML(t, standbyYAML(t))
	awaitReconciled(t, f.sup)
	if evs, err := f.switchTo(t, "coder"); err != nil {
		t.Fatalf("switch to coder: %v%s", err, describe(evs))
	}
	_, done, err := f.sup.LeaseProbe(context.Background(), "coder")
	if err != nil {
		t.Fatal(err)
	}
	// done is called only after the switch: the probe never returns.
	evs, err := f.switchTo(t, "llama")
	done()
	if err != nil {
		t.Fatalf("switch to llama with a stuck probe: %v%s", err, describe(evs))
	}
	if st := f.sup.State(); st.Profile != "llama" {
		t.Errorf("state after the switch: %+v", st)
	}
}

// During a switch (also the first one, right after the daemon starts) the
// endpoint checks say "switching to X (step …)" instead of failing.
func TestDoctorDuringASwitchSaysSwitching(t *testing.T) {
	f := newProcFixtureYAML(t, func(bin, state string) string {
		// vLLM's load takes a minute: the switch is still loading
		// while the doctor runs; the test's end cuts it.
		return testConfigYAML(bin, state, "process", "", testkit.FreePort(t), testkit.FreePort(t), "60s")
	})
	awaitReconciled(t, f.sup)
	if _, _, err := f.sup.Switch(context.Background(), "coder", api.SwitchOptions{}); err != nil {
		t.Fatal(err)
	}
	rep := (&Doctor{Cfg: f.cfg, GPU: f.gpu, Units: f.sup.units, Gate: f.sup}).Run(context.Background())
	c, ok := checkByID(rep, "endpoint.health", "")
	if !ok || c.Severity != units.SeverityOK || !strings.HasPrefix(c.Message, "switching to coder (step ") {
		t.Errorf("endpoint.health during the switch = %+v", c)
	}
	if c, _ := checkByID(rep, "state.last_wanted", ""); c.Severity != units.SeverityOK || !strings.HasPrefix(c.Message, "switching to coder (step ") {
		t.Errorf("state.last_wanted during the switch = %+v", c)
	}
	for _, c := range rep.Checks {
		if c.Severity == units.SeverityFail && !strings.HasPrefix(c.ID, "profile.") {
			t.Errorf("%s fails during a switch: %s", c.ID, c.Message)
		}
	}
}

// After the README's walk-through (to coder, to llama, back to coder) the
// doctor checks the active coder's endpoint and llama's standby, and all
// agree.
func TestDoctorAfterStandbyWalkThrough(t *testing.T) {
	f := newProcFixtureYAML(t, standbyYAML(t))
	awaitReconciled(t, f.sup)
	for _, p := range []string{"coder", "llama", "coder"} {
		if evs, err := f.switchTo(t, p); err != nil {
			t.Fatalf("switch to %s: %v%s", p, err, describe(evs))
		}
	}
	rep := (&Doctor{Cfg: f.cfg, GPU: f.gpu, Units: f.sup.units, Gate: f.sup, Exclusion: f.sup.Exclusion}).Run(context.Background())
	want := []struct{ id, profile, in string }{
		{"endpoint.health", "coder", "serving qwen3-coder"},
		{"endpoint.tool_calls", "coder", "structured tool_calls"},
		{"endpoint.context", "coder", "tokens of context"},
		{"units.exclusive", "", "in standby: " + f.cfg.Backends.Ollama.Unit + " (llama, unload)"},
		{"units.drift", "coder", "not counted, gpuhost adds them for standby: --enable-sleep-mode --host 127.0.0.1, and VLLM_SERVER_DEV_MODE=1"},
		{"state.last_wanted", "", "the last wanted profile coder runs"},
		{"standby.asleep", "llama", "is unloaded as recorded (unload"},
		{"standby.residual", "llama", "at or below its residual 0 MiB"},
		{"standby.residual_plausible", "llama", "within 1024 MiB"},
		{"standby.exclusion", "", "no backend in standby"},
	}
	for _, w := range want {
		c, ok := checkByID(rep, w.id, w.profile)
		if !ok || c.Severity != units.SeverityOK || !strings.Contains(c.Message, w.in) {
			t.Errorf("%s[%s] = %+v, want ok with %q", w.id, w.profile, c, w.in)
		}
	}
	for _, c := range rep.Checks {
		if strings.HasPrefix(c.ID, "endpoint.") && c.Profile == "llama" {
			t.Errorf("endpoint check on the backend in standby: %+v", c)
		}
		if strings.Contains(c.Fix, "gpuhost switch coder") {
			t.Errorf("%s suggests switching to the active profile: %s", c.ID, c.Fix)
		}
	}

	// And the other way round: llama active, coder (vLLM) asleep.
	if evs, err := f.switchTo(t, "llama"); err != nil {
		t.Fatalf("switch to llama: %v%s", err, describe(evs))
	}
	rep = (&Doctor{Cfg: f.cfg, GPU: f.gpu, Units: f.sup.units, Gate: f.sup}).Run(context.Background())
	for _, w := range []struct{ id, profile, in string }{
		{"endpoint.health", "llama", "serving"},
		{"standby.asleep", "coder", "is asleep as recorded (sleep1"},
		{"standby.residual", "coder", "at or below its residual"},
		{"standby.residual_plausible", "coder", "within"},
		{"state.last_wanted", "", "the last wanted profile llama runs"},
	} {
		c, ok := checkByID(rep, w.id, w.profile)
		if !ok || c.Severity != units.SeverityOK || !strings.Contains(c.Message, w.in) {
			t.Errorf("%s[%s] = %+v, want ok with %q", w.id, w.profile, c, w.in)
		}
	}
}

func TestLogAndRestartHintsNameTheRunner(t *testing.T) {
	f := newProcFixtureYAML(t, standbyYAML(t))
	unit := f.cfg.Backends.VLLM.Unit
	if h := logHint(f.cfg, unit); !strings.Contains(h, f.cfg.StateDir+"/logs/gpuhost-vllm.log") || strings.Contains(h, "journalctl") {
		t.Errorf("process runner log hint = %q", h)
	}
	sd := *f.cfg
	sd.Systemd.Runner = "systemd"
	if h := logHint(&sd, unit); h != "its log: `journalctl -u "+unit+"`" {
		t.Errorf("systemd log hint = %q", h)
	}
	for _, tt := range []struct {
		runner    string
		inStandby bool
		want      string
	}{
		{"systemd", false, "systemctl restart " + unit},
		{"systemd", true, "systemctl stop " + unit},
		{"process", false, "restart `gpuhost demo`"},
	} {
		c := *f.cfg
		c.Systemd.Runner = tt.runner
		if h := restartHint(&c, unit, tt.inStandby); !strings.Contains(h, tt.want) || strings.Contains(h, "gpuhost switch") && !strings.Contains(h, "only checks") {
			t.Errorf("restartHint(%s, standby %v) = %q, want %q", tt.runner, tt.inStandby, h, tt.want)
		}
	}
}

func TestPlausibleResidual(t *testing.T) {
	f := newProcFixtureYAML(t, standbyYAML(t))
	llama, coder := f.cfg.Profiles["llama"], f.cfg.Profiles["coder"]
	for _, tt := range []struct {
		p     *units.Profile
		mode  units.Standby
		total uint64
		res   uint64
		ok    bool
	}{
		{llama, units.StandbyUnload, 24564, 0, true},
		{llama, units.StandbyUnload, 24564, 6200, false},
		{coder, units.StandbySleep1, 24564, 512, true},
		{coder, units.StandbySleep1, 24564, 16000, false}, // vLLM 32714's regression
	} {
		limit, why := plausibleResidual(f.cfg, tt.p, tt.mode, tt.total)
		if got := limit > 0 && tt.res <= limit; got != tt.ok {
			t.Errorf("%s %s residual %d: limit %d (%s), plausible %v, want %v", tt.p.Name, tt.mode, tt.res, limit, why, got, tt.ok)
		}
	}
}
