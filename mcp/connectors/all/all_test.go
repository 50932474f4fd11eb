package all_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"gopkg.in/yaml.v3"

	"gpuhost/api"
	"gpuhost/bench"
	"gpuhost/mcp"
	"gpuhost/mcp/connector"
	_ "gpuhost/mcp/connectors/all"
	"gpuhost/nvml"
)

var update = flag.Bool("update", false, "rewrite testdata/tools.golden")

// configs enable every compiled connector with targets, so the walk sees
// every tool. A connector registered without an entry here fails the test:
// add its section when adding its import line.
var configs = map[string]string{
	"calc":      `{}`,
	"gpu":       `{}`,
	"inference": `{}`,
	"weather":   `{}`,
	"shelly": `
devices:
  - {name: rack-plug, mode: local, address: "http://127.0.0.1:1"}
  - {name: desk-plug, mode: cloud, id: a8032abe41fc, server: "http://127.0.0.1:1", auth_key_env: SHELLY_TEST_KEY}
`,
	"nas": `
nas:
  - {name: backup-nas, url: "http://127.0.0.1:1", user: ro, password_env: NAS_TEST_PASSWORD}
`,
	"crm": `{dsn_env: CRM_TEST_DSN}`,
}

// daemon is an idle appliance: enough for the gpu and inference connectors
// to build their tools (the walk does not call them).
type daemon struct{}

func (daemon) Snapshot(context.Context) (nvml.Snapshot, error) { return nvml.Snapshot{}, nil }
func (daemon) Status(context.Context) api.Status               { return api.Status{} }
func (daemon) Doctor(context.Context, string) api.DoctorReport {
	return api.DoctorReport{}
}
func (daemon) BenchResults() ([]bench.Summary, error) { return nil, errors.New("none") }

func allServer(t *testing.T) *mcp.Server {
	t.Helper()
	cfg := map[string]yaml.Node{}
	for _, name := range connector.Registered() {
		src, ok := configs[name]
		if !ok {
			t.Fatalf("connector %s is registered but has no section in this test's configs", name)
		}
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
			t.Fatalf("%s config: %v", name, err)
		}
		cfg[name] = *doc.Content[0]
	}
	s, err := mcp.NewServer(mcp.ServerOptions{Config: cfg, Daemon: daemon{}})
	if err != nil {
		t.Fatal(err)
	}
	if d := s.Disabled(); len(d) > 0 {
		t.Fatalf("connectors disabled: %v", d)
	}
	return s
}

