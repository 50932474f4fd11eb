package crm

import (
	"context"
	"strings"
	"testing"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"gopkg.in/yaml.v3"

	"gpuhost/mcp"
	"gpuhost/mcp/connector"
)

// roundTrip serves the crm connector through gpuhost's MCP server (the
// registry's policy checks, schema validation and scrubbing) and calls it
// with mcp-go's in-process client, as a model would.
func roundTrip(t *testing.T, db *testDB) {
	var section yaml.Node
	if err := yaml.Unmarshal([]byte("dsn_env: "+dsnVar+"\nmax_rows: 3\n"), &section); err != nil {
		t.Fatal(err)
	}
	environ := map[string]string{dsnVar: db.roDSN}
	srv, err := mcp.NewServer(mcp.ServerOptions{
		Config:    map[string]yaml.Node{"crm": *section.Content[0]},
		Factories: map[string]connector.Factory{"crm": func() connector.Connector { return &builder{} }},
		Secrets: connector.NewSecrets(func(k string) (string, bool) {
			v, ok := environ[k]
			return v, ok
		}),
	})
	if err != nil {
		t.Fatalf("NewServer: %v", err)
	}
	if d := srv.Disabled(); len(d) != 0 {
		t.Fatalf("crm disabled by the registry: %v", d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := srv.InProcessClient(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	callTool := func(name string, args map[string]any) (*mcpgo.CallToolResult, string) {
		req := mcpgo.CallToolRequest{}
		req.Params.Name = name
		req.Params.Arguments = args
		res, err := c.CallTool(ctx, req)
		if err != nil {
			t.Fatalf("%s: protocol error %v (tool failures must be isError results)", name, err)
		}
		var text strings.Builder
		for _, ct := range res.Content {
			if tc, ok := ct.(mcpgo.TextContent); ok {
				text.WriteString(tc.Text)
			}
		}
		if strings.Contains(text.String(), roPassword) {
			t.Fatalf("%s: result text contains the DSN password", name)
		}
		return res, text.String()
	}

	tests := []struct {
		name, tool string
		args       map[string]any
		isError    bool
		want       string
	}{
		{"rows", "crm_search_users", map[string]any{"query": "acme"}, false, `"Carol O'Brien"`},
		{"injection is data", "crm_search_users", map[string]any{"query": "'; DROP TABLE users; --"}, false, `"row_count": 0`},
		{"row cap", "crm_search_users", map[string]any{"query": "Bulk"}, false, `"truncated": true`},
		{"exact numeric", "crm_search_invoices", map[string]any{"status": "paid"}, false, `"amount": 1200.50`},
		{"wrong type", "crm_search_invoices", map[string]any{"customer_id": "one"}, true, "customer_id"},
		{"missing required", "crm_customer_history", map[string]any{}, true, "user_id"},
		{"too long", "crm_search_users", map[string]any{"query": strings.Repeat("a", MaxStringLen+1)}, true, "query"},
		{"smuggled sql", "crm_search_users", map[string]any{"query": "a", "sql": "DELETE FROM users"}, true, "sql"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, text := callTool(tc.tool, tc.args)
			if res.IsError != tc.isError || !strings.Contains(text, tc.want) {
				t.Fatalf("isError=%v text=%s\nwant isError=%v containing %q", res.IsError, text, tc.isError, tc.want)
			}
		})
	}

	environ[dsnVar] = strings.Replace(db.roDSN, roPassword, roPassword+"-wrong", 1)
	res, text := callTool("crm_search_users", map[string]any{"query": "a"})
	if !res.IsError || !strings.Contains(text, "refused the login") {
		t.Fatalf("wrong password: isError=%v text=%s", res.IsError, text)
	}
	delete(environ, dsnVar)
	res, text = callTool("crm_search_users", map[string]any{"query": "a"})
	if !res.IsError || !strings.Contains(text, dsnVar) {
		t.Fatalf("missing DSN: isError=%v text=%s", res.IsError, text)
	}
	if n := db.count(t, "users"); n != 254 {
		t.Fatalf("users = %d, want 254", n)
	}
}
