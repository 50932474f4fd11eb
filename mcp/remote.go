package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	mcpclient "github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	mcpgo "github.com/mark3labs/mcp-go/mcp"
)

// Remote is a running daemon whose MCP endpoint (MountPath) `gpuhost mcp
// tools` lists, instead of building the tools in this process.
type Remote struct {
	BaseURL string // e.g. http://127.0.0.1:8080
	Token   string // bearer token ("" on loopback)
	// Origin says how BaseURL was chosen; errors name it.
	Origin string
}

// ListRemoteTools lists the tools the daemon at r serves over MCP's
// streamable HTTP transport.
func ListRemoteTools(ctx context.Context, r Remote, version string) ([]mcpgo.Tool, error) {
	endpoint := strings.TrimSuffix(r.BaseURL, "/") + MountPath
	where := endpoint
	if r.Origin != "" {
		where += " (" + r.Origin + ")"
	}
	opts := []transport.StreamableHTTPCOption{transport.WithHTTPTimeout(30 * time.Second)}
	if r.Token != "" {
		opts = append(opts, transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + r.Token}))
	}
	c, err := mcpclient.NewStreamableHttpClient(endpoint, opts...)
	if err != nil {
		return nil, fmt.Errorf("mcp client for %s: %w", where, err)
	}
	defer c.Close()
	if err := c.Start(ctx); err != nil {
		return nil, fmt.Errorf("connect to the daemon's MCP at %s: %w", where, err)
	}
	init := mcpgo.InitializeRequest{}
	init.Params.ProtocolVersion = mcpgo.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcpgo.Implementation{Name: "gpuhost mcp tools", Version: version}
	if _, err := c.Initialize(ctx, init); err != nil {
		return nil, fmt.Errorf("initialize MCP at %s (is a gpuhost daemon running there? `gpuhost mcp tools --demo` lists the demo's tools without one): %w", where, err)
	}
	res, err := c.ListTools(ctx, mcpgo.ListToolsRequest{})
	if err != nil {
		return nil, fmt.Errorf("list tools at %s: %w", where, err)
	}
	return res.Tools, nil
}

// printRemoteTools prints tools like printTools does for local ones.
func printRemoteTools(w io.Writer, tools []mcpgo.Tool, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Tools []mcpgo.Tool `json:"tools"`
		}{tools})
	}
	for _, t := range tools {
		desc, _, _ := strings.Cut(t.Description, "\n")
		schema, err := inputSchema(t)
		if err != nil {
			return fmt.Errorf("tool %s: %w", t.Name, err)
		}
		b, _ := json.Marshal(schema)
		fmt.Fprintf(w, "%s\n  %s\n  schema: %s\n", t.Name, desc, b)
	}
	if len(tools) == 0 {
		fmt.Fprintln(w, "the daemon serves no MCP tools (add sections under mcp.connectors)")
	}
	return nil
}
