// Package assemble is the one place that builds the daemon from its
// parts: the GPU opener, the unit runner, the Supervisor and the doctor
// (OpenCore), the front doors and services on them (Serve), the MCP
// server (for /mcp, `gpuhost mcp` and a triage worker's CRM lookup) and
// the triage worker (for serve and the `gpuhost triage` commands).
// Commands that need one of these parts get it from here, so the
// daemon, the demo and the commands that read the box locally cannot
// drift apart; TestOneWiringPlace keeps each construction here.
package assemble
