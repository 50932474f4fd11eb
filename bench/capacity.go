package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Defaults and bounds of `gpuhost bench capacity`.
const (
	DefaultCapacityMaxConcurrency = 64
	// capacityPercentile is the percentile of the SLO's figures: TTFT p95
	// and TPOT p95 (the per-user rate 95 % of the requests reached).
	capacityPercentile = 95
)

// PhaseCapacity is the phase of a capacity search's progress and errors.
const PhaseCapacity = "capacity"

// CapacityOptions configure RunCapacity.
type CapacityOptions struct {
	// Options are the target, the serving lengths, the requests per repeat
	// (ServingRequests; 0: max(2×concurrency, 4)), the timeouts and the
	// fingerprint's facts; Repeats is the number of repeats of every
	// probe. Phases, Concurrency and RequestRates are set by the search.
	Options
	// TTFTP95 bounds the 95th percentile of the time to first token of a
	// repeat's requests; 0: no bound.
	TTFTP95 time.Duration
	// MinUserTokS bounds a user's output rate from below: 1000 / the
	// repeat's TPOT p95 (ms), the rate 95 % of its requests decoded at
	// least as fast; 0: no bound.
	MinUserTokS float64
	// MaxConcurrency bounds the search; default 64.
	MaxConcurrency int
}

// Check reports the error RunCapacity would refuse the options with (an
// SLO or bound the search cannot take), so that the command can refuse a
// bad flag as a usage error.
func (co CapacityOptions) Check() error {
	_, err := co.withDefaults()
	return err
}

func (co CapacityOptions) withDefaults() (CapacityOptions, error) {
	if co.MaxConcurrency == 0 {
		co.MaxConcurrency = DefaultCapacityMaxConcurrency
	}
	switch {
	case co.TTFTP95 < 0:
		return co, fmt.Errorf("TTFT p95 bound %s: must be positive", co.TTFTP95)
	case math.IsNaN(co.MinUserTokS) || math.IsInf(co.MinUserTokS, 0) || co.MinUserTokS < 0:
		return co, fmt.Errorf("minimum per-user rate %v tok/s: want a number ≥ 0", co.MinUserTokS)
	case co.TTFTP95 == 0 && co.MinUserTokS == 0:
		return co, errors.New("no SLO: give a TTFT p95 bound, a minimum per-user tok/s, or both")
	case co.MaxConcurrency < 1 || co.MaxConcurrency > ConcurrencyLimit:
		return co, fmt.Errorf("max concurrency %d: want 1 to %d", co.MaxConcurrency, ConcurrencyLimit)
	case len(co.RequestRates) > 0:
		return co, errors.New("a capacity search is closed-loop: request rates do not apply")
	}
	co.Phases = []string{PhaseServing}
	co.Concurrency = []int{co.MaxConcurrency} // sizes the client's connection pool
	co.PrefillTokens, co.DecodeTokens = []int{}, []int{}
	return co, nil
}

// RunCapacity finds the largest number of concurrent users (closed-loop
// concurrency) the target serves within the SLO; see CapacityBench for
// the search and the interval. The result is never nil; its Status is
// "failed" when no probe completed a request, "partial" when the search
// stopped early (the error says why), else "ok".
func RunCapacity(ctx context.Context, opts CapacityOptions) (*Result, error) {
	co, optErr := opts.withDefaults()
	ru, cfgErr := newRunner(co.Options, "capacity-")
	r := ru.r
	defer func() { r.FinishedAt = time.Now().UTC() }()
	cb := &CapacityBench{TTFTP95LimitMS: ms(co.TTFTP95), MinUserTokS: co.MinUserTokS, MaxConcurrency: co.MaxConcurrency,
		Repeats: ru.o.Repeats, Probes: []CapacityProbe{}, PerRepeat: []CapacityBracket{}}
	r.Capacity = cb
	if optErr != nil {
		err := fmt.Errorf("bench options: %w", optErr)
		r.addError("config", err.Error())
		return r, err
	}
	if cfgErr != nil {
		return r, cfgErr
	}
	cs := &capacitySearch{ru: ru, co: co, cb: cb}
	err := ru.session(ctx, func(ctx context.Context, before []byte) error {
		ru.announce(PhaseCapacity)
		err := cs.run(ctx)
		if before != nil && err == nil {
			ru.vllmCrossCheck(ctx, before)
		}
		return err
	})
	r.Config.Concurrency = cb.levels()
	if note := cb.conclude(err == nil); note != "" {
		r.Notes = append(r.Notes, note)
	}
	switch {
	case !cb.measured():
		r.Status = StatusFailed
		if err == nil {
			err = errors.New("nothing was measured; see the recorded errors")
		}
	case err != nil:
		r.Status = StatusPartial
		r.addError(PhaseCapacity, "search stopped: "+err.Error())
	default:
		r.Status = StatusOK
	}
	return r, err
}

// capacitySearch is one search's state.
type capacitySearch struct {
	ru      *runner
	co      CapacityOptions
	cb      *CapacityBench
	in, out int // serving lengths after capping to the context
	chars   int // the calibrated prompt of in tokens
}

func (cs *capacitySearch) run(ctx context.Context) error {
	cs.in, cs.out = cs.ru.servingLengths()
	cs.cb.InputTokens, cs.cb.OutputTokens = cs.in, cs.out
	cal, err := cs.ru.calibration(ctx, cs.in)
	if err != nil {
		cs.ru.addError(PhaseCapacity, err.Error())
		return err
	}
	cs.chars = cal.chars
	users, err := searchCapacity(ctx, cs.co.MaxConcurrency, cs.probe)
	cs.cb.Users = users
	return err
}

