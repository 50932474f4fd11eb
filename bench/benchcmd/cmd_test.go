package benchcmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"gpuhost/bench"
	"gpuhost/bench/benchtest"
	"gpuhost/internal/testbin"
	"gpuhost/internal/testkit"
	"gpuhost/nvml"
	"gpuhost/simulator"
	"gpuhost/units"
)

func runCmd(t *testing.T, deps Deps, args ...string) (string, string, error) {
	t.Helper()
	cmd := NewCmd(deps)
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), errOut.String(), err
}

var quickFlags = []string{"--repeats", "2", "--prefill", "64", "--decode", "16", "--concurrency", "2", "--serving-requests", "2",
	"--serving-input", "32", "--serving-output", "8"}

func TestCmdRunListShowCompare(t *testing.T) {
	url := startSim(t, simulator.Options{Flavor: simulator.FlavorVLLM, Model: "m", PrefillTPS: 1e6, DecodeTPS: 3000})
	state := t.TempDir()
	p := &units.Profile{Name: "coder", Backend: units.VLLM, Model: "m", Port: 1,
		Params: units.ModelParams{TotalParamsB: 30.5, ActiveParamsB: 3.3, WeightBits: 4, Layers: 48, KVHeads: 4, HeadDim: 128}}
	sim := nvml.NewSim(nvml.SimConfig{})
	deps := Deps{GpuhostVersion: "1.2.3", GpuhostCommit: "deadbeef", Env: func(*cobra.Command) (Env, error) {
		return Env{StateDir: state, Profiles: map[string]*units.Profile{"coder": p}, GPU: sim.Snapshot,
			Active: func(context.Context) (bench.Target, *units.Profile, error) {
				return bench.Target{URL: url + "/v1", ServerURL: url, Model: "m"}, p, nil
			}}, nil
	}}
	// Default target: the daemon's /v1 on the active profile.
	out, _, err := runCmd(t, deps, append([]string{"run"}, quickFlags...)...)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out)
	}
	for _, want := range []string{"-coder  OK", "backend vllm 0.11.0", "server settings: vllm.cache_config.block_size=16", "NVIDIA GeForce RTX 4090", "prefill", "decode", "serving",
		"pp64 |", "tg16 |", "TTFT mean | TTFT p50 | TTFT p99",
		"roofline: 1008 GB/s, 3.3B params", "cross-checks", "saved " + filepath.Join(state, "bench")} {
		if !strings.Contains(out, want) {
			t.Errorf("run output lacks %q:\n%s", want, out)
		}
	}
	// --url with --profile for the roofline, JSON out.
	out, _, err = runCmd(t, deps, append([]string{"run", "--url", url, "--profile", "coder", "--json"}, quickFlags...)...)
	if err != nil {
		t.Fatal(err)
	}
	var r bench.Result
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.Roofline == nil || r.Fingerprint.GpuhostCommit != "deadbeef" {
		t.Fatalf("json run: %v %+v", err, r.Fingerprint)
	}
	out, _, err = runCmd(t, deps, "list")
	if err != nil || strings.Count(out, "-coder") != 2 || !strings.Contains(out, "610.43.02") {
		t.Fatalf("list: %v\n%s", err, out)
	}
	out, _, err = runCmd(t, deps, "show", r.ID)
	if err != nil || !strings.Contains(out, r.ID) || !strings.Contains(out, "decode") {
		t.Fatalf("show: %v\n%s", err, out)
	}
	all, _, _ := bench.NewStore(state, nil).List()
	out, _, err = runCmd(t, deps, "compare", all[0].ID, all[1].ID)
	if err != nil || !strings.Contains(out, "decode.16.tok_s") || !strings.Contains(out, "Welch") {
		t.Fatalf("compare: %v\n%s", err, out)
	}
	out, _, err = runCmd(t, deps, "compare", all[0].ID, all[1].ID, "--json")
	var c bench.Comparison
	if err != nil || json.Unmarshal([]byte(out), &c) != nil || len(c.Rows) == 0 {
		t.Fatalf("compare --json: %v\n%s", err, out)
	}
	// A corrupt file: list warns on stderr and goes on.
	if err := os.WriteFile(filepath.Join(state, "bench", "20200101T000000Z-x.json"), []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, err := runCmd(t, deps, "list", "--json")
	var lr bench.ListResponse
	if err != nil || json.Unmarshal([]byte(out), &lr) != nil || len(lr.Results) != 2 || len(lr.Warnings) != 1 ||
		!strings.Contains(errOut, "20200101T000000Z-x.json") {
		t.Fatalf("list with a corrupt file: %v\n%s\n%s", err, out, errOut)
	}
}

