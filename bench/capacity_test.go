package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"gpuhost/simulator"
	"gpuhost/units"
)

// TestSearchCapacity: the search finds every threshold of a monotone SLO
// exactly, within its bound, probing about 2·log2 levels and never a
// level twice.
func TestSearchCapacity(t *testing.T) {
	for _, maxC := range []int{1, 2, 5, 12, 16, 64} {
		for want := 0; want <= maxC; want++ {
			var probed []int
			got, err := searchCapacity(context.Background(), maxC, func(_ context.Context, c int) (bool, error) {
				if c < 1 || c > maxC || slices.Contains(probed, c) {
					t.Fatalf("max %d, capacity %d: probed %d after %v", maxC, want, c, probed)
				}
				probed = append(probed, c)
				return c <= want, nil
			})
			if err != nil || got != want {
				t.Errorf("max %d, capacity %d: got %d, %v (probed %v)", maxC, want, got, err, probed)
			}
			if limit := 2*int(math.Ceil(math.Log2(float64(maxC)+1))) + 1; len(probed) > limit {
				t.Errorf("max %d, capacity %d: %d probes %v, want at most %d", maxC, want, len(probed), probed, limit)
			}
		}
	}
	// An error stops the search with the largest level met so far.
	boom := errors.New("boom")
	got, err := searchCapacity(context.Background(), 64, func(_ context.Context, c int) (bool, error) {
		if c == 8 {
			return false, boom
		}
		return true, nil
	})
	if got != 4 || !errors.Is(err, boom) {
		t.Errorf("error at 8: got %d, %v; want 4, boom", got, err)
	}
}

// capacityProbes builds the probes of a search from per-repeat
// thresholds: repeat r meets level c when c ≤ caps[r]; a level meets the
// SLO by majority, as probe decides.
func capacityProbes(t *testing.T, maxC int, caps []int) *CapacityBench {
	t.Helper()
	cb := &CapacityBench{MaxConcurrency: maxC, Repeats: len(caps)}
	users, err := searchCapacity(context.Background(), maxC, func(_ context.Context, c int) (bool, error) {
		p := CapacityProbe{Concurrency: c}
		for _, cp := range caps {
			rp := CapacityRepeat{MeetsSLO: c <= cp, Completed: 1}
			if rp.MeetsSLO {
				p.RepeatsMet++
			}
			p.Repeats = append(p.Repeats, rp)
		}
		p.MeetsSLO = 2*p.RepeatsMet > len(caps)
		cb.Probes = append(cb.Probes, p)
		return p.MeetsSLO, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	cb.Users = users
	return cb
}

// TestCapacityInterval: each repeat's bracket holds its own threshold,
// the answer is the median threshold (odd repeats), the interval holds
// the answer and every threshold, and its confidence is 1 − 2^(1−R).
func TestCapacityInterval(t *testing.T) {
	for _, c := range []struct {
		maxC int
		caps []int
	}{
		{16, []int{8, 8, 8}},
		{16, []int{7, 8, 9}},
		{16, []int{3, 8, 12, 9, 8}},
		{64, []int{0, 1, 0}},
		{12, []int{12, 12, 12}},
		{12, []int{12, 5, 12}},
		{64, []int{33, 20, 47, 41, 38, 29, 35}},
	} {
		cb := capacityProbes(t, c.maxC, c.caps)
		if note := cb.conclude(true); note != "" {
			t.Errorf("%v: %s", c.caps, note)
		}
		sorted := slices.Sorted(slices.Values(c.caps))
		if median := sorted[len(sorted)/2]; cb.Users != median {
			t.Errorf("%v: users %d, want the median %d", c.caps, cb.Users, median)
		}
		for i, b := range cb.PerRepeat {
			if b.Low > c.caps[i] || b.High < c.caps[i] {
				t.Errorf("%v: repeat %d bracket [%d, %d] leaves out %d", c.caps, i, b.Low, b.High, c.caps[i])
			}
		}
		if cb.Low > sorted[0] || cb.High < sorted[len(sorted)-1] || cb.Low > cb.Users || cb.High < cb.Users {
			t.Errorf("%v: interval [%d, %d], users %d", c.caps, cb.Low, cb.High, cb.Users)
		}
		if want := 1 - math.Pow(0.5, float64(len(c.caps)-1)); math.Abs(cb.Confidence-want) > 1e-12 || cb.UsersRepeat.N != len(c.caps) {
			t.Errorf("%v: confidence %v (want %v), per-repeat %+v", c.caps, cb.Confidence, want, cb.UsersRepeat)
		}
		if cb.AtMax != (cb.Users == c.maxC) {
			t.Errorf("%v: at max %v with users %d of %d", c.caps, cb.AtMax, cb.Users, c.maxC)
		}
	}
}

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
	var r Result
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.Capacity == nil {
		t.Fatalf("result JSON: %v\n%s", err, out)
	}
	cb := r.Capacity
	var lines []string
	for _, p := range cb.Probes {
		lines = append(lines, fmt.Sprintf("c=%d met %d/%d %+v", p.Concurrency, p.RepeatsMet, len(p.Repeats), p.Repeats))
	}
	t.Logf("capacity %d [%d, %d] (%.0f %%), computed %d; probes:\n%s", cb.Users, cb.Low, cb.High, cb.Confidence*100, want, strings.Join(lines, "\n"))
	if r.Status != StatusOK || r.Kind() != KindCapacity || r.SchemaVersion != SchemaVersion || r.Fingerprint.Backend != "vllm" ||
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
		return Env{StateDir: state, Active: func(context.Context) (Target, *units.Profile, error) {
			return Target{URL: url + "/v1", ServerURL: url, Model: "m"}, p, nil
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
		var ee *ExitError
		if !errors.As(err, &ee) || ee.Code != ExitUsage {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
	_, _, err = runCmd(t, noConfig, "capacity", "--ttft-p95", "1s")
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Code != ExitFailed || !strings.Contains(err.Error(), "no --url given") {
		t.Errorf("without --url or config: %v", err)
	}
}
