package benchcmd

import (
	"encoding/json"
	"net"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"gpuhost/api"
	"gpuhost/appliance/appliancetest"
	"gpuhost/bench"
	"gpuhost/bench/benchapi"
	"gpuhost/config"
	"gpuhost/frontdoor/httpapi"
	v1proxy "gpuhost/frontdoor/proxy"
	"gpuhost/internal/testkit"
	"gpuhost/units"
)

// switchDaemon is a real daemon for `bench switch`: a Supervisor with
// simulator backends (profiles coder: vLLM qwen3-coder, llama: Ollama
// llama3.1:8b), the HTTP API with the bench service (its store under the
// fixture's state_dir, as serve wires it) and the /v1 proxy on one
// loopback server.
func switchDaemon(t *testing.T, opts appliancetest.Options) (*appliancetest.Fixture, string) {
	t.Helper()
	f := appliancetest.New(t, opts)
	e, err := httpapi.New(f.Sup, f.Doctor, f.Log)
	if err != nil {
		t.Fatal(err)
	}
	svc := benchapi.NewService(benchapi.ServiceOptions{
		Store:  bench.NewStore(f.Cfg.StateDir, f.Log),
		Daemon: benchapi.DaemonFuncs{SwitchingFunc: func() bool { return f.Sup.State().Phase == api.PhaseSwitching }, AwaitActiveFunc: f.Sup.AwaitActive},
		Log:    f.Log,
	})
	svc.Register(e)
	t.Cleanup(svc.Close)
	p := v1proxy.New(f.Sup, f.Cfg.Proxy, func() map[string]*units.Profile { return f.Cfg.Profiles }, f.Log)
	p.Register(e)
	srv := httptest.NewServer(e)
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		p.Close()
	})
	return f, srv.URL
}

// switchDeps finds the daemon by the command's --url, as package main's
// apiClient does, and keeps results in state.
func switchDeps(state string) Deps {
	return Deps{GpuhostVersion: "1.2.3", GpuhostCommit: "deadbeef",
		Env: func(*cobra.Command) (Env, error) { return Env{StateDir: state}, nil },
		Daemon: func(cmd *cobra.Command) (*api.Client, error) {
			u, _ := cmd.Flags().GetString("url")
			return api.NewClient(u, ""), nil
		}}
}

const autoSwitchOn = "proxy:\n  auto_switch: true\n"

