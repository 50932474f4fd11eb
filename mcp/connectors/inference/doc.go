// Package inference is the MCP connector for the box's inference backends,
// read through the running daemon (its Daemon interface): inference_status (phase, active profile, a live
// probe of its health endpoint on 127.0.0.1, unit states, every GPU with the
// profiles served on it, last switch, and on a box of several GPU sets each
// lane with its GPUs, phase, profile and endpoint health),
// inference_profiles, inference_doctor (optionally one profile, an enum of
// the configured names) and inference_bench_latest. No tool switches or
// stops anything: the model may look, an operator acts.
//
// Config section in gpuhost.yaml (all keys optional):
//
//	mcp:
//	  connectors:
//	    inference:
//	      health_timeout: 2s   # bound on the backend health probe
package inference
