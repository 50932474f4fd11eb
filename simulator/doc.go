// Package simulator is a stand-in for the inference servers gpuhost
// supervises (vLLM and Ollama). It speaks enough of their real HTTP APIs for
// real clients (OpenAI SDKs, the Ollama client libraries, gpuhost's own proxy,
// bench and health checks) and behaves like them where gpuhost cares: vLLM is
// only reachable once its "engine" is loaded, tokens are paced at a
// configurable prefill and decode rate, requests beyond the concurrency limit
// queue, and simulated GPU memory is claimed (see gpuhost/nvml claims) while a
// model is loaded, so the simulated GPU's used memory follows what really
// runs. The demo and the tests run it as the ExecStart of the backend systemd
// units (`gpuhost simulate vllm|ollama …`), so switching models exercises the
// same unit control, VRAM-release waits and readiness polling as a real box.
//
// vLLM flavour: GET /health, /version, /v1/models, /metrics (Prometheus text,
// vllm: names); POST /v1/chat/completions, /v1/completions (streamed as SSE
// or whole; max_tokens, max_completion_tokens, min_tokens, ignore_eos,
// stream_options.include_usage and continuous_usage_stats, tools with
// tool_choice none/auto/required/named), /tokenize. Errors use vLLM's
// {"error":{"message","type","param","code"}} shape with vLLM's messages.
//
// Ollama flavour: GET / and HEAD /, /api/version, /api/tags, /api/ps,
// /v1/models, /v1/models/{model}; POST /api/generate, /api/chat (NDJSON
// streams by default, timings in ns, num_predict, num_ctx, keep_alive, empty
// prompt loads, keep_alive 0 with an empty prompt unloads), /api/show,
// /v1/chat/completions, /v1/completions. One model is resident at a time.
//
// Text and tokens: the reply is a fixed, deterministic word sequence; a
// reply stops at Options.NaturalTokens ("EOS") unless capped or ignore_eos.
// The tokenizer (tokens.go) is simple but within a small factor of a real BPE
// one, and one function serves /tokenize and every usage count, so they agree.
//
// Pacing: a request's time to first token is the model load time (Ollama
// only, when the model is not loaded) plus prompt tokens / PrefillTPS; after
// that each sequence emits one token every 1/DecodeTPS, with timers, never
// busy-waiting. Concurrent sequences do not slow each other down (decode is
// memory-bandwidth bound and a small batch costs about as much per step as one
// sequence); instead at most MaxNumSeqs run at once and the rest wait, counted
// in vllm:num_requests_waiting. A client that disconnects cancels its
// generation.
package simulator
