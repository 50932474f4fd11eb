package bench

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"
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
