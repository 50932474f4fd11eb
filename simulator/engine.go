package simulator

import (
	"context"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// slots bounds how many sequences generate at once (vLLM --max-num-seqs,
// OLLAMA_NUM_PARALLEL); requests beyond it wait, and are counted as waiting.
type slots struct {
	sem     chan struct{}
	running atomic.Int64
	waiting atomic.Int64
}

func newSlots(n int) *slots {
	return &slots{sem: make(chan struct{}, n)}
}

// acquire blocks until a slot is free or ctx ends; the returned release must
// be called exactly once when it succeeds.
func (s *slots) acquire(ctx context.Context) (release func(), err error) {
	select {
	case s.sem <- struct{}{}:
	default:
		s.waiting.Add(1)
		select {
		case s.sem <- struct{}{}:
			s.waiting.Add(-1)
		case <-ctx.Done():
			s.waiting.Add(-1)
			return nil, ctx.Err()
		}
	}
	s.running.Add(1)
	var once atomic.Bool
	return func() {
		if once.CompareAndSwap(false, true) {
			s.running.Add(-1)
			<-s.sem
		}
	}, nil
}

// planTokens decides the completion length: the natural reply length (or
// minTokens if larger), unless ignoreEOS, capped by maxTokens; finish reason
// "length" when the cap cut it short.
func planTokens(natural, maxTokens, minTokens int, ignoreEOS bool) (int, string) {
	want := max(natural, minTokens)
	if ignoreEOS && maxTokens >= 0 { // without a cap, EOS still ends the reply
		want = math.MaxInt
	}
	if maxTokens >= 0 && want >= maxTokens {
		return maxTokens, "length"
	}
	return want, "stop"
}

// genStats are the measured phases of one generation.
type genStats struct {
	prefill time.Duration // from start to first token
	decode  time.Duration // from first token to last
	emitted int
}

// pacer times prefill and decode with timers (never busy-waiting).
type pacer struct {
	prefillTPS float64
	decodeTPS  float64
}

// maxJitter bounds Options.Jitter: at 0.3 a rate already lands below
// half its mean in one request of 20,000; the draw is clamped there.
const maxJitter = 0.3

// jitter draws the per-request factors of Options.Jitter from one seeded
// source (the server's requests run concurrently, hence the lock).
type jitter struct {
	mu  sync.Mutex
	rng *rand.Rand
	sd  float64
}

func newJitter(sd float64, seed uint64) *jitter {
	return &jitter{rng: rand.New(rand.NewPCG(seed, 0x5eed)), sd: sd}
}

func (j *jitter) factor() float64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return min(max(1+j.rng.NormFloat64()*j.sd, 0.5), 1.5)
}

// jittered is p with each rate scaled by its own draw of j; p itself when
// j is nil.
func (p pacer) jittered(j *jitter) pacer {
	if j == nil {
		return p
	}
	return pacer{prefillTPS: p.prefillTPS * j.factor(), decodeTPS: p.decodeTPS * j.factor()}
}

func rateDuration(tokens int, tps float64) time.Duration {
	d := float64(tokens) / tps * float64(time.Second)
	if d > float64(math.MaxInt64/2) {
		return time.Duration(math.MaxInt64 / 2)
	}
	return time.Duration(d)
}

// generate waits promptTokens/prefillTPS, then calls emit for tokens
// 0..n-1, token i due i/decodeTPS after the first. A late token is emitted at
// once, so the average rate holds even when the scheduler is slow. It stops at
// the first emit error or when ctx ends (the client went away).
func (p pacer) generate(ctx context.Context, promptTokens, n int, onFirst func(), emit func(i int) error) (genStats, error) {
	var st genStats
	start := time.Now()
	timer := time.NewTimer(rateDuration(promptTokens, p.prefillTPS))
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-ctx.Done():
		st.prefill = time.Since(start)
		return st, ctx.Err()
	}
	first := time.Now()
	st.prefill = first.Sub(start)
	step := float64(time.Second) / p.decodeTPS
	for i := 0; i < n; i++ {
		if i > 0 {
			due := first.Add(time.Duration(float64(i) * step))
			if wait := time.Until(due); wait > 0 {
				timer.Reset(wait)
				select {
				case <-timer.C:
				case <-ctx.Done():
					st.decode = time.Since(first)
					return st, ctx.Err()
				}
			} else if err := ctx.Err(); err != nil {
				st.decode = time.Since(first)
				return st, err
			}
		} else if onFirst != nil {
			onFirst()
		}
		if err := emit(i); err != nil {
			st.decode = time.Since(first)
			return st, err
		}
		st.emitted++
	}
	st.decode = time.Since(first)
	return st, nil
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