// TestBenchSwitch runs `bench switch coder llama` against a real daemon
// that starts idle: coder is made active first, then every round has
// coder→llama and llama→coder on the switch path, then on the request
// path (auto_switch), each a cold switch whose first token comes after the
// switch was accepted; the result is stored, shown, listed and compared.
func TestBenchSwitch(t *testing.T) {
	f, url := switchDaemon(t, appliancetest.Options{ExtraYAML: autoSwitchOn})
	state := t.TempDir()
	deps := switchDeps(state)
	const rounds = 2
	out, errOut, err := runCmd(t, deps, "switch", "coder", "llama", "--rounds", "2", "--json", "--url", url)
	if err != nil {
		t.Fatalf("bench switch: %v\n%s\n%s", err, out, errOut)
	}
	var r bench.Result
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("--json output: %v\n%s", err, out)
	}
	sb := r.Switch
	if r.Status != bench.StatusOK || r.Kind() != bench.KindSwitch || sb == nil || sb.RequestPath != bench.RequestPathMeasured || r.SchemaVersion != bench.SchemaVersion {
		t.Fatalf("result %+v", r)
	}
	if len(sb.Profiles) != 2 || sb.Profiles[0].Name != "coder" || sb.Profiles[0].ServedName != "qwen3-coder" ||
		sb.Profiles[1].Backend != "ollama" || sb.Profiles[1].ServedName != "llama3.1:8b" || len(sb.Profiles[0].Args) == 0 {
		t.Errorf("profiles %+v", sb.Profiles)
	}
	fp := r.Fingerprint
	if fp.Profile != "coder,llama" || fp.Backend != "vllm,ollama" || fp.URL != url+"/v1" || fp.GPUBackend != "sim" || fp.GpuhostCommit != "deadbeef" {
		t.Errorf("fingerprint %+v", fp)
	}
	if !slices.ContainsFunc(r.Notes, func(n string) bool { return strings.Contains(n, "coder was made active before the first round") }) {
		t.Errorf("notes %q lack the unmeasured first switch", r.Notes)
	}
	// Order: per round the switch path both ways, then the request path.
	type shape struct {
		round          int
		from, to, path string
	}
	var want []shape
	for round := 1; round <= rounds; round++ {
		for _, path := range []string{bench.PathSwitch, bench.PathRequest} {
			want = append(want, shape{round, "coder", "llama", path}, shape{round, "llama", "coder", path})
		}
	}
	var got []shape
	ids := map[string]bool{}
	for _, s := range sb.Samples {
		got = append(got, shape{s.Round, s.From, s.To, s.Path})
		if s.Mode != bench.ModeCold {
			t.Errorf("sample %+v: mode %q, want cold", s, s.Mode)
		}
		steps := make([]string, len(s.Steps))
		for i, st := range s.Steps {
			steps[i] = st.Step
			if st.Status != "done" {
				t.Errorf("sample %+v: step %+v", s, st)
			}
		}
		wantSteps := []string{"stop", "vram_release", "configure", "start", "ready", "verify", "wake_check"}
		if s.To == "llama" {
			wantSteps = []string{"stop", "vram_release", "configure", "start", "ready", "load_model", "verify", "wake_check"}
		}
		if !slices.Equal(steps, wantSteps) {
			t.Errorf("sample %d %s→%s %s: steps %q, want %q", s.Round, s.From, s.To, s.Path, steps, wantSteps)
		}
		if s.SwitchID == "" || ids[s.SwitchID] {
			t.Errorf("sample %+v: switch id missing or repeated", s)
		}
		ids[s.SwitchID] = true
		if !(s.FirstTokenMS > 0 && s.SwitchMS > 0) {
			t.Errorf("sample %+v: no first token or switch time", s)
		}
		switch s.Path {
		case bench.PathSwitch:
			if !(s.AcceptedMS > 0 && s.FirstTokenMS > s.AcceptedMS) {
				t.Errorf("sample %+v: the first token is not after the switch was accepted", s)
			}
		case bench.PathRequest:
			if s.AcceptedMS != 0 {
				t.Errorf("request path sample %+v has an accepted time", s)
			}
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("samples %+v\nwant %+v", got, want)
	}
	// Groups: direction × path, each with one sample per round.
	var groups []string
	for _, g := range sb.Groups {
		groups = append(groups, g.From+">"+g.To+" "+g.Path+" "+g.Mode)
		if g.N != rounds || g.FirstTokenMS.N != rounds || g.SwitchMS.N != rounds || g.FirstTokenMS.P95 < g.FirstTokenMS.P50 {
			t.Errorf("group %+v", g)
		}
	}
	if w := []string{"coder>llama switch cold", "coder>llama request cold", "llama>coder switch cold", "llama>coder request cold"}; !slices.Equal(groups, w) {
		t.Errorf("groups %q, want %q", groups, w)
	}
	if st := f.Sup.State(); st.Phase != api.PhaseActive || st.Profile != "coder" {
		t.Errorf("the daemon ends %+v, want coder active", st)
	}

	// Stored in the daemon's store (where bench run's results go), nothing
	// in the local folder, and shown, listed and compared by the other
	// commands through the daemon's API (--url, as every daemon command).
	all, _, err := bench.NewStore(f.Cfg.StateDir, nil).List()
	if err != nil || len(all) != 1 || all[0].ID != r.ID || len(all[0].Switch.Samples) != 4*rounds {
		t.Fatalf("the daemon's store: %v %d results", err, len(all))
	}
	if local, _, _ := bench.NewStore(state, nil).List(); len(local) != 0 {
		t.Errorf("%d results also stored in the local folder", len(local))
	}
	out, errOut, err = runCmd(t, deps, "show", r.ID, "--url", url)
	for _, w := range []string{r.ID + "  OK", "coder (vllm qwen3-coder) ↔ llama (ollama llama3.1:8b)", "first token", "coder → llama  switch   cold  2",
		"llama → coder  request  cold  2", "mode: standby when the switch had a wake step"} {
		if err != nil || !strings.Contains(out, w) {
			t.Errorf("show: %v; output lacks %q:\n%s", err, w, out)
		}
	}
	if strings.Contains(errOut, "local store") {
		t.Errorf("show read the local store with a daemon at --url: %s", errOut)
	}
	out, _, err = runCmd(t, deps, "list", "--url", url)
	if err != nil || !strings.Contains(out, r.ID) || !strings.Contains(out, "switch vllm↔ollama") {
		t.Errorf("list: %v\n%s", err, out)
	}
	out, _, err = runCmd(t, deps, "compare", r.ID, r.ID, "--min-repeats", "2", "--url", url)
	if err != nil || !strings.Contains(out, "switch.coder->llama.switch_path.cold.first_token_ms (ms)") ||
		!strings.Contains(out, "switch.llama->coder.request_path.cold.switch_ms (ms)") {
		t.Errorf("compare: %v\n%s", err, out)
	}
}

