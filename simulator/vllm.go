package simulator

import (
	"net/http"
	"strconv"
)

// vllmHandler routes the endpoints of vLLM's OpenAI-compatible server.
func (s *server) vllmHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /version", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"version": s.opts.Version})
	})
	mux.HandleFunc("GET /v1/models", s.handleOpenAIModels)
	mux.HandleFunc("POST /v1/chat/completions", s.handleChatCompletions)
	mux.HandleFunc("POST /v1/completions", s.handleCompletions)
	mux.HandleFunc("POST /v1/messages", s.handleMessages)
	mux.HandleFunc("POST /v1/messages/count_tokens", s.handleCountTokens)
	mux.HandleFunc("POST /v1/responses", s.handleResponses)
	mux.HandleFunc("POST /tokenize", s.handleTokenize)
	mux.HandleFunc("POST /v1/audio/transcriptions", s.handleTranscription)
	mux.HandleFunc("GET /metrics", s.handleVLLMMetrics)
	if s.opts.DevMode {
		s.vllmSleepRoutes(mux)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		// FastAPI's answer for an unknown route.
		writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
	})
	return mux
}

// handleTokenize serves POST /tokenize with either {"prompt"} or
// {"messages"}; the count is the one usage.prompt_tokens reports.
func (s *server) handleTokenize(w http.ResponseWriter, r *http.Request) {
	body, e := readBody(w, r)
	if e != nil {
		writeOpenAIError(w, s.opts.Flavor, e)
		return
	}
	toks, strs, e := s.tokenizeBody(body)
	if e != nil {
		writeOpenAIError(w, s.opts.Flavor, e)
		return
	}
	resp := map[string]any{"count": len(toks), "max_model_len": s.opts.MaxModelLen, "tokens": tokenIDs(toks), "token_strs": nil}
	if strs {
		resp["token_strs"] = toks
	}
	writeJSON(w, http.StatusOK, resp)
}

// tokenizeBody decodes a /tokenize body and tokenizes it exactly as the chat
// and completion endpoints would.
func (s *server) tokenizeBody(body []byte) (toks []string, strs bool, e *apiError) {
	var req oaiChatRequest
	if e := decodeJSON(body, &req); e != nil {
		return nil, false, e
	}
	if _, _, e := s.resolveModel(req.Model); e != nil {
		return nil, false, e
	}
	if req.Prompt != nil {
		return tokenize(*req.Prompt), req.ReturnTokenStrs, nil
	}
	if req.Messages != nil {
		msgs, e := chatMessages(req.Messages)
		if e != nil {
			return nil, false, e
		}
		addGen := req.AddGenerationPrompt == nil || *req.AddGenerationPrompt
		return tokenize(renderChat(msgs, compactTools(req.Tools), addGen)), req.ReturnTokenStrs, nil
	}
	return nil, false, badRequest("either prompt or messages is required")
}

// handleVLLMMetrics serves the Prometheus exposition with vLLM's names.
func (s *server) handleVLLMMetrics(w http.ResponseWriter, _ *http.Request) {
	gmu := s.opts.GPUMemoryUtilization
	if gmu == 0 {
		gmu = defaultGPUMemoryUtilization
	}
	cacheDType := s.opts.KVCacheDType
	if cacheDType == "" {
		cacheDType = "auto"
	}
	v := metricsView{
		sleep:      s.engine,
		modelName:  s.opts.ServedName,
		running:    s.slots.running.Load(),
		waiting:    s.slots.waiting.Load(),
		kvCapacity: s.kvCapacity,
		cacheLabels: [][2]string{
			{"block_size", strconv.Itoa(kvBlockSize)},
			{"cache_dtype", cacheDType},
			{"calculate_kv_scales", "False"},
			{"cpu_offload_gb", "0"},
			{"enable_prefix_caching", "True"},
			{"engine", "0"},
			{"gpu_memory_utilization", strconv.FormatFloat(gmu, 'f', -1, 64)},
			{"is_attention_free", "False"},
			{"num_cpu_blocks", "None"},
			{"num_gpu_blocks", strconv.FormatInt(s.kvCapacity/kvBlockSize, 10)},
			{"num_gpu_blocks_override", "None"},
			{"prefix_caching_hash_algo", "sha256"},
			{"sliding_window", "None"},
			{"swap_space", "4"},
			{"swap_space_bytes", "4294967296"},
		},
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	if err := s.metrics.write(w, v); err != nil {
		s.log.Debug("write metrics", "err", err)
	}
}