// TestEveryToolReadOnlyWithEnumTargets walks what a client sees in
// tools/list and what the registry holds.
func TestEveryToolReadOnlyWithEnumTargets(t *testing.T) {
	s := allServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := s.InProcessClient(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	list, err := c.ListTools(ctx, mcpgo.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Tools) != len(s.Tools()) || len(list.Tools) == 0 {
		t.Fatalf("tools/list has %d tools, registry %d", len(list.Tools), len(s.Tools()))
	}
	for _, tl := range list.Tools {
		a := tl.Annotations
		if a.ReadOnlyHint == nil || !*a.ReadOnlyHint || a.DestructiveHint == nil || *a.DestructiveHint {
			t.Errorf("%s: annotations %+v, want readOnlyHint true, destructiveHint false", tl.Name, a)
		}
		if tl.Description == "" {
			t.Errorf("%s: no description", tl.Name)
		}
	}
	for _, ti := range s.Tools() {
		if !strings.HasPrefix(ti.Tool.Def.Name, ti.Connector+"_") {
			t.Errorf("%s: not prefixed with its connector %s", ti.Tool.Def.Name, ti.Connector)
		}
		tg := ti.Tool.Targets
		if tg == nil {
			continue
		}
		b, _ := json.Marshal(ti.Tool.Def)
		var def struct {
			InputSchema struct {
				Properties map[string]struct {
					Enum []string `json:"enum"`
				} `json:"properties"`
			} `json:"inputSchema"`
		}
		if err := json.Unmarshal(b, &def); err != nil {
			t.Fatal(err)
		}
		got := def.InputSchema.Properties[tg.Param].Enum
		want := slices.Clone(tg.Values)
		slices.Sort(got)
		slices.Sort(want)
		if len(got) == 0 || !slices.Equal(got, want) {
			t.Errorf("%s: %s enum %v, targets %v", ti.Tool.Def.Name, tg.Param, got, want)
		}
	}
}

// TestToolListStable keeps the tool list under review: a renamed or
// removed tool breaks clients' configs (go test -run ToolListStable -update).
func TestToolListStable(t *testing.T) {
	s := allServer(t)
	var lines []string
	for _, ti := range s.Tools() {
		line := ti.Tool.Def.Name
		if tg := ti.Tool.Targets; tg != nil {
			line += " targets=" + tg.Param
		}
		lines = append(lines, line)
	}
	if !slices.IsSorted(lines) {
		t.Errorf("Tools() is not sorted: %v", lines)
	}
	got := strings.Join(lines, "\n") + "\n"
	path := filepath.Join("testdata", "tools.golden")
	if *update {
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("tool list changed (run with -update if intended):\n got:\n%s\nwant:\n%s", got, want)
	}
}

// TestDemoConfig: `gpuhost mcp --demo` serves every demo connector that
// is compiled in, with its defaults and a daemon.
func TestDemoConfig(t *testing.T) {
	s, err := mcp.NewServer(mcp.ServerOptions{Config: mcp.DemoConfig(), Daemon: daemon{}})
	if err != nil {
		t.Fatal(err)
	}
	registered := connector.Registered()
	for _, n := range mcp.DemoConnectors {
		if !slices.Contains(registered, n) {
			t.Logf("demo connector %s is not compiled in yet", n)
			continue
		}
		if why, off := s.Disabled()[n]; off {
			t.Errorf("demo connector %s disabled: %s", n, why)
		}
		if !slices.Contains(s.Enabled(), n) {
			t.Errorf("demo connector %s not enabled", n)
		}
	}
}

// TestStrictArguments: every compiled tool declares a strict input schema,
// and a call with an argument the tool does not take, or with arguments
// that are not a JSON object, is an isError result saying so; the handler
// never runs (the targets here would fail on 127.0.0.1:1 if it did).
func TestStrictArguments(t *testing.T) {
	s := allServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := s.InProcessClient(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	list, err := c.ListTools(ctx, mcpgo.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	callText := func(name string, args any) (string, bool) {
		t.Helper()
		req := mcpgo.CallToolRequest{}
		req.Params.Name = name
		req.Params.Arguments = args
		res, err := c.CallTool(ctx, req)
		if err != nil {
			t.Fatalf("call %s: protocol error %v", name, err)
		}
		var parts []string
		for _, ct := range res.Content {
			if tc, ok := mcpgo.AsTextContent(ct); ok {
				parts = append(parts, tc.Text)
			}
		}
		return strings.Join(parts, "\n"), res.IsError
	}
	for _, tl := range list.Tools {
		if ap, ok := tl.InputSchema.AdditionalProperties.(bool); !ok || ap {
			t.Errorf("%s: additionalProperties %v, want false", tl.Name, tl.InputSchema.AdditionalProperties)
		}
		want := `invalid arguments for ` + tl.Name + `: unknown argument "zz_unknown"`
		if got, isErr := callText(tl.Name, map[string]any{"zz_unknown": 1}); !isErr || !strings.Contains(got, want) {
			t.Errorf("%s with an unknown argument: isError=%v %q, want %q", tl.Name, isErr, got, want)
		}
		want = "invalid arguments for " + tl.Name + ": arguments must be a JSON object, got string"
		if got, isErr := callText(tl.Name, `{}`); !isErr || !strings.Contains(got, want) {
			t.Errorf("%s with arguments as a string: isError=%v %q, want %q", tl.Name, isErr, got, want)
		}
	}
	// The probe of the issue, and the same call without the extra key.
	if got, isErr := callText("calc_evaluate", map[string]any{"expression": "1+1", "foo": "bar"}); !isErr ||
		!strings.Contains(got, `unknown argument "foo": this tool takes only expression`) {
		t.Errorf("calc_evaluate with foo: isError=%v %q", isErr, got)
	}
	if got, isErr := callText("calc_evaluate", map[string]any{"expression": "1+1"}); isErr || !strings.Contains(got, "2") {
		t.Errorf("calc_evaluate: isError=%v %q", isErr, got)
	}
}