// TestBenchSwitchAutoSwitchOff: with proxy.auto_switch off the request
// path is skipped with a note and the switch path still measured.
func TestBenchSwitchAutoSwitchOff(t *testing.T) {
	f, url := switchDaemon(t, appliancetest.Options{Activate: "coder"})
	state := t.TempDir()
	out, errOut, err := runCmd(t, switchDeps(state), "switch", "coder", "llama", "--rounds", "1", "--url", url)
	if err != nil {
		t.Fatalf("bench switch: %v\n%s\n%s", err, out, errOut)
	}
	for _, w := range []string{"  OK  ", "request path not measured: the daemon's proxy.auto_switch is off", "coder → llama  switch", "saved "} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	if n := strings.Count(out, "proxy.auto_switch is off"); n != 1 {
		t.Errorf("the skipped request path is said %d times, want once:\n%s", n, out)
	}
	if strings.Contains(out, "made active before") {
		t.Errorf("coder was active, yet a first switch was made:\n%s", out)
	}
	if !strings.Contains(out, "saved "+url+"/api/bench/") || !strings.Contains(out, "(the daemon's store)") {
		t.Errorf("not saved in the daemon's store:\n%s", out)
	}
	r, err := bench.NewStore(f.Cfg.StateDir, nil).Load("latest")
	if err != nil {
		t.Fatal(err)
	}
	sb := r.Switch
	if r.Status != bench.StatusOK || sb.RequestPath != bench.RequestPathSkipped || !strings.Contains(sb.RequestPathNote, "auto_switch is off") || len(sb.Samples) != 2 {
		t.Fatalf("result: %s %s %q, %d samples", r.Status, sb.RequestPath, sb.RequestPathNote, len(sb.Samples))
	}
	for _, s := range sb.Samples {
		if s.Path != bench.PathSwitch {
			t.Errorf("sample %+v on the request path", s)
		}
	}
}

// TestBenchSwitchFailures: a switch that fails names the profiles, the
// round, the path and the step, with exit status 2 (nothing measured);
// bad arguments are usage errors; a daemon that does not answer fails.
func TestBenchSwitchFailures(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// Profile broken's port is taken, so its backend cannot come up and
	// the Supervisor rolls back to coder.
	_, url := switchDaemon(t, appliancetest.Options{Activate: "coder", ExtraYAML: autoSwitchOn, Hook: func(c *config.Config) {
		broken := *c.Profiles["coder"]
		broken.Name, broken.ServedName, broken.Port = "broken", "broken-model", ln.Addr().(*net.TCPAddr).Port
		c.Profiles["broken"] = &broken
	}})
	state := t.TempDir()
	deps := switchDeps(state)
	for _, c := range []struct {
		args []string
		want []string
		code int
	}{
		{[]string{"switch", "coder", "broken", "--rounds", "1", "--url", url},
			[]string{"bench switch failed: coder → broken (round 1, switch path): switch ", "the switch failed at step "}, 1},
		{[]string{"switch", "coder", "nope", "--url", url}, []string{`no such profile on the daemon: "nope"`, "coder, coder-greedy"}, 64},
		{[]string{"switch", "coder", "coder", "--url", url}, []string{"are the same"}, 64},
		{[]string{"switch", "coder", "llama", "--rounds", "0", "--url", url}, []string{"rounds 0"}, 64},
		{[]string{"switch", "coder", "--url", url}, []string{"accepts 2 arg"}, 64},
		{[]string{"switch", "coder", "llama", "--url", "http://" + testkit.FreeAddr(t)}, []string{"bench switch failed: read the daemon's status", "reach gpuhost"}, 69},
	} {
		out, _, err := runCmd(t, deps, c.args...)
		if err == nil || exitOf(err) != c.code {
			t.Errorf("%v: err %v, want exit status %d\n%s", c.args, err, c.code, out)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: error %q lacks %q", c.args, err, w)
			}
		}
	}
	if all, _, _ := bench.NewStore(state, nil).List(); len(all) != 0 {
		t.Errorf("%d failed results stored", len(all))
	}
}
