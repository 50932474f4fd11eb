// Package bench measures an inference endpoint the way an operator needs to
// trust the numbers: prefill (prompt processing) and decode (generation)
// speed, and a serving sweep under concurrency, against any
// OpenAI-compatible server — the daemon's managed /v1, a plain vLLM or an
// Ollama (told apart by /version and /api/version).
//
// Method (see Result for the exact definitions and the stored schema):
//
//   - every request streams with stream_options.include_usage, and every
//     token count is the server's own (usage, eval_count), never a
//     re-tokenisation on the client;
//   - prefill prompts have exact token lengths, sized with the server's
//     /tokenize where it exists (vLLM) or from usage.prompt_tokens
//     feedback, each with a fresh random prefix so no prefix cache helps;
//     prefill tok/s = prompt tokens / TTFT with max_tokens 1;
//   - decode lengths are forced on vLLM (ignore_eos + min_tokens) and
//     checked: a server that produces fewer tokens is a recorded error,
//     never a silent number; on Ollama num_predict (native /api/generate)
//     only caps them, so a request counts when it produced at least
//     Options.DecodeMinTokens and its rate is over the tokens it produced;
//     decode tok/s = (out − 1) / (t_last − t_first);
//   - the serving sweep reports TTFT, TPOT, ITL and E2E (mean, p50, p90,
//     p99), output tok/s and req/s per concurrency, as vLLM's bench serve;
//   - each figure is repeated (default 5) after an unmeasured warm-up and
//     kept as samples, so Compare can test each change (Welch's t-test
//     against a minimum effect, Holm's correction over the metrics) and
//     give its confidence interval;
//   - cross-checks put the client's figures next to the server's own
//     (Ollama eval_count/eval_duration, and with ServingNative each serving
//     request's total/eval durations; vLLM /metrics token counters and
//     TTFT histogram), and the roofline next to the bandwidth ceiling.
//
// RunSwitch (`gpuhost bench switch A B`) measures switching between two
// profiles of the running daemon instead: the time to the first token
// after a switch asked for by POST /api/switch, and after a /v1 request
// that auto-switches, per direction and mode (cold, or standby when the
// switch woke the target), read from the switch's events (see
// SwitchBench).
//
// Results are one JSON file per run under <state_dir>/bench (Store); a
// corrupt file is skipped with a warning naming it.
//
// This package is the measurement core: runs, results, the store, compare
// and the reports, with no command line or HTTP server, so that a reader of
// results (the panel, the MCP inference connector) links neither. The
// command `gpuhost bench …` is gpuhost/bench/benchcmd; the daemon's
// service behind /api/bench is gpuhost/bench/benchapi. Wiring (package
// main):
//
//	root.AddCommand(benchcmd.NewCmd(benchcmd.Deps{GpuhostVersion: version, GpuhostCommit: commit, Env: …}))
//
//	svc := benchapi.NewService(benchapi.ServiceOptions{Store: bench.NewStore(cfg.StateDir, log), Daemon: …,
//		GPU: sup.Snapshot, Publish: …, GpuhostVersion: version, GpuhostCommit: commit, Log: log})
//	svc.Register(e) // POST/GET /api/bench, GET /api/bench/:id, GET /api/bench/chart.svg
//	defer svc.Close()
package bench
