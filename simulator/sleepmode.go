package simulator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"gpuhost/nvml"
)

// vLLM's sleep mode as its development routes serve it: the handlers follow
// vllm/entrypoints/serve/sleep/api_router.py and /collective_rpc, the state
// follows the V1 executor's sleep and wake_up (vllm/v1/executor/abstract.py:
// sleeping_tags, "already sleeping" and "not sleeping" are warnings, not
// errors) and the worker's CuMem allocator (level 1 backs the weights up in
// host memory, level 2 discards them; wake_up maps the memory again and
// copies a backup back). The package doc lists what is verified against
// vLLM's source and documentation and what is the simulator's own choice.

// errSleepAbort is how a generation in flight ends when the engine is put to
// sleep (newer vLLM's default mode=abort).
var errSleepAbort = errors.New("request aborted: the engine was put to sleep")

// copyWait waits out a copy or reload (d from copyTime); a variable so that
// tests can hold a copy in progress and look at the state meanwhile.
var copyWait = sleepCtx

// Sleep levels of POST /sleep?level=N.
const (
	sleepLevelOffload = 1 // weights to host memory, KV cache discarded
	sleepLevelDiscard = 2 // weights and KV cache discarded
)

// vllmEngine is the vLLM flavour's GPU memory: the residual (CUDA context,
// graphs), the weights and the KV cache, which sleep releases and wake_up
// maps again, and the simulated VRAM and host memory claim that follows
// them. It is safe for concurrent use.
type vllmEngine struct {
	log     *slog.Logger
	simDir  string
	pid     int
	name    string
	enabled bool // --enable-sleep-mode
	// residual, weights and kv are MiB; they add up to the VRAM claim.
	residual, weights, kv uint64
	h2dGBps, reloadGBps   float64
	ctx                   context.Context // server lifetime: ends copies in progress

	// op runs sleep, wake_up and reload_weights one at a time, as the
	// engine core runs its utility calls.
	op sync.Mutex

	mu sync.Mutex
	// weightsAsleep and kvAsleep are the executor's sleeping_tags;
	// is_sleeping is true while either is.
	weightsAsleep, kvAsleep bool
	// weightsMapped and kvMapped say what holds VRAM. wake_up maps the
	// weights before it copies the backup back, so for that long they are
	// mapped and still asleep.
	weightsMapped, kvMapped bool
	// weightsValid is false after sleep level 2 until reload_weights.
	weightsValid bool
	// hostMiB is the host memory holding the weights' backup (level 1).
	hostMiB uint64
	// fallingAsleep covers the offload copy of level 1: is_sleeping is
	// still false (the executor sets it when the copy is done) but no new
	// generation starts.
	fallingAsleep bool
	// metricAwake and metricLevel are vllm:engine_sleep_state as AsyncLLM
	// records it: any POST /sleep sets asleep at its level, any POST
	// /wake_up sets awake, even a partial or no-op one.
	metricAwake bool
	metricLevel int
	// awake ends (abort) when the engine is put to sleep; generations run
	// under it.
	awake context.Context
	abort context.CancelFunc
	// woken is set by the first wake_up that wakes the engine (the wake
	// faults arm then); sleeps counts the sleeps (the residual fault
	// starts at the second); fault is Options.WakeFault.
	woken  bool
	sleeps int
	fault  string
}

func newVLLMEngine(ctx context.Context, o Options) *vllmEngine {
	res, w := uint64(o.SleepResidualMiB), uint64(o.WeightsMiB)
	e := &vllmEngine{
		log: o.Logger, simDir: o.SimDir, pid: os.Getpid(), name: "vllm " + o.Model, enabled: o.EnableSleepMode,
		residual: res, weights: w, kv: uint64(o.VRAMMiB) - res - w, h2dGBps: o.H2DGBps, reloadGBps: o.ReloadGBps, ctx: ctx,
		weightsMapped: true, kvMapped: true, weightsValid: true, metricAwake: true, fault: o.WakeFault,
	}
	e.awake, e.abort = context.WithCancel(context.Background())
	return e
}

