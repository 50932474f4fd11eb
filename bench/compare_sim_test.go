package bench

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"
)

// simRuns runs n short bench runs (prefill 256, decode 64, 5 repeats),
// each against its own simulator process, as the experiment ran
// runs one after another on a shared machine: every request's rates
// scatter by jitter (2 %), and every run's server is a little faster or
// slower as a whole (drift 1 %, the machine busier or quieter for a run).
// decode scales the decode rate (1: identical setups; 0.9: −10 %).
func simRuns(t *testing.T, rng *rand.Rand, n int, decode float64) []*Result {
	t.Helper()
	var out []*Result
	for i := 0; i < n; i++ {
		drift := 1 + rng.NormFloat64()*0.01
		url := startSimProcess(t, "vllm", "--model", "m", "--jitter", "0.02", "--jitter-seed", strconv.FormatUint(rng.Uint64(), 10),
			"--prefill-tps", fmt.Sprint(5000*drift), "--decode-tps", fmt.Sprint(400*drift*decode))
		r, err := Run(context.Background(), Options{Target: Target{URL: url}, Repeats: 5, PrefillTokens: []int{256},
			DecodeTokens: []int{64}, Phases: []string{PhasePrefill, PhaseDecode}, Started: time.Unix(int64(len(out)+1)*60, 0)})
		if err != nil || r.Status != StatusOK {
			t.Fatalf("run %d: %v, %+v", i, err, r)
		}
		out = append(out, r)
	}
	return out
}

// verdicts counts the pairs (a from as, b from bs; with bs nil every pair
// of as) that compare calls better or worse on at least one metric, and
// what the old rule — Welch's test per metric at p < 0.05, no correction,
// no minimum effect — would have said of the same pairs.
func verdicts(t *testing.T, as, bs []*Result, metric string) (pairs, now, old, found int) {
	t.Helper()
	for i, a := range as {
		others, start := bs, 0
		if bs == nil {
			others, start = as, i+1
		}
		for _, b := range others[start:] {
			c := mustCompare(t, a, b, CompareOptions{})
			pairs++
			var nowAny, oldAny bool
			for _, r := range c.Rows {
				if r.Verdict == "better" || r.Verdict == "worse" {
					nowAny = nowAny || r.Metric != metric
					if r.Metric == metric && r.Verdict == "worse" {
						found++
					}
				}
				if _, _, p, ok := WelchTest(r.A.Samples, r.B.Samples); ok && p < 0.05 && r.Metric != metric {
					oldAny = true
				}
			}
			if nowAny {
				now++
			}
			if oldAny {
				old++
			}
		}
	}
	return pairs, now, old, found
}

// TestCompareSimulatorIdenticalRuns is the experiment against the
// simulator: 10 identical runs (45 pairs, 4 metrics each) may get a false
// "better"/"worse" in at most the nominal 5 % of the pairs (Holm's
// correction bounds the family-wise rate per pair; the count fails the
// test when a rate of 5 % would give it less than 1 % of the time); and
// 5 runs with the decode rate 10 % lower are compared with the 10 (50
// pairs): found worse in at least 70 % of them when the machine adds
// little scatter, with no more false verdicts on the unchanged metrics
// than that same rate allows. The old rule's verdicts on the same pairs
// are logged for comparison.
func TestCompareSimulatorIdenticalRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIPPING 15 bench runs against the simulator in -short mode")
	}
	rng := rand.New(rand.NewPCG(2026, 12))
	base := simRuns(t, rng, 10, 1)
	pairs, now, old, _ := verdicts(t, base, nil, "")
	t.Logf("identical runs: false verdicts in %d of %d pairs (%.1f %%); the old rule: %d (%.1f %%)",
		now, pairs, 100*float64(now)/float64(pairs), old, 100*float64(old)/float64(pairs))
	if limit := binomialQuantile(pairs, 0.05, 0.99); now > limit {
		t.Errorf("identical runs: %d of %d pairs with a false verdict: the rate is above the nominal 5 %% (more than %d, the 99th percentile at 5 %%)", now, pairs, limit)
	}
	slower := simRuns(t, rng, 5, 0.9)
	pairs, now, old, found := verdicts(t, base, slower, "decode.64.tok_s")
	noise := decodeNoise(append(base, slower...))
	t.Logf("decode −10 %%: found worse in %d of %d pairs; false verdicts on other metrics in %d pairs (old rule: %d); decode scatter within runs %.1f %%",
		found, pairs, now, old, noise)
	// The power depends on the scatter the machine adds to the simulator's
	// 2 %: at 5 repeats, 2 % scatter and 1 % drift between runs, a 10 %
	// drop clears the 3 % minimum effect after Holm in about 5 of 6 pairs
	// (TestCompareFindsDecodeDrop's model: 83 of 100; a slow run among the
	// five misses all 10 of its pairs at once). So at most 2.5 % scatter
	// at least 70 % must be found, as that test asks of its model; a
	// machine busy enough to scatter more is told, not failed (the
	// false-verdict bounds above hold at any noise).
	switch {
	case noise <= 2.5 && found < pairs*70/100:
		t.Errorf("decode −10 %%: found in %d of %d pairs, want ≥ 70 %% at %.1f %% scatter", found, pairs, noise)
	case noise > 2.5:
		t.Logf("decode scatter %.1f %% > 2.5 %% (a busy machine): the power check is left out", noise)
	}
	if limit := binomialQuantile(pairs, 0.05, 0.99); now > limit {
		t.Errorf("decode −10 %%: %d of %d pairs with a false verdict on an unchanged metric (limit %d)", now, pairs, limit)
	}
}

// decodeNoise is the mean relative standard deviation (%) of the decode
// rate's repeats within each run.
func decodeNoise(rs []*Result) float64 {
	var sum float64
	var n int
	for _, r := range rs {
		for _, d := range r.Decode {
			if d.TokS.N > 1 && d.TokS.Mean > 0 {
				sum += d.TokS.Stddev / d.TokS.Mean * 100
				n++
			}
		}
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}

// binomialQuantile is the smallest k with P(X ≤ k) ≥ q for X ~ Bin(n, p).
func binomialQuantile(n int, p, q float64) int {
	pk := math.Pow(1-p, float64(n)) // P(X = 0)
	cum := pk
	for k := 0; k < n; k++ {
		if cum >= q {
			return k
		}
		pk *= float64(n-k) / float64(k+1) * p / (1 - p)
		cum += pk
	}
	return n
}

func TestBinomialQuantile(t *testing.T) {
	for _, c := range []struct {
		n    int
		p, q float64
		want int
	}{{45, 0.05, 0.99, 6}, {50, 0.05, 0.99, 7}, {10, 0.5, 0.5, 5}, {1, 0.05, 0.99, 1}} {
		if got := binomialQuantile(c.n, c.p, c.q); got != c.want {
			t.Errorf("binomialQuantile(%d, %v, %v) = %d, want %d", c.n, c.p, c.q, got, c.want)
		}
	}
}