func TestCmdErrors(t *testing.T) {
	dir := t.TempDir()
	noConfig := Deps{Env: func(*cobra.Command) (Env, error) {
		return Env{}, errors.New("open /etc/gpuhost/gpuhost.yaml: no such file")
	}}
	for _, c := range []struct {
		args []string
		want string
		code int
	}{
		{[]string{"run"}, "no --url given", 1},
		{[]string{"run", "--url", "http://127.0.0.1:1", "--dir", dir, "--flavor", "tgi"}, "--flavor", 64},
		{[]string{"run", "--url", "http://127.0.0.1:1", "--dir", dir, "--profile", "x"}, "no such profile", 64},
		{[]string{"run", "--url", "http://127.0.0.1:1", "--dir", dir, "--api-key-env", "GPUHOST_TEST_UNSET_KEY"}, "GPUHOST_TEST_UNSET_KEY", 64},
		{[]string{"run", "--url", "http://127.0.0.1:1", "--dir", dir, "--repeats", "-1"}, "repeats -1", 64},
		{[]string{"run", "--url", "http://127.0.0.1:1", "--dir", dir, "--no-such-flag"}, "unknown flag", 64},
		{[]string{"run", "--url", "http://127.0.0.1:1", "--dir", dir, "--repeats", "1"}, "endpoint down", 69},
		{[]string{"show", "nope", "--dir", dir}, "no such bench result", 64},
		{[]string{"show", "--dir", dir}, "accepts 1 arg", 64},
		{[]string{"compare", "a", "b", "--dir", dir, "--alpha", "2"}, "--alpha", 64},
		{[]string{"compare", "a", "b", "--dir", dir, "--min-repeats", "1"}, "--min-repeats", 64},
		{[]string{"compare", "a", "--dir", dir}, "accepts 2 arg", 64},
	} {
		_, _, err := runCmd(t, noConfig, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) || exitOf(err) != c.code {
			t.Errorf("%v: err %v, want %q with exit status %d", c.args, err, c.want, c.code)
		}
	}
	// The failed run above was not stored.
	if all, _, _ := (&bench.Store{Dir: dir}).List(); len(all) != 0 {
		t.Fatalf("a failed run was stored: %+v", all)
	}
}

// TestCmdExitStatus runs the real gpuhost binary: each outcome of `bench
// run` ends with the status of gpuhost's one exit-code contract (a failed
// run is 1, or 69 when the endpoint is unreachable), failed runs are
// stored only with --keep-failed, and compare refuses them.
func TestCmdExitStatus(t *testing.T) {
	const exitUnavailable = 69 // gpuhost's contract: the endpoint is unreachable
	bin := testbin.Binary(t)
	vllm := startSim(t, simulator.Options{Flavor: simulator.FlavorVLLM, Model: "m", PrefillTPS: 1e6, DecodeTPS: 3000})
	flaky := benchtest.StartProxy(t, vllm, &benchtest.Proxy{Respond: func(n int64, w http.ResponseWriter) bool {
		if n < 4 || n%4 != 0 {
			return false
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte(`{"error":{"message":"CUDA error: out of memory"}}`))
		return true
	}})
	closed := "http://" + testkit.FreeAddr(t)
	dir := t.TempDir()
	quick := []string{"--dir", dir, "--repeats", "3", "--prefill", "64", "--decode", "16", "--phases", "prefill,decode"}
	gpuhost := func(args ...string) (string, int) {
		t.Helper()
		out, err := exec.Command(bin, append([]string{"bench"}, args...)...).CombinedOutput()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return string(out), 0
		case errors.As(err, &ee):
			return string(out), ee.ExitCode()
		}
		t.Fatalf("gpuhost bench %v: %v", args, err)
		return "", 0
	}
	stored := func() []*bench.Result {
		all, _, err := (&bench.Store{Dir: dir}).List()
		if err != nil {
			t.Fatal(err)
		}
		return all
	}
	for _, c := range []struct {
		name   string
		args   []string
		code   int
		want   string
		stored int // results in the store afterwards
	}{
		{"ok", append([]string{"run", "--url", vllm}, quick...), 0, "saved ", 1},
		{"partial", append([]string{"run", "--url", flaky}, quick...), 1, "bench run partial", 2},
		{"failed: endpoint down", append([]string{"run", "--url", closed}, quick...), exitUnavailable, "not saved: the run failed", 2},
		{"failed, kept", append([]string{"run", "--url", closed, "--keep-failed"}, quick...), exitUnavailable, "saved ", 3},
		{"usage", append([]string{"run", "--url", vllm, "--flavor", "tgi"}, quick...), 64, "--flavor", 3},
		{"usage: unknown flag", []string{"list", "--bogus"}, 64, "unknown flag", 3},
		{"usage: serving API", append([]string{"run", "--url", vllm, "--serving-api", "grpc"}, quick...), 64, `serving API "grpc": want v1 or native`, 3},
		{"native serving API on vLLM", []string{"run", "--url", vllm, "--dir", dir, "--phases", "serving", "--concurrency", "1",
			"--serving-api", "native"}, 1, "serving API native is Ollama's /api/chat, and this server is vllm: use v1", 3},
	} {
		out, code := gpuhost(c.args...)
		if code != c.code || !strings.Contains(out, c.want) {
			t.Errorf("%s: exit %d (want %d), output lacks %q?\n%s", c.name, code, c.code, c.want, out)
		}
		if n := len(stored()); n != c.stored {
			t.Errorf("%s: %d results stored, want %d", c.name, n, c.stored)
		}
	}
	all := stored()
	var ok, failed string
	for _, r := range all {
		switch r.Status {
		case bench.StatusOK:
			ok = r.ID
		case bench.StatusFailed:
			failed = r.ID
		}
	}
	if out, code := gpuhost("compare", ok, failed, "--dir", dir); code != 1 || !strings.Contains(out, "failed run") {
		t.Errorf("compare with a failed run: exit %d\n%s", code, out)
	}
	if out, code := gpuhost("compare", ok, ok, "--dir", dir); code != 0 || !strings.Contains(out, "Holm") {
		t.Errorf("compare: exit %d\n%s", code, out)
	}
}