// vramLocked is the VRAM the engine holds now, in MiB.
func (e *vllmEngine) vramLocked() uint64 {
	mib := e.residual
	if e.fault == WakeFaultResidual && e.sleeps > 1 && !e.weightsMapped {
		mib += wakeFaultResidualMiB
	}
	if e.weightsMapped {
		mib += e.weights
	}
	if e.kvMapped {
		mib += e.kv
	}
	return mib
}

// claimLocked writes the claim that matches the memory held (no-op without a
// claims dir).
func (e *vllmEngine) claimLocked() error {
	if e.simDir == "" {
		return nil
	}
	return nvml.WriteClaim(e.simDir, nvml.Claim{PID: e.pid, MiB: e.vramLocked(), HostMiB: e.hostMiB, Name: e.name, GPUs: visibleSimGPUs()})
}

// reclaimLocked is claimLocked where a failure can only be logged.
func (e *vllmEngine) reclaimLocked() {
	if err := e.claimLocked(); err != nil {
		e.log.Error("update simulated VRAM claim", "dir", e.simDir, "err", err)
	}
}

// claim writes the loaded engine's claim at start-up.
func (e *vllmEngine) claim() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.claimLocked()
}

// release removes the claim when the server exits.
func (e *vllmEngine) release() {
	if e.simDir == "" {
		return
	}
	if err := nvml.RemoveClaim(e.simDir, e.pid); err != nil {
		e.log.Error("release simulated VRAM", "err", err)
	}
}

func (e *vllmEngine) sleepingLocked() bool { return e.weightsAsleep || e.kvAsleep }

// copyTime is how long moving mib MiB at gbps GB/s (10^9 bytes) takes.
func copyTime(mib uint64, gbps float64) time.Duration {
	return time.Duration(float64(mib) * (1 << 20) / (gbps * 1e9) * float64(time.Second))
}

// sleep puts the engine to sleep at level 1 or 2 and returns once it sleeps
// (vLLM answers /sleep after the executor is done). In-flight generations
// are aborted first. Sleeping again is a no-op, as in vLLM. The error is the
// server's context when it stops during the offload.
func (e *vllmEngine) sleep(level int) error {
	e.op.Lock()
	defer e.op.Unlock()
	start := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sleepingLocked() {
		e.log.Warn("Executor is already sleeping.")
		e.metricAwake, e.metricLevel = false, level
		return nil
	}
	before := e.vramLocked()
	e.sleeps++
	e.fallingAsleep = true
	e.abort()
	if level == sleepLevelOffload {
		e.hostMiB = e.weights // pinned host memory for the backup, then the copy
		e.reclaimLocked()
		e.mu.Unlock()
		err := copyWait(e.ctx, copyTime(e.weights, e.h2dGBps))
		e.mu.Lock()
		if err != nil {
			return err
		}
	} else {
		e.weightsValid = false
	}
	e.weightsMapped, e.kvMapped = false, false
	e.weightsAsleep, e.kvAsleep = true, true
	e.fallingAsleep = false
	e.metricAwake, e.metricLevel = false, level
	e.reclaimLocked()
	e.log.Info(fmt.Sprintf("Sleep mode freed %.2f GiB memory, %.2f GiB memory is still in use.",
		float64(before-e.vramLocked())/1024, float64(e.vramLocked())/1024), "level", level, "host_mib", e.hostMiB)
	e.log.Info(fmt.Sprintf("It took %.6f seconds to fall asleep.", time.Since(start).Seconds()))
	return nil
}

