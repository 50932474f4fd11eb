package benchcmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"gpuhost/bench"
	"gpuhost/simulator"
	"gpuhost/units"
)

// Simulator parameters of TestBenchCapacitySimulator: vLLM with
// --max-num-seqs 8, every sequence prefilling at capPrefill tok/s and
// decoding at its own constant capDecode tok/s however many run, and a
// request beyond the 8 running queueing until one ends (simulator/engine.go:
// slots, pacer).
const (
	capSeqs     = 8
	capPrefill  = 3200.0
	capDecode   = 40.0
	capIn       = 32
	capOut      = 16
	capTTFTP95  = 200 * time.Millisecond
	capMinTokS  = 10.0
	capMaxConc  = 12
	capRepeats  = 3
	capTolerPct = 10
)

// capSimAnswer is the capacity the simulator's queueing gives, worked out
// from its code. Up to capSeqs users no request waits: TTFT is the
// prefill, capIn/capPrefill = 10 ms, far under the bound, and every user
// decodes at capDecode tok/s, 4× the minimum. With c > capSeqs in the
// closed loop (max(2c, 4) requests), at least one request in every
// capSeqs waits for a running one to end, which takes its whole decode,
// (capOut−1)/capDecode = 375 ms: more than 5 % of the requests wait, so
// TTFT p95 ≥ 375 ms, almost twice the bound. The capacity is capSeqs.
func capSimAnswer(t *testing.T) int {
	t.Helper()
	prefill := time.Duration(capIn / capPrefill * float64(time.Second))
	wait := time.Duration(float64(capOut-1) / capDecode * float64(time.Second))
	if 10*prefill > capTTFTP95 || wait < capTTFTP95*3/2 || capDecode < 2*capMinTokS || 1.0/capSeqs <= 0.05 {
		t.Fatalf("the parameters leave no margin: prefill %s, wait %s, bound %s", prefill, wait, capTTFTP95)
	}
	return capSeqs
}

// TestBenchCapacitySimulator runs `bench capacity` against the simulator
// whose answer is computable (capSimAnswer): the answer is within 10 % of
// it, the interval holds it, and the result is stored, listed, shown and
// compared as the other results.
func TestBenchCapacitySimulator(t *testing.T) {
	want := capSimAnswer(t)
	url := startSim(t, simulator.Options{Flavor: simulator.FlavorVLLM, Model: "m", MaxNumSeqs: capSeqs,
		PrefillTPS: capPrefill, DecodeTPS: capDecode})
	dir := filepath.Join(t.TempDir(), "results")
	deps := Deps{GpuhostVersion: "test", GpuhostCommit: "abc123"}
	out, errOut, err := runCmd(t, deps, "capacity", "--url", url, "--model", "m", "--dir", dir, "--json",
		"--ttft-p95", capTTFTP95.String(), "--min-tps", fmt.Sprint(capMinTokS), "--max-concurrency", fmt.Sprint(capMaxConc),
		"--repeats", fmt.Sprint(capRepeats), "--serving-input", fmt.Sprint(capIn), "--serving-output", fmt.Sprint(capOut))
	if err != nil {
		t.Fatalf("bench capacity: %v\n%s\n%s", err, errOut, out)
	}
	var r bench.Result
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.Capacity == nil {
		t.Fatalf("result JSON: %v\n%s", err, out)
	}
	cb := r.Capacity
	var lines []string
	for _, p := range cb.Probes {
		lines = append(lines, fmt.Sprintf("c=%d met %d/%d %+v", p.Concurrency, p.RepeatsMet, len(p.Repeats), p.Repeats))
	}
	t.Logf("capacity %d [%d, %d] (%.0f %%), computed %d; probes:\n%s", cb.Users, cb.Low, cb.High, cb.Confidence*100, want, strings.Join(lines, "\n"))
	if r.Status != bench.StatusOK || r.Kind() != bench.KindCapacity || r.SchemaVersion != bench.SchemaVersion || r.Fingerprint.Backend != "vllm" ||
		r.Fingerprint.GpuhostCommit != "abc123" || !strings.Contains(r.ID, "-capacity-m") {
		t.Errorf("status %s, kind %s, id %s, fingerprint %+v, errors %+v", r.Status, r.Kind(), r.ID, r.Fingerprint, r.Errors)
	}
	if d := math.Abs(float64(cb.Users-want)) / float64(want) * 100; d > capTolerPct {
		t.Errorf("capacity %d, computed %d: %.0f %% off", cb.Users, want, d)
	}
	if cb.Low > want || cb.High < want {
		t.Errorf("interval [%d, %d] leaves out the computed %d", cb.Low, cb.High, want)
	}
	if len(cb.PerRepeat) != capRepeats || cb.InputTokens != capIn || cb.OutputTokens != capOut || cb.AtMax {
		t.Errorf("capacity %+v", cb)
	}
	capacityStoredAndShown(t, deps, dir, r.ID)
}