// searchCapacity returns the largest concurrency in [1, maxC] that meets
// the SLO (0 when 1 does not): it probes 1, 2, 4 … (doubling, the last
// step capped at maxC) until a level misses, then bisects between the
// last level met and the first missed, so it probes about 2·log2 of the
// answer levels. It assumes that a level above one that misses misses
// too. On an error it returns the largest level met so far.
func searchCapacity(ctx context.Context, maxC int, meets func(ctx context.Context, c int) (bool, error)) (int, error) {
	lo, hi := 0, 0 // the largest level met; the smallest missed
	for c := 1; hi == 0; c = min(2*c, maxC) {
		ok, err := meets(ctx, c)
		switch {
		case err != nil:
			return lo, err
		case !ok:
			hi = c
		case c == maxC:
			return c, nil
		default:
			lo = c
		}
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		ok, err := meets(ctx, mid)
		if err != nil {
			return lo, err
		}
		if ok {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo, nil
}

// probe runs level c Repeats times through the serving runner, judges
// each repeat against the SLO and records the probe; the level meets the
// SLO when more than half of its repeats do. A level where no request
// completed at all is an error: the target does not serve, and a
// capacity from it would mislead.
func (cs *capacitySearch) probe(ctx context.Context, c int) (bool, error) {
	ru, reps := cs.ru, cs.ru.o.Repeats
	l := servingLevel{c: c}
	n := ru.o.levelRequests(l)
	ru.mu.Lock()
	ru.total = ru.done + reps*n
	ru.mu.Unlock()
	p := CapacityProbe{Concurrency: c, Requests: n, Repeats: []CapacityRepeat{}}
	var runs []servingRun
	completed := 0
	for rep := 0; rep < reps; rep++ {
		sr := ru.servingLevel(ctx, l, n, cs.chars, cs.out, rep)
		if ctx.Err() != nil {
			return false, context.Cause(ctx)
		}
		runs = append(runs, sr)
		rp := cs.judge(sr)
		p.Repeats = append(p.Repeats, rp)
		completed += sr.ok
		if rp.MeetsSLO {
			p.RepeatsMet++
		}
	}
	p.MeetsSLO = 2*p.RepeatsMet > reps
	p.Serving = summarizeServing(l, n, cs.in, cs.out, runs)
	cs.cb.Probes = append(cs.cb.Probes, p)
	cs.noteProbe(p)
	if completed == 0 {
		err := fmt.Errorf("concurrency %d: no request completed in %d repeats (%s)", c, reps, failureText(p.Serving.Failures))
		ru.addError(PhaseCapacity, err.Error())
		return false, err
	}
	return p.MeetsSLO, nil
}

// judge holds one repeat of a level against the SLO. A failed request is
// a user not served within it.
func (cs *capacitySearch) judge(sr servingRun) CapacityRepeat {
	rp := CapacityRepeat{Completed: sr.ok, Failed: sr.failed}
	if len(sr.ttft) > 0 {
		rp.TTFTP95ms = Percentile(sr.ttft, capacityPercentile)
	}
	if len(sr.tpot) > 0 {
		rp.TPOTP95ms = Percentile(sr.tpot, capacityPercentile)
		if rp.TPOTP95ms > 0 {
			rp.UserTokS = 1000 / rp.TPOTP95ms
		}
	}
	var why []string
	limit, minTPS := cs.cb.TTFTP95LimitMS, cs.cb.MinUserTokS
	switch {
	case sr.ok == 0:
		why = append(why, "no request completed")
	case sr.failed > 0:
		why = append(why, fmt.Sprintf("%d of %d requests failed", sr.failed, sr.ok+sr.failed))
	}
	if limit > 0 && sr.ok > 0 && rp.TTFTP95ms > limit {
		why = append(why, fmt.Sprintf("TTFT p95 %s ms > %g ms", fmtNum(rp.TTFTP95ms), limit))
	}
	switch {
	case minTPS <= 0 || sr.ok == 0:
	case rp.UserTokS == 0:
		why = append(why, "no request produced two tokens, so no per-user rate")
	case rp.UserTokS < minTPS:
		why = append(why, fmt.Sprintf("per-user %s tok/s < %g tok/s", fmtNum(rp.UserTokS), minTPS))
	}
	rp.MeetsSLO = len(why) == 0
	rp.Why = strings.Join(why, "; ")
	return rp
}

// noteProbe records a probe's failed and short requests as notes: they
// are part of the measurement (a failed request misses the SLO), not
// errors of the run.
func (cs *capacitySearch) noteProbe(p CapacityProbe) {
	s := p.Serving
	r := cs.ru.r
	if s.Failed > 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("concurrency %d: %d of %d requests failed (counted as users not served within the SLO): %s",
			p.Concurrency, s.Failed, s.Failed+s.Completed, failureText(s.Failures)))
	}
	if s.Short > 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("concurrency %d: %d requests ended before %d output tokens (the server does not force the length)",
			p.Concurrency, s.Short, cs.out))
	}
}

// failureText lists failure reasons with their counts, most frequent
// first.
func failureText(f map[string]int) string {
	if len(f) == 0 {
		return "no reason recorded"
	}
	keys := make([]string, 0, len(f))
	for k := range f {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if f[a] != f[b] {
			return f[b] - f[a]
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s (×%d)", k, f[k])
	}
	return strings.Join(parts, ", ")
}
