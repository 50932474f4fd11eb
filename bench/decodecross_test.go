package bench

import (
	"math"
	"strings"
	"testing"
)

// TestDecodeCross: the decode cross-check pairs each request with its own
// eval_duration and shows the median request, so one request that the
// client lost time in (a loaded machine) does not move the verdict. The
// earlier figure, mean client rate vs mean server rate, was −16.6 % on the
// "one descheduled request" data.
func TestDecodeCross(t *testing.T) {
	tests := []struct {
		name         string
		pairs        []crossPair
		ok           bool
		client, pct  float64
		noteContains string
	}{
		{"none", nil, false, 0, 0, ""},
		{"zero server figure skipped", []crossPair{{100, 0}}, false, 0, 0, ""},
		{"one request", []crossPair{{99, 100}}, true, 99, -1, "-1.00 %"},
		{"one descheduled request", []crossPair{{100, 100}, {101, 100}, {50, 100}}, true, 100, 0, "-50.00 %, +0.00 %, +1.00 %"},
		{"machine slower in one request, for both", []crossPair{{200, 202}, {100, 102}, {198, 200}}, true, 198, -1, ""},
		{"even count: the lower median", []crossPair{{98, 100}, {103, 100}, {101, 100}, {90, 100}}, true, 98, -2, ""},
		{"NaN skipped", []crossPair{{math.NaN(), 100}, {97, 100}}, true, 97, -3, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, ok := decodeCross(128, tt.pairs)
			if ok != tt.ok {
				t.Fatalf("ok = %v, want %v (%+v)", ok, tt.ok, c)
			}
			if !ok {
				return
			}
			if c.Client != tt.client || math.Abs(c.DisagreementPct-tt.pct) > 1e-4 || c.Unit != "tok/s" {
				t.Errorf("cross %+v, want client %v and %.4f %%", c, tt.client, tt.pct)
			}
			if !strings.Contains(c.Note, tt.noteContains) || !strings.HasPrefix(c.Name, "decode.128 ") {
				t.Errorf("name %q, note %q, want the note to contain %q", c.Name, c.Note, tt.noteContains)
			}
		})
	}
}
