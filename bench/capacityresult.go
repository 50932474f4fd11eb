package bench

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// CapacityBench is `gpuhost bench capacity`: the largest number of
// concurrent users (closed-loop concurrency) the target serves within the
// SLO, with its interval and every probe of the search. It sits in
// Result.Capacity; such a result has no prefill, decode or serving
// figures of its own (each probe carries its serving level).
//
// The SLO, per repeat of a level: TTFT p95 ≤ ttft_p95_limit_ms (when set),
// 1000 / TPOT p95 ≥ min_user_tok_s (when set: 95 % of the requests
// decoded at least that fast), and no failed request. A level meets it
// when more than half of its repeats do.
//
// The search probes 1, 2, 4 … up to max_concurrency until a level misses,
// then bisects between the last level met and the first missed; users is
// the largest level met (0: not even one user). It assumes that a level
// above one that misses misses too.
//
// The interval comes from the repeats: repeat r of the probes, read alone,
// brackets that repeat's capacity: per_repeat[r].low is the largest probed
// level below the first level repeat r missed, high that level − 1
// (max_concurrency when it missed none). [low, high] is [min low, max
// high] over the repeats: with R independent repeats it covers the
// median per-repeat capacity with probability at least confidence =
// 1 − 2^(1−R) (the order-statistic interval of the sample minimum and
// maximum; the brackets only widen it). With one repeat there is no
// confidence.
//
//	ttft_p95_limit_ms, min_user_tok_s   the SLO (0: that bound is not set)
//	max_concurrency, repeats, input_tokens, output_tokens
//	users                 the capacity
//	at_max_concurrency    every level up to max_concurrency met the SLO: the capacity may be higher
//	low, high, confidence the interval
//	per_repeat[]          {low, high}: each repeat's bracket
//	users_per_repeat      Stat of the per-repeat lows (what compare tests)
//	probes[]              in the order run: {concurrency, requests, meets_slo, repeats_met,
//	                      repeats[]{ttft_p95_ms, tpot_p95_ms, user_tok_s, completed, failed, meets_slo, why},
//	                      serving (the level as bench run reports it)}
type CapacityBench struct {
	TTFTP95LimitMS float64 `json:"ttft_p95_limit_ms"`
	MinUserTokS    float64 `json:"min_user_tok_s"`
	MaxConcurrency int     `json:"max_concurrency"`
	Repeats        int     `json:"repeats"`
	InputTokens    int     `json:"input_tokens"`
	OutputTokens   int     `json:"output_tokens"`

	Users       int               `json:"users"`
	AtMax       bool              `json:"at_max_concurrency,omitempty"`
	Low         int               `json:"low"`
	High        int               `json:"high"`
	Confidence  float64           `json:"confidence"`
	PerRepeat   []CapacityBracket `json:"per_repeat"`
	UsersRepeat Stat              `json:"users_per_repeat"`
	Probes      []CapacityProbe   `json:"probes"`
}

// CapacityBracket is the capacity one repeat shows: between Low and High.
type CapacityBracket struct {
	Low  int `json:"low"`
	High int `json:"high"`
}

// CapacityProbe is one level of the search.
type CapacityProbe struct {
	Concurrency int              `json:"concurrency"`
	Requests    int              `json:"requests"` // per repeat
	MeetsSLO    bool             `json:"meets_slo"`
	RepeatsMet  int              `json:"repeats_met"`
	Repeats     []CapacityRepeat `json:"repeats"`
	Serving     Serving          `json:"serving"`
}

// CapacityRepeat is one repeat of a probe held against the SLO.
type CapacityRepeat struct {
	TTFTP95ms float64 `json:"ttft_p95_ms"`
	TPOTP95ms float64 `json:"tpot_p95_ms"`
	// UserTokS is 1000 / TPOTP95ms (0 without a TPOT).
	UserTokS  float64 `json:"user_tok_s"`
	Completed int     `json:"completed"`
	Failed    int     `json:"failed"`
	MeetsSLO  bool    `json:"meets_slo"`
	// Why says which bound was missed.
	Why string `json:"why,omitempty"`
}

// levels are the probed concurrencies, ascending.
func (cb *CapacityBench) levels() []int {
	out := []int{}
	for _, p := range cb.Probes {
		out = append(out, p.Concurrency)
	}
	slices.Sort(out)
	return out
}

