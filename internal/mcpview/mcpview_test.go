package mcpview_test

import (
	"gpuhost/internal/mcpview"
	"gpuhost/mcp/connectors/gpu"
	"gpuhost/mcp/connectors/inference"
)

// The connector contract hands the daemon over untyped and each connector
// asserts its own interface at Build, so a method renamed on one side
// would only show as a disabled connector at start. These make it a
// compile error instead (go vet and go test build this file).
var (
	_ gpu.Daemon       = (*mcpview.Daemon)(nil)
	_ inference.Daemon = (*mcpview.Daemon)(nil)
)
