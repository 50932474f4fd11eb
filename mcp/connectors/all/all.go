// Package all links every compiled connector into the binary: importing
// it runs each connector's init, which registers it with connector.Register.
// Adding a connector is a new folder under mcp/connectors/ plus one line
// here; the server itself does not change.
package all

import (
	_ "gpuhost/mcp/connectors/calc"
	_ "gpuhost/mcp/connectors/crm"
	_ "gpuhost/mcp/connectors/gpu"
	_ "gpuhost/mcp/connectors/inference"
	_ "gpuhost/mcp/connectors/nas"
	_ "gpuhost/mcp/connectors/shelly"
	_ "gpuhost/mcp/connectors/weather"
)
