package benchcmd

import (
	"strings"
	"testing"

	"gpuhost/bench"
)

// A comparison that finds a metric worse ends with 1 ("ran and found a
// problem"), so a CI step can gate on it; better, unchanged and unknown
// verdicts end with 0.
func TestCompareWorseExits1(t *testing.T) {
	for _, tt := range []struct {
		verdicts []string
		want     int
	}{
		{[]string{"better", "~", "?"}, 0},
		{[]string{"better", "worse", "~"}, 1},
		{nil, 0},
	} {
		c := bench.Comparison{A: "a", B: "b"}
		for i, v := range tt.verdicts {
			c.Rows = append(c.Rows, bench.CompareRow{Metric: "m" + string(rune('0'+i)), Verdict: v})
		}
		err := worseExit(c)
		got := exitOf(err)
		if got != tt.want || (err != nil && !strings.Contains(err.Error(), "b is worse than a in m1")) {
			t.Errorf("%v: exit %d (%v), want %d", tt.verdicts, got, err, tt.want)
		}
	}
}
