// Package gpu is the MCP connector for the box's GPU: gpu_status (driver,
// CUDA, memory, utilisation, temperature, power, clocks, bandwidth) and
// gpu_processes (who holds VRAM). It reads through the running appliance
// (its Daemon interface: the appliance's own NVML handle or simulator), so
// the MCP server never opens a second NVML session; outside the daemon
// (env.Daemon nil) Build fails with ErrNoDaemon and the registry disables
// the connector with that reason.
//
// Enable it with an empty section in gpuhost.yaml (it has no settings):
//
//	mcp:
//	  connectors:
//	    gpu: {}
package gpu