// capacityStoredAndShown: the stored capacity result is listed, shown
// and compared with itself on capacity.users.
func capacityStoredAndShown(t *testing.T, deps Deps, dir, id string) {
	t.Helper()
	out, _, err := runCmd(t, deps, "list", "--dir", dir)
	if err != nil || !strings.Contains(out, id) || !strings.Contains(out, "CAPACITY") || !strings.Contains(out, "users [") {
		t.Errorf("list: %v\n%s", err, out)
	}
	out, _, err = runCmd(t, deps, "show", id, "--dir", dir)
	for _, w := range []string{id + "  OK", "capacity: ", "within TTFT p95 ≤ 200 ms, ≥ 10 tok/s per user", "probes in the order run", "per repeat: "} {
		if err != nil || !strings.Contains(out, w) {
			t.Errorf("show: %v; output lacks %q:\n%s", err, w, out)
		}
	}
	out, _, err = runCmd(t, deps, "compare", id, id, "--dir", dir)
	if err != nil || !strings.Contains(out, "capacity.users (users)") {
		t.Errorf("compare: %v\n%s", err, out)
	}
}

// TestBenchCapacityNoUser: when even one user decodes slower than the
// minimum (the simulator's constant 40 tok/s against 60), the capacity is
// 0, an answer, not a failure; bad SLOs are usage errors.
func TestBenchCapacityNoUser(t *testing.T) {
	url := startSim(t, simulator.Options{Flavor: simulator.FlavorVLLM, Model: "m", PrefillTPS: capPrefill, DecodeTPS: capDecode})
	dir, state := t.TempDir(), t.TempDir()
	// No --url: the daemon's /v1 on the active profile, as bench run finds it.
	p := &units.Profile{Name: "coder", Backend: units.VLLM, Model: "m", Port: 1}
	deps := Deps{Env: func(*cobra.Command) (Env, error) {
		return Env{StateDir: state, Active: func(context.Context) (bench.Target, *units.Profile, error) {
			return bench.Target{URL: url + "/v1", ServerURL: url, Model: "m"}, p, nil
		}}, nil
	}}
	out, errOut, err := runCmd(t, deps, "capacity", "--min-tps", "60", "--max-concurrency", "4",
		"--repeats", "1", "--serving-input", "16", "--serving-output", "8")
	if err != nil {
		t.Fatalf("bench capacity: %v\n%s\n%s", err, errOut, out)
	}
	for _, w := range []string{"-capacity-coder  OK", "profile coder", "capacity: 0 [0, 0] users within ≥ 60 tok/s per user (1 repeat: no confidence level)",
		"tok/s < 60 tok/s", "saved " + filepath.Join(state, "bench")} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	noConfig := Deps{Env: func(*cobra.Command) (Env, error) { return Env{}, errors.New("no config") }}
	for _, args := range [][]string{
		{"capacity", "--url", url, "--dir", dir},
		{"capacity", "--url", url, "--dir", dir, "--ttft-p95", "1s", "--max-concurrency", "0"},
		{"capacity", "--url", url, "--dir", dir, "--min-tps", "-1"},
		{"capacity", "--url", url, "--dir", dir, "--ttft-p95", "1s", "--repeats", "-1"},
	} {
		_, _, err := runCmd(t, noConfig, args...)
		if exitOf(err) != 64 {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
	_, _, err = runCmd(t, noConfig, "capacity", "--ttft-p95", "1s")
	if exitOf(err) != 1 || !strings.Contains(err.Error(), "no --url given") {
		t.Errorf("without --url or config: %v", err)
	}
}
