package benchcmd

import (
	"bytes"
	"encoding/json"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"gpuhost/bench"
	"gpuhost/bench/benchtest"
	"gpuhost/bench/ollamatest"
)

// runJSON runs `gpuhost bench` with args (--json) and decodes the result.
func runJSON(t *testing.T, args ...string) bench.Result {
	t.Helper()
	cmd := NewCmd(Deps{GpuhostVersion: "test", GpuhostCommit: "abc123"})
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(append(args, "--json"))
	if err := cmd.Execute(); err != nil {
		t.Fatalf("bench %v: %v\n%s\n%s", args, err, errOut.String(), out.String())
	}
	var r bench.Result
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("result JSON: %v\n%s", err, out.String())
	}
	return r
}

// TestRealOllamaServingCrossCheck: a serving sweep through Ollama's native
// /api/chat (--serving-api native) puts each level's client TTFT, TPOT and
// E2E next to the same requests' own timings from Ollama; through /v1
// (the default) Ollama reports none, so there is no serving cross-check.
// One request at a time (c=1) waits for no slot, so client and server
// must agree; at c=2 on one slot the server's TTFT includes the wait.
func TestRealOllamaServingCrossCheck(t *testing.T) {
	url, model := ollamatest.Start(t)
	base := []string{"run", "--url", url + "/v1", "--model", model, "--no-save", "--phases", "serving",
		"--repeats", "2", "--concurrency", "1,2", "--serving-requests", "4", "--serving-input", "64", "--serving-output", "48"}
	r := runJSON(t, append(base, "--serving-api", "native")...)
	if r.Status != bench.StatusOK || len(r.Errors) != 0 || r.Config.ServingAPI != bench.ServingNative {
		t.Fatalf("status %s, errors %+v, config %+v", r.Status, r.Errors, r.Config)
	}
	for _, s := range r.Serving {
		if s.Completed != 8 || s.Failed != 0 {
			t.Errorf("serving c=%d: %+v", s.Concurrency, s)
		}
	}
	byName := map[string]bench.Cross{}
	for _, c := range r.CrossChecks {
		t.Logf("%s: client %.2f, server %.2f %s, %+.2f %% (%s)", c.Name, c.Client, c.Server, c.Unit, c.DisagreementPct, c.Note)
		for _, lvl := range []string{"c=1", "c=2"} {
			for _, m := range []string{"TTFT", "TPOT", "E2E"} {
				if strings.HasPrefix(c.Name, "serving "+lvl+" "+m+" ") {
					byName[lvl+" "+m] = c
				}
			}
		}
	}
	if len(byName) != 6 || len(r.CrossChecks) != 6 {
		t.Fatalf("want TTFT, TPOT and E2E cross-checks for c=1 and c=2, got %d: %+v", len(r.CrossChecks), r.CrossChecks)
	}
	for _, k := range []string{"c=1 E2E", "c=2 E2E", "c=1 TPOT"} {
		c := byName[k]
		if !strings.Contains(c.Name, "median of 8") {
			t.Errorf("%s: %s, want all 8 requests paired", k, c.Name)
		}
		// The client's end-to-end time contains the server's; the gap is
		// HTTP and JSON, a few percent of a request of 48 tokens.
		if lim := 100 * benchtest.Bound(0.05); math.Abs(c.DisagreementPct) > lim {
			t.Errorf("%s: client %.2f vs Ollama %.2f ms: %+.2f %% (limit %.0f %%)", k, c.Client, c.Server, c.DisagreementPct, lim)
		}
	}

	// Through /v1 the same sweep has no server figures to cross-check.
	v1 := runJSON(t, base...)
	if v1.Status != bench.StatusOK || len(v1.CrossChecks) != 0 || v1.Config.ServingAPI != bench.ServingV1 {
		t.Fatalf("v1 sweep: status %s, cross-checks %+v, config %+v", v1.Status, v1.CrossChecks, v1.Config)
	}
}

// TestRealOllamaParallelFingerprint: OLLAMA_NUM_PARALLEL is in none of
// Ollama's answers, but the KV cache it sizes is: /api/ps's size of the
// loaded model grows by one context's KV per slot. Comparing a run on a
// server with 1 slot and one with 4 names that difference first.
func TestRealOllamaParallelFingerprint(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "results")
	var ids []string
	var sizes []string
	for _, np := range []string{"1", "4"} {
		url, model := ollamatest.StartEnv(t, "OLLAMA_NUM_PARALLEL="+np)
		r := runJSON(t, "run", "--url", url+"/v1", "--model", model, "--dir", dir, "--phases", "prefill",
			"--prefill", "64", "--repeats", "2")
		if r.Status != bench.StatusOK {
			t.Fatalf("NUM_PARALLEL=%s: status %s, errors %+v", np, r.Status, r.Errors)
		}
		ids, sizes = append(ids, r.ID), append(sizes, r.Fingerprint.Server["ollama.ps.size"])
	}
	t.Logf("ollama.ps.size with 1 and 4 slots: %v", sizes)
	if sizes[0] == "" || sizes[0] == sizes[1] {
		t.Fatalf("ollama.ps.size %v: want it recorded and different", sizes)
	}
	cmd := NewCmd(Deps{})
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"compare", ids[0], ids[1], "--dir", dir})
	_ = cmd.Execute() // a verdict's exit code is not what this test is about
	text := out.String()
	t.Logf("compare:\n%s", text)
	if !strings.Contains(text, "server ollama.ps.size: "+sizes[0]+" → "+sizes[1]) || !strings.Contains(text, "OLLAMA_NUM_PARALLEL") {
		t.Errorf("compare does not name the loaded size's change and its likely cause:\n%s", text)
	}
	if i, j := strings.Index(text, "setup changes"), strings.Index(text, "ollama.ps.size"); i < 0 || j < i {
		t.Errorf("the setup changes do not come first:\n%s", text)
	}
}
