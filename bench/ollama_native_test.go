package bench

import (
	"bytes"
	"encoding/json"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gpuhost/bench/ollamatest"
)

// runJSON runs `gpuhost bench` with args (--json) and decodes the result.
func runJSON(t *testing.T, args ...string) Result {
	t.Helper()
	cmd := NewCmd(Deps{GpuhostVersion: "test"})
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(append(args, "--json"))
	if err := cmd.Execute(); err != nil {
		t.Fatalf("bench %v: %v\n%s\n%s", args, err, errOut.String(), out.String())
	}
	var r Result
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
	if r.Status != StatusOK || len(r.Errors) != 0 || r.Config.ServingAPI != ServingNative {
		t.Fatalf("status %s, errors %+v, config %+v", r.Status, r.Errors, r.Config)
	}
	for _, s := range r.Serving {
		if s.Completed != 8 || s.Failed != 0 {
			t.Errorf("serving c=%d: %+v", s.Concurrency, s)
		}
	}
	byName := map[string]Cross{}
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
		if lim := 100 * bound(0.05); math.Abs(c.DisagreementPct) > lim {
			t.Errorf("%s: client %.2f vs Ollama %.2f ms: %+.2f %% (limit %.0f %%)", k, c.Client, c.Server, c.DisagreementPct, lim)
		}
	}

	// Through /v1 the same sweep has no server figures to cross-check.
	v1 := runJSON(t, base...)
	if v1.Status != StatusOK || len(v1.CrossChecks) != 0 || v1.Config.ServingAPI != ServingV1 {
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
		if r.Status != StatusOK {
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

// TestServingCross: a request without the server's timing (a /v1 one)
// pairs with nothing; the figures shown are those of the request with the
// median disagreement, and the note gives the range over all of them.
func TestServingCross(t *testing.T) {
	v1 := &sample{completion: 8, evalCount: 8, tokenAt: []time.Duration{time.Millisecond}, end: 9 * time.Millisecond}
	if _, ok := newServingPair(v1); ok {
		t.Fatal("a /v1 sample (no server timing) paired")
	}
	native := func(clientE2E, serverTotal time.Duration) servingPair {
		s := &sample{completion: 11, evalCount: 11, evalDuration: 50 * time.Millisecond, server: ollamaTimings{total: serverTotal},
			tokenAt: []time.Duration{20 * time.Millisecond}, end: clientE2E}
		p, ok := newServingPair(s)
		if !ok {
			t.Fatalf("native sample %+v did not pair", s)
		}
		return p
	}
	p := native(80*time.Millisecond, 70*time.Millisecond)
	if p.serverTTFT != 20 || p.serverTPOT != 5 || p.clientTPOT != 6 || p.clientE2E != 80 || p.serverE2E != 70 {
		t.Fatalf("pair %+v", p)
	}
	pairs := []servingPair{native(110*time.Millisecond, 100*time.Millisecond), native(101*time.Millisecond, 100*time.Millisecond),
		native(150*time.Millisecond, 100*time.Millisecond), native(102*time.Millisecond, 100*time.Millisecond)}
	cs := servingCross(servingLevel{c: 4}, pairs)
	if len(cs) != 3 {
		t.Fatalf("cross-checks %+v", cs)
	}
	e2e := cs[2]
	if !strings.HasPrefix(e2e.Name, "serving c=4 E2E ") || e2e.Client != 102 || e2e.Server != 100 ||
		!strings.Contains(e2e.Note, "+1.0 % to +50.0 % over 4 requests") {
		t.Errorf("E2E cross-check %+v", e2e)
	}
	if servingCross(servingLevel{c: 1}, nil) != nil {
		t.Error("cross-checks without pairs")
	}
}
