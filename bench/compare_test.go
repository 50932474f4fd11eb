package bench

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// synthetic builds a result whose decode.128.tok_s samples are n draws of
// N(mean, sd) and whose serving TTFT p50 is N(ttft, sd).
func synthetic(id string, seed uint64, n int, mean, ttft, sd float64) *Result {
	r := rand.New(rand.NewPCG(seed, 7))
	draw := func(m float64) []float64 {
		xs := make([]float64, n)
		for i := range xs {
			xs[i] = m + r.NormFloat64()*sd
		}
		return xs
	}
	return &Result{
		SchemaVersion: SchemaVersion, ID: id, Status: StatusOK, StartedAt: time.Unix(0, 0),
		Decode:  []Decode{{Tokens: 128, TokS: NewStat(draw(mean))}},
		Serving: []Serving{{Concurrency: 4, TTFT: DistStat{P50: NewStat(draw(ttft))}}},
	}
}

func row(t *testing.T, c Comparison, metric string) CompareRow {
	t.Helper()
	for _, r := range c.Rows {
		if r.Metric == metric {
			return r
		}
	}
	t.Fatalf("no row %s in %+v", metric, c.Rows)
	return CompareRow{}
}

func TestCompareVerdicts(t *testing.T) {
	for _, c := range []struct {
		name                 string
		bDecode, bTTFT       float64
		wantDecode, wantTTFT string
	}{
		{"same distribution", 100, 200, "~", "~"},
		{"decode 10% faster, TTFT 10% slower", 110, 220, "better", "worse"},
		{"decode 10% slower, TTFT 10% faster", 90, 180, "worse", "better"},
	} {
		t.Run(c.name, func(t *testing.T) {
			// Many seeds: the verdict must hold for typical draws, not one lucky one.
			wrong := 0
			for seed := uint64(1); seed <= 40; seed++ {
				a := synthetic("20260101T000000Z-a", seed, 5, 100, 200, 2)
				b := synthetic("20260101T000001Z-b", seed+1000, 5, c.bDecode, c.bTTFT, 2*c.bDecode/100)
				cmp := Compare(a, b, 0)
				d, l := row(t, cmp, "decode.128.tok_s"), row(t, cmp, "serving.c4.ttft_p50_ms")
				if d.Verdict != c.wantDecode || l.Verdict != c.wantTTFT {
					wrong++
				}
			}
			// α = 0.05: a few false positives among 40 null pairs are expected,
			// a real 10% shift at 2% noise is always found.
			limit := 0
			if c.wantDecode == "~" {
				limit = 6
			}
			if wrong > limit {
				t.Fatalf("%d of 40 pairs got the wrong verdict (limit %d)", wrong, limit)
			}
		})
	}
}

func TestCompareDetails(t *testing.T) {
	a := synthetic("20260101T000000Z-a", 1, 5, 100, 200, 2)
	b := synthetic("20260101T000001Z-b", 2, 5, 120, 200, 2)
	a.Fingerprint.Driver, b.Fingerprint.Driver = "535.104", "610.43"
	b.Prefill = []Prefill{{TargetTokens: 512, TokS: NewStat([]float64{2500, 2510})}}
	c := Compare(a, b, 0.05)
	d := row(t, c, "decode.128.tok_s")
	if d.DeltaPct < 15 || d.DeltaPct > 25 || !d.Significant || d.P < 0 || d.P >= 0.05 {
		t.Errorf("decode row = %+v", d)
	}
	if len(c.Fingerprint) != 1 || !strings.Contains(c.Fingerprint[0], "535.104 → 610.43") {
		t.Errorf("fingerprint changes = %v", c.Fingerprint)
	}
	if len(c.OnlyIn) != 1 || !strings.HasPrefix(c.OnlyIn[0], "prefill.512.tok_s") {
		t.Errorf("only-in = %v", c.OnlyIn)
	}
	// One repeat per side: no test possible.
	one := synthetic("20260101T000002Z-c", 3, 1, 100, 200, 2)
	if v := row(t, Compare(one, b, 0), "decode.128.tok_s").Verdict; v != "?" {
		t.Errorf("n=1 verdict %q, want ?", v)
	}
	var buf bytes.Buffer
	if err := c.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"decode.128.tok_s (tok/s)", "better", "driver: 535.104 → 610.43", "Welch"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, buf.String())
		}
	}
}
