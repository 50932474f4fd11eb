// Package benchapi is the daemon's bench service: it runs benchmarks of
// the active profile one at a time (Service.Start) and serves the routes
// under /api/bench with echo (Service.Register). The bodies of those
// routes (StartRequest, RunStatus, ListResponse, Summary, UploadResponse)
// are gpuhost/bench's, so that their readers (the command line, the panel,
// the MCP inference connector) do not link this package or echo.
//
// Wiring (internal/assemble):
//
//	svc := benchapi.NewService(benchapi.ServiceOptions{Store: bench.NewStore(cfg.StateDir, log), Daemon: …,
//		GPU: sup.Snapshot, Publish: …, GpuhostVersion: version, GpuhostCommit: commit, Log: log})
//	svc.Register(e) // POST/GET /api/bench, GET /api/bench/:id, GET /api/bench/chart.svg, POST /api/bench/results
//	defer svc.Close()
package benchapi
