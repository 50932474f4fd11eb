package simulator

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"gpuhost/config"
	"gpuhost/units"
)

// unitRun is what systemd would run for a profile of the example config
// (`gpuhost units render --example`): the environment from the unit's
// Environment= lines and the environment file gpuhost writes at the switch
// (the file's assignments win, as in systemd), and the arguments after the
// unit's program, with $GPUHOST_ARGS expanded.
type unitRun struct {
	unitEnv, fileEnv map[string]string
	args             []string
}

func renderExample(t *testing.T, profile string) unitRun {
	t.Helper()
	cfg, err := config.Parse("example config", config.Example)
	if err != nil {
		t.Fatal(err)
	}
	p := cfg.Profiles[profile]
	var bu units.BackendUnit
	for _, u := range cfg.BackendUnits() {
		if u.Backend == p.Backend {
			bu = u
		}
	}
	uf, err := units.ParseUnitFile(units.RenderBackendUnit(bu))
	if err != nil {
		t.Fatal(err)
	}
	r := unitRun{unitEnv: map[string]string{}, fileEnv: units.ParseEnvFile(units.EnvFile(*p, false))}
	for _, line := range uf.Values("Service", "Environment") {
		for _, kv := range strings.Fields(line) {
			k, v, _ := strings.Cut(kv, "=")
			r.unitEnv[k] = v
		}
	}
	exec, _ := uf.Value("Service", "ExecStart")
	words, err := units.SplitExecStart(exec)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range words[1:] {
		if w == "$"+units.EnvArgs {
			r.args = append(r.args, strings.Fields(r.fileEnv[units.EnvArgs])...)
		} else {
			r.args = append(r.args, w)
		}
	}
	return r
}

// environ merges the unit's and the file's environment without drop.
func (r unitRun) environ(drop ...string) func(string) string {
	m := map[string]string{"INVOCATION_ID": "0123456789abcdef"} // run by systemd
	for _, src := range []map[string]string{r.unitEnv, r.fileEnv} {
		for k, v := range src {
			if !slices.Contains(drop, k) {
				m[k] = v
			}
		}
	}
	return env(m)
}

// TestFencedUnitNeedsOfflineSettings starts the simulator as the fenced
// units of the example config run it: by systemd, in a network namespace
// with only loopback (--network auto decides "fenced"), with exactly the
// unit's and the environment file's variables. It starts and answers; with
// the offline settings taken out of both it refuses and says which are
// missing. Each of the two places carries the whole set on its own, so a
// change that drops them from either fails here.
func TestFencedUnitNeedsOfflineSettings(t *testing.T) {
	saved := onlyLoopback
	onlyLoopback = func() bool { return true }
	t.Cleanup(func() { onlyLoopback = saved })
	for _, tt := range []struct {
		profile string
		flavor  string
		health  string
	}{
		{"qwen3-coder", "vllm", "/health"},
		{"llama3-8b", "ollama", "/api/version"},
	} {
		t.Run(tt.flavor, func(t *testing.T) {
			r := renderExample(t, tt.profile)
			for _, place := range []struct {
				name string
				env  map[string]string
			}{{"unit Environment=", r.unitEnv}, {"environment file", r.fileEnv}} {
				if m := units.MissingOffline(units.Backend(tt.flavor), env(place.env)); len(m) > 0 {
					t.Errorf("the %s of the rendered %s unit lacks %v", place.name, tt.flavor, m)
				}
			}
			o, err := ParseArgs(tt.flavor, r.args, r.environ())
			if err != nil {
				t.Fatalf("ParseArgs with the rendered unit's environment: %v", err)
			}
			o.LoadTime = 10 * time.Millisecond
			s := startSim(t, o)
			if code, body, _ := s.do(t, http.MethodGet, tt.health, nil); code != http.StatusOK {
				t.Errorf("GET %s: %d %s", tt.health, code, body)
			}

			var names []string
			for _, e := range units.OfflineEnv(units.Backend(tt.flavor)) {
				names = append(names, e.Name)
			}
			_, err = ParseArgs(tt.flavor, r.args, r.environ(names...))
			if err == nil {
				t.Fatalf("ParseArgs without %v in a fenced unit: started, want a refusal", names)
			}
			for _, want := range append([]string{"refuses to start", "fenced", "gpuhost units install"}, names...) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("refusal %q does not say %q", err, want)
				}
			}
		})
	}
}

// TestNetworkModes: only a fenced network asks for the settings; auto is
// fenced only under systemd with nothing but loopback.
func TestNetworkModes(t *testing.T) {
	saved := onlyLoopback
	t.Cleanup(func() { onlyLoopback = saved })
	offline := map[string]string{"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "true", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "yes"}
	for _, tt := range []struct {
		name        string
		args        []string
		systemd, lo bool
		env         map[string]string
		wantErr     string
	}{
		{"auto outside systemd", nil, false, true, nil, ""},
		{"auto under systemd with a real interface", nil, true, false, nil, ""},
		{"auto under systemd, loopback only", nil, true, true, nil, "HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE, VLLM_NO_USAGE_STATS, DO_NOT_TRACK are not set"},
		{"auto under systemd, loopback only, offline", nil, true, true, offline, ""},
		{"fenced by flag", []string{"--network", "fenced"}, false, false, nil, "refuses to start"},
		{"fenced, one missing", []string{"--network=fenced"}, false, false, map[string]string{"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "0"}, "DO_NOT_TRACK is not set"},
		{"open by flag", []string{"--network", "open"}, true, true, nil, ""},
		{"unknown mode", []string{"--network", "closed"}, false, false, nil, `--network "closed"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			onlyLoopback = func() bool { return tt.lo }
			vars := map[string]string{}
			for k, v := range tt.env {
				vars[k] = v
			}
			if tt.systemd {
				vars["INVOCATION_ID"] = "x"
			}
			o, err := ParseArgs("vllm", append([]string{"serve", "Org/M"}, tt.args...), env(vars))
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("err %v, want a start", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("err %v, want one saying %q", err, tt.wantErr)
			case err == nil && o.Model != "Org/M":
				t.Errorf("model %q: --network leaked into the vLLM argv", o.Model)
			}
		})
	}
}
