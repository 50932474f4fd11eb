package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

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
			Active: func(context.Context) (Target, *units.Profile, error) {
				return Target{URL: url + "/v1", ServerURL: url, Model: "m"}, p, nil
			}}, nil
	}}
	// Default target: the daemon's /v1 on the active profile.
	out, _, err := runCmd(t, deps, append([]string{"run"}, quickFlags...)...)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out)
	}
	for _, want := range []string{"-coder  OK", "backend vllm 0.11.0", "NVIDIA GeForce RTX 4090", "prefill", "decode", "serving",
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
	var r Result
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
	all, _, _ := NewStore(state, nil).List()
	out, _, err = runCmd(t, deps, "compare", all[0].ID, all[1].ID)
	if err != nil || !strings.Contains(out, "decode.16.tok_s") || !strings.Contains(out, "Welch") {
		t.Fatalf("compare: %v\n%s", err, out)
	}
	out, _, err = runCmd(t, deps, "compare", all[0].ID, all[1].ID, "--json")
	var c Comparison
	if err != nil || json.Unmarshal([]byte(out), &c) != nil || len(c.Rows) == 0 {
		t.Fatalf("compare --json: %v\n%s", err, out)
	}
	// A corrupt file: list warns on stderr and goes on.
	if err := os.WriteFile(filepath.Join(state, "bench", "20200101T000000Z-x.json"), []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, err := runCmd(t, deps, "list", "--json")
	var lr ListResponse
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
	}{
		{[]string{"run"}, "no --url given"},
		{[]string{"run", "--url", "http://127.0.0.1:1", "--dir", dir, "--flavor", "tgi"}, "--flavor"},
		{[]string{"run", "--url", "http://127.0.0.1:1", "--dir", dir, "--profile", "x"}, "no such profile"},
		{[]string{"run", "--url", "http://127.0.0.1:1", "--dir", dir, "--api-key-env", "GPUHOST_TEST_UNSET_KEY"}, "GPUHOST_TEST_UNSET_KEY"},
		{[]string{"run", "--url", "http://127.0.0.1:1", "--dir", dir, "--repeats", "1"}, "endpoint down"},
		{[]string{"show", "nope", "--dir", dir}, "no such bench result"},
		{[]string{"compare", "a", "b", "--dir", dir, "--alpha", "2"}, "--alpha"},
	} {
		_, _, err := runCmd(t, noConfig, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err %v, want %q", c.args, err, c.want)
		}
	}
	// The failed run above was stored with its reason.
	all, _, _ := (&Store{Dir: dir}).List()
	if len(all) != 1 || all[0].Status != StatusFailed || !strings.Contains(all[0].Errors[0].Message, "connection refused") {
		t.Fatalf("stored failed run: %+v", all)
	}
}
