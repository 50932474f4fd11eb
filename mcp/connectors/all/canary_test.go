package all_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"gopkg.in/yaml.v3"

	"gpuhost/internal/testkit"
	"gpuhost/mcp"
	"gpuhost/mcp/connector"
)

const canary = "CANARY-9c1f/+=&-all"

// TestCanaryAllConnectors configures every connector that takes a secret
// with the canary and points it at a hostile fake that echoes the whole
// request (headers, query, form body) back in its answers: as JSON, as an
// HTML error page with status 500, and inside DSM/Shelly-shaped error
// bodies. Every tool is called on every target; the canary must not
// appear in any result or log line, in any encoding.
func TestCanaryAllConnectors(t *testing.T) {
	var (
		mu      sync.Mutex
		counter = map[string]int{} // per path, so answers vary between calls
		sawKey  bool               // the canary reached the fake: the test is live
	)
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dump, _ := httputil.DumpRequest(r, true)
		_ = r.ParseForm()
		echo := string(dump) + "\nform: " + r.Form.Encode()
		mu.Lock()
		counter[r.URL.Path]++
		k := counter[r.URL.Path]
		if strings.Contains(echo, canary) || strings.Contains(echo, url.QueryEscape(canary)) {
			sawKey = true
		}
		mu.Unlock()
		switch k % 3 {
		case 0:
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprintf(w, "<html><body><pre>%s</pre></body></html>", echo)
		case 1:
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]any{
				"success": false, "isok": false,
				"error":  map[string]any{"code": 400, "message": echo},
				"errors": []string{echo},
				"echo":   base64.StdEncoding.EncodeToString([]byte(echo)),
			})
		default:
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]any{
				"success": true, "isok": true,
				"data": map[string]any{"sid": echo, "shares": []any{map[string]any{"name": echo}}, "device_status": map[string]any{"echo": echo}},
			})
		}
	}))
	t.Cleanup(fake.Close)
	t.Setenv("SHELLY_TEST_KEY", canary)
	t.Setenv("NAS_TEST_PASSWORD", canary)
	t.Setenv("CRM_TEST_DSN", "postgres://ro:"+url.QueryEscape(canary)+"@127.0.0.1:1/crm?connect_timeout=2")

	sections := map[string]string{
		"shelly": fmt.Sprintf(`
timeout: 3s
devices:
  - {name: desk-plug, mode: cloud, id: a8032abe41fc, server: %q, auth_key_env: SHELLY_TEST_KEY}
  - {name: rack-plug, mode: local, address: %q}
`, fake.URL, fake.URL),
		"nas": fmt.Sprintf(`
timeout: 3s
nas:
  - {name: backup-nas, url: %q, user: ro, password_env: NAS_TEST_PASSWORD}
`, fake.URL),
		"crm": `{dsn_env: CRM_TEST_DSN}`,
	}
	cfg := map[string]yaml.Node{}
	for name, src := range sections {
		if !contains(connector.Registered(), name) {
			continue
		}
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
			t.Fatal(err)
		}
		cfg[name] = *doc.Content[0]
	}
	var logs testkit.SyncBuffer
	s, err := mcp.NewServer(mcp.ServerOptions{
		Config: cfg, Daemon: daemon{}, CallTimeout: 10 * time.Second,
		Log: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	if d := s.Disabled(); len(d) > 0 {
		t.Fatalf("disabled: %v", d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := s.InProcessClient(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	needles := []string{canary, url.QueryEscape(canary), url.PathEscape(canary),
		base64.StdEncoding.EncodeToString([]byte(canary)), "9c1f"}
	calls := 0
	for _, ti := range s.Tools() {
		argSets := []map[string]any{argsFor(t, ti.Tool.Def, "")}
		if tg := ti.Tool.Targets; tg != nil {
			argSets = nil
			for _, v := range tg.Values {
				argSets = append(argSets, argsFor(t, ti.Tool.Def, v))
				argSets[len(argSets)-1][tg.Param] = v
			}
		}
		for _, args := range argSets {
			for round := 0; round < 3; round++ { // the fake cycles its answers
				req := mcpgo.CallToolRequest{}
				req.Params.Name = ti.Tool.Def.Name
				req.Params.Arguments = args
				res, err := c.CallTool(ctx, req)
				if err != nil {
					t.Fatalf("%s: protocol error %v", ti.Tool.Def.Name, err)
				}
				calls++
				b, _ := json.Marshal(res)
				for _, n := range needles {
					if strings.Contains(string(b), n) {
						t.Errorf("%s %v: result contains canary form %q: %s", ti.Tool.Def.Name, args, n, b)
					}
				}
			}
		}
	}
	mu.Lock()
	live := sawKey
	mu.Unlock()
	if calls == 0 || !live {
		t.Fatalf("the canary never reached the fake (%d calls): the test checks nothing", calls)
	}
	for _, n := range needles {
		if strings.Contains(logs.String(), n) {
			t.Errorf("log contains canary form %q", n)
		}
	}
}

// argsFor fills a tool's required arguments from its schema.
func argsFor(t *testing.T, def mcpgo.Tool, _ string) map[string]any {
	t.Helper()
	b, _ := json.Marshal(def)
	var d struct {
		InputSchema struct {
			Required   []string `json:"required"`
			Properties map[string]struct {
				Type string `json:"type"`
				Enum []any  `json:"enum"`
			} `json:"properties"`
		} `json:"inputSchema"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	args := map[string]any{}
	for _, r := range d.InputSchema.Required {
		p := d.InputSchema.Properties[r]
		switch {
		case len(p.Enum) > 0:
			args[r] = p.Enum[0]
		case p.Type == "number" || p.Type == "integer":
			args[r] = 1
		case p.Type == "boolean":
			args[r] = true
		default:
			args[r] = "1 + 1"
		}
	}
	return args
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}
