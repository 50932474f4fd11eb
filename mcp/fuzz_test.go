package mcp_test

import (
	"context"
	"encoding/json"
	"testing"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
)

// FuzzToolCall feeds arbitrary JSON-RPC messages (the outside input of
// every transport) to a server with the behaviour tools: nothing may
// panic, and a tools/call of a known tool always answers with a result
// (isError for bad arguments), never a protocol error.
func FuzzToolCall(f *testing.F) {
	seeds := []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t_status","arguments":{"device":"kitchen"}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t_status","arguments":{"device":["kitchen"]}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t_sum","arguments":{"a":1e308,"b":1e308}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t_sum","arguments":null}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t_fail"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":"x"}`,
		`not json`,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	s := behaviourServer(f, nil)
	f.Fuzz(func(t *testing.T, msg []byte) {
		resp := s.MCPServer().HandleMessage(context.Background(), msg)
		var req struct {
			Method string `json:"method"`
			Params struct {
				Name      string         `json:"name"`
				Arguments map[string]any `json:"arguments"`
			} `json:"params"`
		}
		if json.Unmarshal(msg, &req) != nil || req.Method != "tools/call" || (req.Params.Name != "t_status" && req.Params.Name != "t_sum") {
			return
		}
		b, _ := json.Marshal(resp)
		var out struct {
			Error  *json.RawMessage      `json:"error"`
			Result *mcpgo.CallToolResult `json:"result"`
		}
		if json.Unmarshal(b, &out) == nil && out.Error != nil && json.Valid(msg) && string(*out.Error) != "null" {
			// A well-formed call of a known tool must not be a protocol error.
			var full map[string]any
			if json.Unmarshal(msg, &full) == nil && full["jsonrpc"] == "2.0" && full["id"] != nil {
				if p, ok := full["params"].(map[string]any); ok {
					if _, isObj := p["arguments"].(map[string]any); isObj {
						t.Fatalf("protocol error for %s: %s", msg, b)
					}
				}
			}
		}
	})
}
