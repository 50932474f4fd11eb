package bench

import (
	"bytes"
	"encoding/json"
	"math"
	"path/filepath"
	"testing"

	"gpuhost/bench/ollamatest"
)

// TestRealOllama runs `gpuhost bench run --url <ollama>` against a real
// Ollama (built from the module proxy, serving a generated model): the
// result is complete — prefill and serving through /v1, decode through the
// native /api/generate — and the client's decode rate agrees with Ollama's
// own eval_count/eval_duration within 5 %.
func TestRealOllama(t *testing.T) {
	url, model := ollamatest.Start(t)
	dir := filepath.Join(t.TempDir(), "results")
	cmd := NewCmd(Deps{GpuhostVersion: "test", GpuhostCommit: "abc123"})
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs([]string{"run", "--url", url + "/v1", "--model", model, "--dir", dir, "--json",
		"--repeats", "3", "--prefill", "64,256", "--decode", "128,384", "--concurrency", "1,2",
		"--serving-requests", "2", "--serving-input", "64", "--serving-output", "32"})
	if err := cmd.Execute(); err != nil {
		t.Fatalf("bench run: %v\n%s\n%s", err, errOut.String(), out.String())
	}
	var r Result
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("result JSON: %v\n%s", err, out.String())
	}
	if r.Status != StatusOK || len(r.Errors) != 0 {
		t.Fatalf("status %s, errors %+v, notes %v", r.Status, r.Errors, r.Notes)
	}
	f := r.Fingerprint
	if f.Backend != "ollama" || f.BackendVersion != ollamatest.Version || f.Model != model+":latest" || f.MaxModelLen != 4096 ||
		f.GpuhostVersion != "test" || f.GpuhostCommit != "abc123" {
		t.Fatalf("fingerprint %+v", f)
	}
	for _, p := range r.Prefill {
		if p.TokS.N != 3 || p.Calibration != "usage" || p.PromptTokens != float64(p.TargetTokens) {
			t.Errorf("prefill %+v", p)
		}
	}
	for _, s := range r.Serving {
		if s.Completed != 6 || s.Failed != 0 || s.OutputTPS.N != 3 || s.Short != 0 {
			t.Errorf("serving c=%d: %+v", s.Concurrency, s)
		}
	}
	if len(r.Decode) != 2 || len(r.CrossChecks) != 2 {
		t.Fatalf("decode %+v, cross-checks %+v", r.Decode, r.CrossChecks)
	}
	for i, d := range r.Decode {
		c := r.CrossChecks[i]
		t.Logf("decode %d: client %.1f ± %.1f tok/s, Ollama %.1f ± %.1f tok/s; %s: %+.2f %% (%s)", d.Tokens, d.TokS.Mean, d.TokS.Stddev,
			d.ServerTokS.Mean, d.ServerTokS.Stddev, c.Name, c.DisagreementPct, c.Note)
		if d.API != "ollama" || d.TokS.N != 3 || d.ServerTokS == nil || d.ServerTokS.N != 3 {
			t.Errorf("decode %+v", d)
		}
		if math.Abs(c.DisagreementPct) > 5 {
			t.Errorf("decode %d: client and Ollama disagree by %.2f %% (limit 5 %%)", d.Tokens, c.DisagreementPct)
		}
	}
	// The stored copy is the printed one.
	all, warns, err := (&Store{Dir: dir}).List()
	if err != nil || len(warns) != 0 || len(all) != 1 || all[0].ID != r.ID {
		t.Fatalf("store: %v %v %v", all, warns, err)
	}
}
