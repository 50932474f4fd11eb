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
// vLLM sleep mode (sleepmode.go), for standby switching: with
// VLLM_SERVER_DEV_MODE=1 in the environment the development routes are
// mounted (without it they answer 404 {"detail":"Not Found"}): POST
// /sleep?level=1|2 (default 1; 200, empty body, once asleep), POST
// /wake_up with repeated ?tags=weights / ?tags=kv_cache (none: all; 200,
// empty), GET /is_sleeping ({"is_sleeping": bool}), POST /collective_rpc
// {"method":"reload_weights"} ({"results":[null]}, one worker) and POST
// /reset_prefix_cache (200). Sleeping needs --enable-sleep-mode among the
// serve words. The claimed VRAM is a residual (--sleep-residual-mib, default
// 512, at most the claim), the weights (--weights-mib, default three
// quarters of the claim less the residual) and the KV cache (the rest, a
// quarter by default, as /metrics' cache blocks assume). Level 1 copies the
// weights to host memory at --h2d-gbps (default 25, PCIe 4.0 x16) and
// discards the KV cache; level 2 discards both at once. Asleep, the claim is
// the residual, and at level 1 it also holds the weights as host memory
// (nvml.Claim.HostMiB, counted by nvml.Sim.HostMemAvailableMiB). wake_up maps
// weights, then KV cache, raising the claim part by part; after level 1 the
// weights are copied back at --h2d-gbps (the host memory goes when that is
// done), after level 2 they are garbage until reload_weights reads them at
// --reload-gbps (default 3). Mapping is instant; only the copies and the
// reload take time. Chat, completions and transcriptions answer 503
// {"error":{"type":"ModelSleepingError",…}} while asleep (and during the
// level 1 offload), and 500 "…not reloaded…" while the weights are garbage;
// /health, /v1/models, /tokenize and /metrics keep answering. Putting the
// engine to sleep aborts its running requests (finish_reason "abort").
// /metrics has the gauge vllm:engine_sleep_state with sleep_state "awake",
// "weights_offloaded" and "discard_all".
//
// Sleep mode, sources and choices. Nothing here was run against a real vLLM:
// every sleep behaviour is verified only against this simulator and vLLM's
// documentation (docs/features/sleep_mode.md) and source (the serve sleep
// api_router, collective_rpc, v1/executor/abstract.py, v1/worker/gpu_worker.py,
// v1/engine/async_llm.py, v1/metrics/loggers.py, tests/entrypoints sleep
// tests). Taken from them: the routes and their env gate, answers and query
// parameters; the levels; the documented level 2 sequence; is_sleeping
// staying true until every tag is awake; sleeping again, waking an awake
// engine or a tag that is not asleep (or unknown) being a logged no-op;
// /health answering 200 while asleep (it only checks that the engine is not
// dead); the gauge's name and labels, and that AsyncLLM sets it asleep at
// the requested level on every /sleep and awake on every /wake_up, even a
// no-op or partial one (so it can disagree with /is_sleeping). The
// simulator's own choices, where vLLM differs or was not confirmed:
//   - /sleep without --enable-sleep-mode answers 500 {"error":{"message":
//     "Sleep mode is not enabled in the model config…","type":
//     "InternalServerError","code":500}}. vLLM V0 asserted this; V1's
//     source has no check: it answers 200, is_sleeping turns true and no
//     memory is freed. Check the VRAM, not the 200.
//   - The 503 ModelSleepingError shape is from one version of vLLM's docs;
//     vLLM's serving code was not found to refuse: 0.11 schedules such
//     requests onto released memory (an illegal memory access),
//     newer versions pause scheduling so they wait for wake_up.
//   - Garbage weights answer 500; real vLLM answers 200 with garbage text.
//   - Aborting running requests is newer vLLM's default (mode=abort); 0.11
//     does not guard them.
//   - reload_weights while the weights are not mapped answers 500 (vLLM
//     would fail in CUDA); other collective_rpc methods answer 500; levels
//     other than 1 and 2 answer 400 (vLLM: non-numbers 500, level 0 pauses
//     scheduling only in newer versions).
//   - The memory split, the residual, the copy and reload rates and the
//     level 1 offload taking weights / --h2d-gbps are a model, not
//     measurements; is_sleeping is false during that offload, as the
//     executor sets it after the copy.
//
// Ollama flavour: GET / and HEAD /, /api/version, /api/tags, /api/ps,
// /v1/models, /v1/models/{model}; POST /api/generate, /api/chat (NDJSON
// streams by default, timings in ns, num_predict, num_ctx, keep_alive, empty
// prompt loads, keep_alive 0 with an empty prompt unloads), /api/show,
// /v1/chat/completions, /v1/completions. One model is resident at a time.
// Standby, as Ollama's routes.go does it: an empty /api/generate (no prompt)
// or /api/chat (no messages) with keep_alive 0, "0" or "0s" unloads the model
// (even one not loaded) and answers model, created_at, "response": "",
// "done": true and "done_reason": "unload" (chat: a "message" with role
// assistant and empty content instead of "response"); /api/ps is then empty and the
// process holds no simulated VRAM (its claim is removed: an idle `ollama
// serve` holds none). An empty request with any other keep_alive, or any
// generation, loads it again: the claim is written when the load begins,
// the load takes --load-time, then /api/ps lists it with size_vram.
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
