package mcp_test

import (
	"context"
	"net/http/httptest"
	"sort"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/mark3labs/mcp-go/client"
	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"gopkg.in/yaml.v3"

	"gpuhost/mcp"
	"gpuhost/mcp/connector"
)

func trivialServer(b *testing.B) *mcp.Server {
	b.Helper()
	return newServer(b, mcp.ServerOptions{
		Config:    map[string]yaml.Node{"t": section()},
		Factories: map[string]connector.Factory{"t": factory(tools(deviceTool("t_status")))},
	})
}

// benchCalls calls t_status b.N times and reports the p50 and p99 latency
// next to ns/op (the mean).
func benchCalls(b *testing.B, c *client.Client) {
	req := mcpgo.CallToolRequest{}
	req.Params.Name = "t_status"
	req.Params.Arguments = map[string]any{"device": "kitchen"}
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		res, err := c.CallTool(ctx, req)
		lat = append(lat, time.Since(t0))
		if err != nil || res.IsError {
			b.Fatalf("call: %v %v", err, res)
		}
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e6, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e6, "p99-ms")
}

// BenchmarkToolCallInProcess: target p50 ≤ 0.2 ms.
func BenchmarkToolCallInProcess(b *testing.B) {
	s := trivialServer(b)
	benchCalls(b, inproc(b, s))
}

// BenchmarkToolCallHTTP: streamable HTTP on loopback through echo, as the
// daemon mounts it; target p50 ≤ 2 ms.
func BenchmarkToolCallHTTP(b *testing.B) {
	s := trivialServer(b)
	e := echo.New()
	s.Register(e)
	srv := httptest.NewServer(e)
	b.Cleanup(srv.Close)
	c, err := httpClient(b, srv.URL, nil)
	if err != nil {
		b.Fatal(err)
	}
	benchCalls(b, c)
}
