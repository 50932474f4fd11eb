package simulator

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// server is the state both flavours share: options, the concurrency slots,
// the pacing, and the flavour's extras (vLLM metrics or Ollama's models).
type server struct {
	opts    Options
	log     *slog.Logger
	slots   *slots
	pace    pacer
	jitter  *jitter // nil: every request at the configured rates
	created int64   // unix seconds, reported as "created" of models

	metrics    *vllmMetrics  // vLLM only
	kvCapacity int64         // vLLM: simulated KV cache size in tokens
	engine     *vllmEngine   // vLLM only: GPU memory and sleep mode
	models     *modelManager // Ollama only
}

func newServer(opts Options) *server {
	s := &server{
		opts:    opts,
		log:     opts.Logger,
		slots:   newSlots(opts.MaxNumSeqs),
		pace:    pacer{prefillTPS: opts.PrefillTPS, decodeTPS: opts.DecodeTPS},
		created: time.Now().Unix(),
	}
	if opts.Jitter > 0 {
		s.jitter = newJitter(opts.Jitter, opts.JitterSeed)
	}
	if opts.Flavor == FlavorVLLM {
		s.metrics = newVLLMMetrics()
		kv := int64(opts.VRAMMiB) << 20 / 4 / kvBytesPerToken
		s.kvCapacity = max(kv, int64(opts.MaxModelLen))
		s.kvCapacity -= s.kvCapacity % kvBlockSize
	}
	return s
}

// genJob is one generation after validation.
type genJob struct {
	tag          string        // Ollama: the model that must be loaded
	keepAlive    time.Duration // Ollama: keep_alive to apply when done
	promptTokens int
	tokens       int    // completion tokens to emit
	finish       string // finish reason when all tokens are emitted
}

// genResult is what the response's usage and timings report.
type genResult struct {
	emitted int
	load    time.Duration
	prefill time.Duration
	decode  time.Duration
	total   time.Duration
}

// generate waits for a sequence slot, has the model loaded (Ollama), then
// paces the job, calling emit for each token. Metrics (vLLM) follow the
// request through queueing, prefill, decode and its end. The error is the
// request context's when the client went away, errSleepAbort when the vLLM
// engine was put to sleep meanwhile, or emit's.
func (s *server) generate(ctx context.Context, job genJob, emit func(i int) error) (genResult, error) {
	if s.engine == nil {
		return s.generateJob(ctx, job, emit)
	}
	ctx, done := s.engine.bind(ctx)
	defer done()
	var res genResult
	var err error
	switch s.activeWakeFault() {
	case WakeFaultHang:
		err = hangUntilDone(ctx)
	case WakeFaultSlow:
		slow := *s
		slow.pace.decodeTPS /= 2
		res, err = slow.generateJob(ctx, job, emit)
	default:
		res, err = s.generateJob(ctx, job, emit)
	}
	if err != nil && errors.Is(context.Cause(ctx), errSleepAbort) {
		err = errSleepAbort
	}
	return res, err
}

func (s *server) generateJob(ctx context.Context, job genJob, emit func(i int) error) (genResult, error) {
	var res genResult
	start := time.Now()
	release, err := s.slots.acquire(ctx)
	if err != nil {
		if s.metrics != nil { // gave up while queued: vLLM counts an abort
			s.metrics.finished("abort", 0, time.Since(start))
		}
		return res, err
	}
	defer release()
	if s.models != nil {
		load, err := s.models.acquire(ctx, job.tag)
		res.load = load
		if err != nil {
			res.total = time.Since(start)
			return res, err
		}
		defer s.models.release(job.keepAlive)
	}
	prefilled := false
	onFirst := func() {
		prefilled = true
		if s.metrics != nil {
			s.metrics.prefilled(job.promptTokens, time.Since(start))
		}
	}
	st, err := s.pace.jittered(s.jitter).generate(ctx, job.promptTokens, job.tokens, onFirst, func(i int) error {
		if err := emit(i); err != nil {
			return err
		}
		if s.metrics != nil {
			s.metrics.generated()
		}
		return nil
	})
	res.emitted, res.prefill, res.decode = st.emitted, st.prefill, st.decode
	res.total = time.Since(start)
	if s.metrics != nil {
		reason := "abort"
		if err == nil {
			reason = "stop" // vLLM's finished_reason has stop, length, abort
			if job.finish == "length" {
				reason = "length"
			}
		}
		kv := st.emitted
		if prefilled {
			kv += job.promptTokens
		}
		s.metrics.finished(reason, kv, res.total)
	}
	return res, err
}
