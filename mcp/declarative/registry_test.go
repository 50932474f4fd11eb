package declarative

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"gpuhost/mcp"
	"gpuhost/mcp/connector"
)

// TestThroughRegistry loads the shipped example the way the daemon does
// (Load, then mcp.NewServer with Extra) and calls it through mcp-go's
// in-process client: the registry accepts the tools under its policy, its
// schema validation uses the enums and date patterns built here, and
// nothing carries the token the fake echoes.
func TestThroughRegistry(t *testing.T) {
	fake := &fakeAttendance{token: canary}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	c := loadExample(t, srv.URL)
	s, err := mcp.NewServer(mcp.ServerOptions{
		Secrets: connector.NewSecrets(func(k string) (string, bool) {
			return canary, k == "ATTENDANCE_TOKEN"
		}),
		Extra:     []connector.Named{{Name: c.Name(), Connector: c}},
		Factories: map[string]connector.Factory{},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Disabled()) > 0 {
		t.Fatalf("registry refused the example: %v", s.Disabled())
	}
	cl, err := s.InProcessClient(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		tool    string
		args    map[string]any
		isError bool
		want    string
	}{
		{"attendance_present_today", map[string]any{"department": "paint"}, false, `"Cem Öz"`},
		{"attendance_absences", map[string]any{"from": "2026-11-30", "to": "2026-12-06"}, false, `"Bo Lind"`},
		{"attendance_absences", map[string]any{"from": "2026-12-06", "to": "2026-11-30"}, true, "400 Bad Request"},
		{"attendance_absences", map[string]any{"from": "30.11.2026", "to": "2026-12-06"}, true, "from"},
		{"attendance_absences", map[string]any{"from": "2026-11-30", "to": "2026-12-06", "url": "http://x"}, true, "url"},
		{"attendance_present_today", map[string]any{"department": "hr"}, true, "department"},
	}
	for _, tc := range tests {
		req := mcpgo.CallToolRequest{}
		req.Params.Name = tc.tool
		req.Params.Arguments = tc.args
		res, err := cl.CallTool(context.Background(), req)
		if err != nil {
			t.Fatalf("%s %v: protocol error %v", tc.tool, tc.args, err)
		}
		var text strings.Builder
		for _, c := range res.Content {
			if tx, ok := c.(mcpgo.TextContent); ok {
				text.WriteString(tx.Text)
			}
		}
		if res.IsError != tc.isError || !strings.Contains(text.String(), tc.want) || strings.Contains(text.String(), "canary") {
			t.Errorf("%s %v: isError=%v %s; want isError=%v containing %q and no token", tc.tool, tc.args, res.IsError, text.String(), tc.isError, tc.want)
		}
	}
}