// wake maps the sleeping memory of tags again (nil: all of it), weights
// before KV cache as vLLM's allocator does, copying the weights' backup back
// after level 1. It returns once done. A tag that is not asleep makes the
// whole call a no-op, and so does waking an engine that is not asleep, both
// logged as vLLM warns.
func (e *vllmEngine) wake(tags []string) error {
	e.op.Lock()
	defer e.op.Unlock()
	start := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.metricAwake, e.metricLevel = true, 0
	if !e.sleepingLocked() {
		e.log.Warn("Executor is not sleeping.")
		return nil
	}
	for _, t := range tags {
		if !(t == "weights" && e.weightsAsleep) && !(t == "kv_cache" && e.kvAsleep) {
			e.log.Warn(fmt.Sprintf("Tag %s is not in sleeping tags %v", t, e.sleepingTagsLocked()))
			return nil
		}
	}
	want := func(tag string) bool { return len(tags) == 0 || slices.Contains(tags, tag) }
	var woken []string
	if want("weights") && e.weightsAsleep {
		woken = append(woken, "weights")
		e.weightsMapped = true
		e.reclaimLocked()
		if e.hostMiB > 0 {
			e.mu.Unlock()
			err := copyWait(e.ctx, copyTime(e.weights, e.h2dGBps))
			e.mu.Lock()
			if err != nil {
				return err
			}
			e.hostMiB = 0
			e.reclaimLocked()
		}
		e.weightsAsleep = false
	}
	if want("kv_cache") && e.kvAsleep {
		woken = append(woken, "kv_cache")
		e.kvMapped = true
		e.kvAsleep = false
		e.reclaimLocked()
	}
	if !e.sleepingLocked() {
		e.awake, e.abort = context.WithCancel(context.Background())
		e.woken = true
	}
	e.log.Info(fmt.Sprintf("It took %.6f seconds to wake up tags %v.", time.Since(start).Seconds(), woken),
		"is_sleeping", e.sleepingLocked(), "weights_valid", e.weightsValid)
	return nil
}

func (e *vllmEngine) sleepingTagsLocked() []string {
	var out []string
	if e.weightsAsleep {
		out = append(out, "weights")
	}
	if e.kvAsleep {
		out = append(out, "kv_cache")
	}
	return out
}

// reloadWeights is collective_rpc reload_weights: the weights are read again
// into their (mapped) memory, which makes them valid after level 2.
func (e *vllmEngine) reloadWeights() *apiError {
	e.op.Lock()
	defer e.op.Unlock()
	e.mu.Lock()
	mapped := e.weightsMapped
	e.mu.Unlock()
	if !mapped {
		return &apiError{status: http.StatusInternalServerError,
			message: "simulated vLLM: reload_weights needs the weights memory mapped: POST /wake_up?tags=weights first (real vLLM would fail with a CUDA error)"}
	}
	if err := copyWait(e.ctx, copyTime(e.weights, e.reloadGBps)); err != nil {
		return &apiError{status: http.StatusServiceUnavailable, message: "server shutting down"}
	}
	e.mu.Lock()
	e.weightsValid = true
	e.mu.Unlock()
	e.log.Info("reloaded weights", "mib", e.weights)
	return nil
}

// isSleeping is GET /is_sleeping's answer.
func (e *vllmEngine) isSleeping() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.sleepingLocked()
}

// unavailable says why a generation cannot run now: 503 while the engine
// sleeps or falls asleep, 500 while its weights are the garbage sleep level
// 2 left; nil when it can.
func (e *vllmEngine) unavailable() *apiError {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.fallingAsleep || e.sleepingLocked() {
		return &apiError{status: http.StatusServiceUnavailable, errType: "ModelSleepingError",
			message: "Model is currently in sleep mode. Please wake it up first with a POST request to /wake_up"}
	}
	if !e.weightsValid {
		return &apiError{status: http.StatusInternalServerError,
			message: "simulated vLLM: the model weights were discarded by sleep level 2 and not reloaded " +
				`(POST /wake_up?tags=weights, then POST /collective_rpc {"method":"reload_weights"}, then POST /wake_up?tags=kv_cache); ` +
				"real vLLM would answer with garbage output instead"}
	}
	return nil
}

// bind runs a generation under the engine's awake period: ctx ends with
// cause errSleepAbort when the engine is put to sleep. done must be called.
func (e *vllmEngine) bind(ctx context.Context) (context.Context, func()) {
	e.mu.Lock()
	awake := e.awake
	e.mu.Unlock()
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(awake, func() { cancel(errSleepAbort) })
	return ctx, func() {
		stop()
		cancel(nil)
	}
}

