package bench

import (
	"strings"
	"testing"
	"time"
)

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
	if p.ttft.server != 20 || p.tpot.server != 5 || p.tpot.client != 6 || p.e2e.client != 80 || p.e2e.server != 70 {
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