// measured reports whether any probe completed a request.
func (cb *CapacityBench) measured() bool {
	for _, p := range cb.Probes {
		if p.Serving.Completed > 0 {
			return true
		}
	}
	return false
}

// conclude sets each repeat's bracket, the interval, its confidence and
// the per-repeat Stat from the probes; complete says the search finished
// (else at_max_concurrency is not claimed). It returns a note when the
// interval had to be widened to hold the search's answer.
func (cb *CapacityBench) conclude(complete bool) (note string) {
	if len(cb.Probes) == 0 {
		return ""
	}
	probes := slices.Clone(cb.Probes)
	slices.SortStableFunc(probes, func(a, b CapacityProbe) int { return cmp.Compare(a.Concurrency, b.Concurrency) })
	cb.PerRepeat = []CapacityBracket{}
	var lows []float64
	cb.Low, cb.High = math.MaxInt, 0
	for rep := 0; rep < cb.Repeats; rep++ {
		b := CapacityBracket{High: cb.MaxConcurrency}
		for _, p := range probes {
			if rep >= len(p.Repeats) {
				break
			}
			if !p.Repeats[rep].MeetsSLO {
				b.High = p.Concurrency - 1
				break
			}
			b.Low = p.Concurrency
		}
		cb.PerRepeat = append(cb.PerRepeat, b)
		lows = append(lows, float64(b.Low))
		cb.Low, cb.High = min(cb.Low, b.Low), max(cb.High, b.High)
	}
	// With repeats that miss a level below one they meet, the brackets
	// may leave out the search's answer; the interval always holds it.
	if cb.Users < cb.Low || cb.Users > cb.High {
		note = fmt.Sprintf("the repeats' brackets [%d, %d] leave out the search's answer %d (a repeat missed a lower level than one it met): "+
			"the interval is widened to hold it", cb.Low, cb.High, cb.Users)
		cb.Low, cb.High = min(cb.Low, cb.Users), max(cb.High, cb.Users)
	}
	cb.UsersRepeat = NewStat(lows)
	if cb.Repeats >= 2 {
		cb.Confidence = 1 - math.Pow(2, float64(1-cb.Repeats))
	}
	cb.AtMax = complete && cb.Users == cb.MaxConcurrency
	return note
}

// metrics is the comparable figure of a capacity result: capacity.users,
// one sample per repeat (its bracket's low).
func (cb *CapacityBench) metrics() []Metric {
	if cb.UsersRepeat.N == 0 {
		return nil
	}
	return []Metric{{Name: "capacity.users", Unit: "users", HigherIsBetter: true, Stat: cb.UsersRepeat}}
}

// slo prints the SLO: "TTFT p95 ≤ 1000 ms, ≥ 20 tok/s per user".
func (cb *CapacityBench) slo() string {
	var s string
	if cb.TTFTP95LimitMS > 0 {
		s = fmt.Sprintf("TTFT p95 ≤ %g ms", cb.TTFTP95LimitMS)
	}
	if cb.MinUserTokS > 0 {
		if s != "" {
			s += ", "
		}
		s += fmt.Sprintf("≥ %g tok/s per user", cb.MinUserTokS)
	}
	return s
}

// interval prints "8 [7, 9] users" ("≥ 64" at the search's bound).
func (cb *CapacityBench) interval() string {
	users := fmt.Sprintf("%d", cb.Users)
	if cb.AtMax {
		users = "≥ " + users
	}
	if len(cb.PerRepeat) == 0 {
		return users + " users"
	}
	return fmt.Sprintf("%s [%d, %d] users", users, cb.Low, cb.High)
}

// capacityDiff lists what differs between the searches of two capacity
// results (SLO, lengths, bound), for compare's setup changes: a capacity
// under another SLO is another question.
func capacityDiff(a, b *CapacityBench) []string {
	if a == nil || b == nil {
		return nil
	}
	var out []string
	add := func(what, x, y string) {
		if x != y {
			out = append(out, fmt.Sprintf("%s: %s → %s", what, orDash(x), orDash(y)))
		}
	}
	add("SLO", a.slo(), b.slo())
	add("serving lengths", fmt.Sprintf("%d in / %d out", a.InputTokens, a.OutputTokens), fmt.Sprintf("%d in / %d out", b.InputTokens, b.OutputTokens))
	add("max concurrency", fmt.Sprint(a.MaxConcurrency), fmt.Sprint(b.MaxConcurrency))
	return out
}
