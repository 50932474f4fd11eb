package all_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"gpuhost/appliance/appliancetest"
	"gpuhost/bench"
	"gpuhost/config"
	"gpuhost/frontdoor/httpapi"
	"gpuhost/internal/mcpview"
	"gpuhost/mcp"
)

// TestDaemonEndToEnd runs the demo connectors against a real Supervisor
// (simulated GPU, simulator backend processes) through mcpview.Daemon,
// over streamable HTTP mounted on the daemon's own API with its bearer
// check (listening on all interfaces).
func TestDaemonEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts simulator processes")
	}
	const token = "e2e-token-51c0-0123456789abcdef"
	t.Setenv("GPUHOST_MCP_E2E_TOKEN", token)
	f := appliancetest.New(t, appliancetest.Options{Activate: "coder", Hook: func(c *config.Config) {
		c.Listen = "0.0.0.0:0"
		c.APITokenEnv = "GPUHOST_MCP_E2E_TOKEN"
	}})
	d := &mcpview.Daemon{Sup: f.Sup, DoctorFn: f.Doctor, Bench: bench.NewStore(t.TempDir(), nil)}
	cfg := mcp.DemoConfig()
	delete(cfg, "weather") // no internet in tests
	s, err := mcp.NewServer(mcp.ServerOptions{Config: cfg, Daemon: d})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Disabled()) > 0 {
		t.Fatalf("disabled: %v", s.Disabled())
	}
	e, err := httpapi.New(f.Sup, f.Doctor, f.Log)
	if err != nil {
		t.Fatal(err)
	}
	s.Register(e)
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.NewStreamableHttpClient(srv.URL+mcp.MountPath,
		transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + token}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	init := mcpgo.InitializeRequest{}
	init.Params.ProtocolVersion = mcpgo.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcpgo.Implementation{Name: "e2e", Version: "1"}
	if _, err := c.Initialize(ctx, init); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"gpu_status", map[string]any{}, "MiB"},
		{"inference_status", map[string]any{}, "coder"},
		{"inference_profiles", map[string]any{}, "qwen3-coder"},
		{"calc_evaluate", map[string]any{"expression": "2^10 - 24"}, "1000"},
	} {
		req := mcpgo.CallToolRequest{}
		req.Params.Name = tc.tool
		req.Params.Arguments = tc.args
		res, err := c.CallTool(ctx, req)
		if err != nil {
			t.Fatalf("%s: %v", tc.tool, err)
		}
		b, _ := json.Marshal(res.Content)
		if res.IsError || !strings.Contains(strings.ToLower(string(b)), strings.ToLower(tc.want)) {
			t.Errorf("%s: isError=%v, want %q in %s", tc.tool, res.IsError, tc.want, b)
		}
	}
}
