package simulator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"
)

// shutdownGrace bounds how long Run waits for responses to finish after its
// context ends; in-flight generations are aborted first, so this is short.
const shutdownGrace = 5 * time.Second

// Run serves the simulated inference server until ctx ends, then shuts down
// gracefully (in-flight generations are aborted, as vLLM and Ollama do on
// SIGTERM) and removes its simulated VRAM claim. It returns nil after a
// clean stop and an error for bad options or a failure to listen or claim.
//
// vLLM: claims VRAM at once (vLLM allocates weights and KV cache up front),
// waits LoadTime, then listens. Ollama: listens at once and claims VRAM when
// a model load begins.
func Run(ctx context.Context, opts Options) error {
	o, err := opts.withDefaults()
	if err != nil {
		return err
	}
	log := o.Logger.With("sim", string(o.Flavor))
	o.Logger = log
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	crashAtStart(o)
	s := newServer(o)
	addr := o.Addr
	if addr == "" {
		addr = net.JoinHostPort(o.Host, strconv.Itoa(o.Port))
	}

	var handler http.Handler
	switch o.Flavor {
	case FlavorVLLM:
		s.engine = newVLLMEngine(runCtx, o)
		if err := s.engine.claim(); err != nil {
			return fmt.Errorf("simulated vllm: claim %d MiB of simulated VRAM: %w", o.VRAMMiB, err)
		}
		defer s.engine.release()
		log.Info("initializing engine", "model", o.Model, "served_model_name", o.ServedName,
			"max_model_len", o.MaxModelLen, "max_num_seqs", o.MaxNumSeqs,
			"gpu_memory_utilization", o.GPUMemoryUtilization, "vram_mib", o.VRAMMiB,
			"quantization", o.Quantization, "kv_cache_dtype", o.KVCacheDType,
			"tool_call_parser", o.ToolCallParser, "load_time", o.LoadTime,
			"enable_sleep_mode", o.EnableSleepMode, "dev_mode", o.DevMode, "weights_mib", o.WeightsMiB)
		if err := sleepCtx(ctx, o.LoadTime); err != nil {
			log.Info("stopped during engine start-up")
			return nil
		}
		handler = s.vllmHandler()
	case FlavorOllama:
		s.models = newModelManager(runCtx, o)
		defer func() {
			cancel() // ends loads in flight before close waits for them
			s.models.close()
		}()
		handler = s.ollamaHandler()
	}

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("simulated %s: listen on %s: %w", o.Flavor, addr, err)
	}
	srv := &http.Server{
		Handler:           accessLog(log, crashAfter(o, handler)),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		BaseContext:       func(net.Listener) context.Context { return runCtx },
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	bound := ln.Addr().String()
	if o.Flavor == FlavorVLLM {
		log.Info("Starting vLLM API server on http://"+bound, "version", o.Version)
	} else {
		log.Info("Listening on "+bound, "version", o.Version, "models", o.Models)
	}
	if o.Ready != nil {
		o.Ready(bound)
	}

	select {
	case <-ctx.Done():
	case err := <-serveErr:
		return fmt.Errorf("simulated %s: serve on %s: %w", o.Flavor, bound, err)
	}
	if o.StopDelay > 0 {
		log.Info("stopping slowly", "stop_delay", o.StopDelay)
		time.Sleep(o.StopDelay)
	}
	log.Info("shutting down")
	cancel()
	sctx, scancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer scancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
		log.Warn("forced shutdown", "err", err)
	}
	if err := <-serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("simulated %s: serve on %s: %w", o.Flavor, bound, err)
	}
	return nil
}