// sleepState is vllm:engine_sleep_state's three samples.
func (e *vllmEngine) sleepState() (awake, offloaded, discarded float64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.metricAwake {
		return 1, 0, 0
	}
	switch e.metricLevel {
	case sleepLevelOffload:
		return 0, 1, 0
	case sleepLevelDiscard:
		return 0, 0, 1
	}
	return 0, 0, 0
}

// vllmSleepRoutes mounts the development routes (VLLM_SERVER_DEV_MODE=1).
func (s *server) vllmSleepRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /sleep", s.handleSleep)
	mux.HandleFunc("POST /wake_up", func(w http.ResponseWriter, r *http.Request) {
		tags := r.URL.Query()["tags"] // repeated ?tags=weights&tags=kv_cache; none: all
		s.log.Info("wake up the engine with tags: " + fmt.Sprint(tags))
		if err := s.engine.wake(tags); err != nil {
			writeOpenAIError(w, s.opts.Flavor, &apiError{status: http.StatusServiceUnavailable, message: "server shutting down"})
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("GET /is_sleeping", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]bool{"is_sleeping": s.engine.isSleeping()})
	})
	mux.HandleFunc("POST /collective_rpc", s.handleCollectiveRPC)
	mux.HandleFunc("POST /reset_prefix_cache", func(w http.ResponseWriter, _ *http.Request) {
		s.log.Info("reset prefix cache")
		w.WriteHeader(http.StatusOK)
	})
}

// handleSleep serves POST /sleep?level=1|2 (default 1): 200 with an empty
// body once asleep.
func (s *server) handleSleep(w http.ResponseWriter, r *http.Request) {
	level := sleepLevelOffload
	if q := r.URL.Query(); q.Has("level") {
		n, err := strconv.Atoi(q.Get("level"))
		if err != nil || (n != sleepLevelOffload && n != sleepLevelDiscard) {
			writeOpenAIError(w, s.opts.Flavor, badRequest("simulated vLLM: sleep level %q: want 1 (offload the weights) or 2 (discard them)", q.Get("level")))
			return
		}
		level = n
	}
	if !s.engine.enabled {
		writeOpenAIError(w, s.opts.Flavor, &apiError{status: http.StatusInternalServerError,
			message: "Sleep mode is not enabled in the model config: start the server with --enable-sleep-mode"})
		return
	}
	if err := s.engine.sleep(level); err != nil {
		writeOpenAIError(w, s.opts.Flavor, &apiError{status: http.StatusServiceUnavailable, message: "server shutting down"})
		return
	}
	w.WriteHeader(http.StatusOK)
}

// handleCollectiveRPC serves POST /collective_rpc {"method": …}; only
// reload_weights is simulated. vLLM answers {"results": [one per worker]},
// here one worker whose reload_weights returns None.
func (s *server) handleCollectiveRPC(w http.ResponseWriter, r *http.Request) {
	body, e := readBody(w, r)
	if e != nil {
		writeOpenAIError(w, s.opts.Flavor, e)
		return
	}
	var req struct {
		Method *string `json:"method"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		// FastAPI's HTTPException shape, as vLLM raises it here.
		writeJSON(w, http.StatusBadRequest, map[string]string{"detail": "JSON decode error: " + err.Error()})
		return
	}
	if req.Method == nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"detail": "Missing 'method' in request body"})
		return
	}
	if *req.Method != "reload_weights" {
		writeOpenAIError(w, s.opts.Flavor, &apiError{status: http.StatusInternalServerError,
			message: fmt.Sprintf("simulated vLLM: collective_rpc method %q is not simulated (only reload_weights)", *req.Method)})
		return
	}
	if e := s.engine.reloadWeights(); e != nil {
		writeOpenAIError(w, s.opts.Flavor, e)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"results": []any{nil}})
}

// sleepGate answers a generation request that cannot run because the vLLM
// engine sleeps or has garbage weights; it reports whether it answered.
func (s *server) sleepGate(w http.ResponseWriter) bool {
	if s.engine == nil {
		return false
	}
	if e := s.engine.unavailable(); e != nil {
		writeOpenAIError(w, s.opts.Flavor, e)
		return true
	}
	return false
}
