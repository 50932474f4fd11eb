package mcp_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"gopkg.in/yaml.v3"

	"gpuhost/appliance"
	"gpuhost/config"
	"gpuhost/frontdoor/httpapi"
	"gpuhost/internal/testbin"
	"gpuhost/internal/testkit"
	"gpuhost/mcp"
	"gpuhost/mcp/connector"
)

// fakeConn is a connector whose tools the test chooses.
type fakeConn struct {
	build func(env connector.Env) ([]connector.Tool, error)
}

func (f *fakeConn) Build(env connector.Env) ([]connector.Tool, error) { return f.build(env) }

func factory(build func(env connector.Env) ([]connector.Tool, error)) connector.Factory {
	return func() connector.Connector { return &fakeConn{build: build} }
}

func tools(ts ...connector.Tool) func(connector.Env) ([]connector.Tool, error) {
	return func(connector.Env) ([]connector.Tool, error) { return ts, nil }
}

func ro(name string, opts ...mcpgo.ToolOption) mcpgo.Tool {
	base := []mcpgo.ToolOption{
		mcpgo.WithDescription("test tool " + name),
		mcpgo.WithReadOnlyHintAnnotation(true),
		mcpgo.WithDestructiveHintAnnotation(false),
		mcpgo.WithSchemaAdditionalProperties(false),
	}
	return mcpgo.NewTool(name, append(base, opts...)...)
}

func okHandler(_ context.Context, args connector.Args) (any, error) {
	return "ok " + args.String("device"), nil
}

var devices = []string{"garage", "kitchen"}

func deviceTool(name string) connector.Tool {
	return connector.Tool{
		Def:     ro(name, mcpgo.WithString("device", mcpgo.Required(), mcpgo.Enum(devices...))),
		Handler: okHandler,
		Targets: &connector.Targets{Param: "device", Values: devices},
	}
}

// section is an enabled connector section (an empty mapping).
func section() yaml.Node { return yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"} }

func newServer(t testing.TB, opts mcp.ServerOptions) *mcp.Server {
	t.Helper()
	s, err := mcp.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestRegistrationRefusals(t *testing.T) {
	good := deviceTool("good_status")
	noRO := connector.Tool{Def: mcpgo.NewTool("bad_x", mcpgo.WithDestructiveHintAnnotation(false)), Handler: okHandler}
	roFalse := connector.Tool{Def: mcpgo.NewTool("bad_x", mcpgo.WithReadOnlyHintAnnotation(false), mcpgo.WithDestructiveHintAnnotation(false)), Handler: okHandler}
	noDestr := connector.Tool{Def: mcpgo.NewTool("bad_x", mcpgo.WithReadOnlyHintAnnotation(true)), Handler: okHandler}
	destr := connector.Tool{Def: ro("bad_x", mcpgo.WithDestructiveHintAnnotation(true)), Handler: okHandler}
	enumMismatch := deviceTool("bad_x")
	enumMismatch.Targets = &connector.Targets{Param: "device", Values: []string{"kitchen", "garage", "attic"}}
	notEnum := connector.Tool{Def: ro("bad_x", mcpgo.WithString("device", mcpgo.Required())), Handler: okHandler,
		Targets: &connector.Targets{Param: "device", Values: devices}}
	wrongParam := deviceTool("bad_x")
	wrongParam.Targets = &connector.Targets{Param: "nas", Values: devices}
	noTargets := connector.Tool{Def: ro("bad_x", mcpgo.WithString("device", mcpgo.Required(), mcpgo.Enum())), Handler: okHandler,
		Targets: &connector.Targets{Param: "device"}}

	lax := connector.Tool{Def: mcpgo.NewTool("bad_x", mcpgo.WithReadOnlyHintAnnotation(true), mcpgo.WithDestructiveHintAnnotation(false),
		mcpgo.WithString("device")), Handler: okHandler}
	apTrue := connector.Tool{Def: ro("bad_x", mcpgo.WithSchemaAdditionalProperties(true)), Handler: okHandler}
	apSchema := connector.Tool{Def: ro("bad_x", mcpgo.WithSchemaAdditionalProperties(map[string]any{"type": "string"})), Handler: okHandler}
	nested := connector.Tool{Def: ro("bad_x", mcpgo.WithObject("filter", mcpgo.Properties(map[string]any{"q": map[string]any{"type": "string"}}))),
		Handler: okHandler}
	nestedItems := connector.Tool{Def: ro("bad_x", mcpgo.WithArray("rows", mcpgo.Items(map[string]any{"type": "object",
		"additionalProperties": true}))), Handler: okHandler}
	rawLax := connector.Tool{Def: mcpgo.NewToolWithRawSchema("bad_x", "raw schema", json.RawMessage(`{"type":"object","properties":{"q":{"type":"string"}}}`)),
		Handler: okHandler}
	rawLax.Def.Annotations = ro("bad_x").Annotations
	rawTypes := connector.Tool{Def: mcpgo.NewToolWithRawSchema("bad_x", "raw schema", json.RawMessage(
		`{"type":"object","properties":{"q":{"type":["object","null"],"additionalProperties":true}},"additionalProperties":false}`)),
		Handler: okHandler}
	rawTypes.Def.Annotations = ro("bad_x").Annotations

	tests := []struct {
		name  string
		build func(connector.Env) ([]connector.Tool, error)
		want  string
	}{
		{"schema not strict", tools(lax), "tool bad_x refused: input schema is not strict: the top-level object must have additionalProperties: false"},
		{"additionalProperties true", tools(apTrue), "the top-level object must have additionalProperties: false"},
		{"additionalProperties a schema", tools(apSchema), "the top-level object must have additionalProperties: false"},
		{"nested object not strict", tools(nested), "property filter must have additionalProperties: false"},
		{"array items not strict", tools(nestedItems), "property rows[] must have additionalProperties: false"},
		{"raw schema not strict", tools(rawLax), "tool bad_x refused: input schema is not strict"},
		{"nullable object not strict", tools(rawTypes), "property q must have additionalProperties: false"},
		{"no readOnlyHint", tools(noRO), "readOnlyHint must be true"},
		{"readOnlyHint false", tools(roFalse), "readOnlyHint must be true"},
		{"destructiveHint unset", tools(noDestr), "destructiveHint must be set to false"},
		{"destructive", tools(destr), "destructiveHint must be set to false"},
		{"missing prefix", tools(connector.Tool{Def: ro("status"), Handler: okHandler}), `must start with "bad_"`},
		{"other connector's prefix", tools(connector.Tool{Def: ro("good_status"), Handler: okHandler}), `must start with "bad_"`},
		{"prefix only", tools(connector.Tool{Def: ro("bad_"), Handler: okHandler}), `must start with "bad_"`},
		{"bad characters", tools(connector.Tool{Def: ro("bad_a b"), Handler: okHandler}), "is not 1-128 characters"},
		{"duplicate", tools(connector.Tool{Def: ro("bad_x"), Handler: okHandler}, connector.Tool{Def: ro("bad_x"), Handler: okHandler}), "duplicate tool name"},
		{"no handler", tools(connector.Tool{Def: ro("bad_x")}), "no handler"},
		{"enum differs from targets", tools(enumMismatch), "must equal the configured targets"},
		{"target not an enum", tools(notEnum), "must equal the configured targets"},
		{"target param missing", tools(wrongParam), `parameter "nas" is not in the input schema`},
		{"no targets", tools(noTargets), "has no configured targets"},
		{"build error", func(connector.Env) ([]connector.Tool, error) { return nil, errors.New("no devices configured") }, "build: no devices configured"},
		{"build panic", func(connector.Env) ([]connector.Tool, error) { panic("boom") }, "build: panic: boom"},
		{"one bad tool refuses all", tools(connector.Tool{Def: ro("bad_fine"), Handler: okHandler}, destr), "tool bad_x refused"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newServer(t, mcp.ServerOptions{
				Config: map[string]yaml.Node{"good": section(), "bad": section()},
				Factories: map[string]connector.Factory{
					"good": factory(tools(good)),
					"bad":  factory(tc.build),
				},
			})
			why, off := s.Disabled()["bad"]
			if !off || !strings.Contains(why, tc.want) {
				t.Fatalf("bad connector: disabled=%v reason %q, want it to contain %q", off, why, tc.want)
			}
			if got := s.Enabled(); len(got) != 1 || got[0] != "good" {
				t.Fatalf("enabled = %v, want [good]", got)
			}
			for _, ti := range s.Tools() {
				if ti.Connector == "bad" {
					t.Fatalf("a tool of the refused connector is registered: %s", ti.Tool.Def.Name)
				}
			}
			c := inproc(t, s)
			list, err := c.ListTools(context.Background(), mcpgo.ListToolsRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if len(list.Tools) != 1 || list.Tools[0].Name != "good_status" {
				t.Fatalf("tools/list = %v, want only good_status", list.Tools)
			}
		})
	}
}

// TestOptionalTarget: an optional target parameter is accepted when its
// enum matches; a value outside it is still refused at call time.
func TestOptionalTarget(t *testing.T) {
	opt := connector.Tool{Def: ro("o_doctor", mcpgo.WithString("device", mcpgo.Enum(devices...))), Handler: okHandler,
		Targets: &connector.Targets{Param: "device", Values: devices}}
	s := newServer(t, mcp.ServerOptions{
		Config:    map[string]yaml.Node{"o": section()},
		Factories: map[string]connector.Factory{"o": factory(tools(opt))},
	})
	if d := s.Disabled(); len(d) > 0 {
		t.Fatalf("disabled: %v", d)
	}
	c := inproc(t, s)
	if r := call(t, c, "o_doctor", nil); r.IsError {
		t.Errorf("omitted optional target: %q", text(r))
	}
	if r := call(t, c, "o_doctor", map[string]any{"device": "attic"}); !r.IsError {
		t.Errorf("unknown optional target accepted: %q", text(r))
	}
}

func TestConnectorSelection(t *testing.T) {
	called := map[string]bool{}
	var mu sync.Mutex
	mk := func(name string) connector.Factory {
		return factory(func(env connector.Env) ([]connector.Tool, error) {
			mu.Lock()
			called[env.Name] = true
			mu.Unlock()
			return []connector.Tool{{Def: ro(name + "_t"), Handler: okHandler}}, nil
		})
	}
	s := newServer(t, mcp.ServerOptions{
		Config:    map[string]yaml.Node{"a": section(), "nosuch": section(), "decl": section()},
		Factories: map[string]connector.Factory{"a": mk("a"), "b": mk("b"), "clash": mk("clash")},
		Extra: []connector.Named{
			{Name: "decl", Connector: &fakeConn{build: tools(connector.Tool{Def: ro("decl_t"), Handler: okHandler})}},
			{Name: "clash", Connector: &fakeConn{build: tools(connector.Tool{Def: ro("clash_t"), Handler: okHandler})}},
		},
	})
	if called["b"] {
		t.Error("connector b has no section but was built")
	}
	if got := strings.Join(s.Enabled(), ","); got != "a,decl" {
		t.Errorf("enabled = %s, want a,decl", got)
	}
	d := s.Disabled()
	if !strings.Contains(d["nosuch"], "no such connector (built in: a, b, clash)") {
		t.Errorf("nosuch: %q", d["nosuch"])
	}
	if !strings.Contains(d["clash"], "has the name of a built-in connector") {
		t.Errorf("clash: %q", d["clash"])
	}
}

func inproc(t testing.TB, s *mcp.Server) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := s.InProcessClient(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func call(t testing.TB, c *client.Client, name string, args any) *mcpgo.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := mcpgo.CallToolRequest{}
	req.Params.Name = name
	req.Params.Arguments = args
	res, err := c.CallTool(ctx, req)
	if err != nil {
		t.Fatalf("call %s: protocol error %v (want results, never protocol errors)", name, err)
	}
	return res
}

func text(res *mcpgo.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := mcpgo.AsTextContent(c); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// behaviourServer has one tool per behaviour the wrapper must handle.
func behaviourServer(t testing.TB, logTo io.Writer) *mcp.Server {
	t.Helper()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	num := connector.Tool{
		Def: ro("t_sum", mcpgo.WithNumber("a", mcpgo.Required()), mcpgo.WithNumber("b", mcpgo.Required())),
		Handler: func(_ context.Context, a connector.Args) (any, error) {
			x, _ := a.Number("a")
			y, _ := a.Number("b")
			return map[string]any{"sum": x + y}, nil
		},
	}
	list := connector.Tool{Def: ro("t_list"), Handler: func(context.Context, connector.Args) (any, error) { return []int{1, 2}, nil }}
	slow := connector.Tool{Def: ro("t_slow"), Handler: func(context.Context, connector.Args) (any, error) {
		<-release // ignores its context on purpose
		return "late", nil
	}}
	panicky := connector.Tool{Def: ro("t_panic"), Handler: func(context.Context, connector.Args) (any, error) { panic("nil map somewhere") }}
	failing := connector.Tool{Def: ro("t_fail"), Handler: func(context.Context, connector.Args) (any, error) {
		return nil, errors.New("device 'kitchen' is offline: last seen 3 h ago")
	}}
	noSecret := connector.Tool{Def: ro("t_secret"), Handler: func(ctx context.Context, _ connector.Args) (any, error) {
		return nil, fmt.Errorf("read status: %w", &connector.MissingSecretError{Name: "SHELLY_AUTH_KEY"})
	}}
	badJSON := connector.Tool{Def: ro("t_chan"), Handler: func(context.Context, connector.Args) (any, error) { return make(chan int), nil }}
	pattern := connector.Tool{Def: mcpgo.NewToolWithRawSchema("t_labels", "labels by pattern", json.RawMessage(
		`{"type":"object","properties":{"name":{"type":"string"}},"patternProperties":{"^label_[a-z]+$":{"type":"string"}},"additionalProperties":false}`)),
		Handler: func(_ context.Context, a connector.Args) (any, error) { return fmt.Sprintf("%d args", len(a)), nil }}
	pattern.Def.Annotations = ro("t_labels").Annotations
	log := slog.New(slog.NewJSONHandler(io.Discard, nil))
	if logTo != nil {
		log = slog.New(slog.NewJSONHandler(logTo, nil))
	}
	return newServer(t, mcp.ServerOptions{
		Config:      map[string]yaml.Node{"t": section()},
		Factories:   map[string]connector.Factory{"t": factory(tools(deviceTool("t_status"), num, list, slow, panicky, failing, noSecret, badJSON, pattern))},
		CallTimeout: 100 * time.Millisecond,
		Secrets:     connector.NewSecrets(func(string) (string, bool) { return "", false }),
		Log:         log,
	})
}

func TestCalls(t *testing.T) {
	var logBuf testkit.SyncBuffer
	s := behaviourServer(t, &logBuf)
	c := inproc(t, s)
	tests := []struct {
		name    string
		tool    string
		args    any // a map, or what a broken client sends instead
		isError bool
		want    []string
	}{
		{"ok text", "t_status", map[string]any{"device": "kitchen"}, false, []string{"ok kitchen"}},
		{"ok json", "t_sum", map[string]any{"a": 1, "b": 2.5}, false, []string{`"sum": 3.5`}},
		{"json array", "t_list", nil, false, []string{"1", "2"}},
		{"unknown target", "t_status", map[string]any{"device": "attic"}, true, []string{"invalid arguments for t_status", "argument device", "'garage', 'kitchen'"}},
		{"wrong type", "t_status", map[string]any{"device": 7}, true, []string{"argument device", "want string"}},
		{"wrong number type", "t_sum", map[string]any{"a": "1", "b": 2}, true, []string{"argument a", "want number"}},
		{"missing argument", "t_status", map[string]any{}, true, []string{"missing property 'device'"}},
		{"no arguments", "t_sum", nil, true, []string{"missing properties 'a', 'b'"}},
		{"timeout", "t_slow", nil, true, []string{"t_slow timed out after 100ms"}},
		{"panic", "t_panic", nil, true, []string{"internal error in t_panic"}},
		{"handler error", "t_fail", nil, true, []string{"device 'kitchen' is offline"}},
		{"missing secret", "t_secret", nil, true, []string{"SHELLY_AUTH_KEY is not set"}},
		{"not json", "t_chan", nil, true, []string{"not JSON"}},
		{"unknown argument", "t_status", map[string]any{"device": "kitchen", "foo": "bar"}, true,
			[]string{`invalid arguments for t_status: unknown argument "foo": this tool takes only device`}},
		{"unknown arguments", "t_sum", map[string]any{"a": 1, "b": 2, "z": 1, "c": true}, true,
			[]string{`unknown arguments "c", "z": this tool takes only a, b`}},
		{"argument to a tool without any", "t_list", map[string]any{"verbose": true}, true,
			[]string{`unknown argument "verbose": this tool takes no arguments`}},
		{"many unknown arguments", "t_list", map[string]any{"a": 1, "b": 1, "c": 1, "d": 1, "e": 1, "f": 1, "g": 1, strings.Repeat("x", 500): 1}, true,
			[]string{`unknown arguments "a", "b", "c", "d", "e", and 3 more: this tool takes no arguments`}},
		{"arguments as a JSON string", "t_status", `{"device":"kitchen"}`, true,
			[]string{"invalid arguments for t_status: arguments must be a JSON object, got string"}},
		{"arguments as an array", "t_sum", []any{1, 2}, true, []string{"arguments must be a JSON object, got array"}},
		{"arguments as a number", "t_list", 7, true, []string{"arguments must be a JSON object, got number"}},
		{"arguments as a boolean", "t_list", true, true, []string{"arguments must be a JSON object, got boolean"}},
		{"arguments null", "t_list", json.RawMessage("null"), true, []string{"invalid arguments for t_list: arguments must be a JSON object, got null"}},
		{"empty object", "t_list", map[string]any{}, false, []string{"1", "2"}},
		{"pattern property", "t_labels", map[string]any{"name": "a", "label_env": "prod"}, false, []string{"2 args"}},
		{"not a pattern property", "t_labels", map[string]any{"label_ENV": "prod"}, true, []string{`unknown argument "label_ENV"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := call(t, c, tc.tool, tc.args)
			got := text(res)
			if res.IsError != tc.isError {
				t.Fatalf("isError = %v, want %v (text %q)", res.IsError, tc.isError, got)
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("text %q does not contain %q", got, w)
				}
			}
			// The server keeps serving after every kind of failure.
			if r := call(t, c, "t_status", map[string]any{"device": "garage"}); r.IsError || text(r) != "ok garage" {
				t.Fatalf("server stopped serving after %s: %q", tc.name, text(r))
			}
		})
	}
	res := call(t, c, "t_sum", map[string]any{"a": 1, "b": 2})
	if m, ok := res.StructuredContent.(map[string]any); !ok || m["sum"] != float64(3) {
		t.Errorf("structured content = %#v, want {sum: 3}", res.StructuredContent)
	}
	// Audit log: one line per call with tool, args, duration, outcome.
	lines := strings.Split(strings.TrimSpace(logBuf.String()), "\n")
	outcomes := map[string]int{}
	for _, l := range lines {
		var rec map[string]any
		if json.Unmarshal([]byte(l), &rec) != nil || rec["msg"] != "mcp call" {
			continue
		}
		for _, k := range []string{"tool", "args", "duration_ms", "outcome"} {
			if _, ok := rec[k]; !ok {
				t.Errorf("audit line lacks %s: %s", k, l)
			}
		}
		outcomes[rec["outcome"].(string)]++
	}
	for _, o := range []string{"ok", "invalid_args", "timeout", "error", "missing_secret"} {
		if outcomes[o] == 0 {
			t.Errorf("no audit line with outcome %s (have %v)", o, outcomes)
		}
	}
}

// canary has characters that URL escaping and JSON change.
const canary = "CANARY-s3cr3t/+=&?\"<x>-7f3a9"

func TestCanarySecretNeverLeaves(t *testing.T) {
	var logBuf testkit.SyncBuffer
	secrets := connector.NewSecrets(func(name string) (string, bool) {
		if name == "FAKE_TOKEN" {
			return canary, true
		}
		return "", false
	})
	forms := map[string]string{
		"plain":        canary,
		"query":        url.QueryEscape(canary),
		"path":         url.PathEscape(canary),
		"base64":       base64.StdEncoding.EncodeToString([]byte(canary)),
		"base64url":    base64.URLEncoding.EncodeToString([]byte(canary)),
		"basic header": "Basic " + base64.StdEncoding.EncodeToString([]byte("admin:"+canary)),
		"basic 2":      base64.StdEncoding.EncodeToString([]byte("ab:" + canary + "!")),
	}
	var echoTools []connector.Tool
	for _, kind := range []string{"text", "json", "error", "wrapped"} {
		echoTools = append(echoTools, connector.Tool{
			Def: ro("leak_"+kind, mcpgo.WithString("echo")),
			Handler: func(ctx context.Context, _ connector.Args) (any, error) {
				tok, err := secrets.Get("FAKE_TOKEN")
				if err != nil {
					return nil, err
				}
				var all []string
				for k := range forms {
					all = append(all, k+": "+forms[k])
				}
				body := strings.Join(all, "\n")
				switch kind {
				case "text":
					return body, nil
				case "json":
					return map[string]any{"token": tok, "forms": forms, "nested": []any{map[string]string{"auth": forms["basic header"]}}}, nil
				case "error":
					return nil, errors.New("api said 401 for key " + body)
				default:
					return nil, fmt.Errorf("GET https://api.example/x?auth_key=%s: %w", url.QueryEscape(tok), errors.New("401"))
				}
			},
		})
	}
	var logOnce connector.Env
	s := newServer(t, mcp.ServerOptions{
		Config: map[string]yaml.Node{"leak": section()},
		Factories: map[string]connector.Factory{"leak": factory(func(env connector.Env) ([]connector.Tool, error) {
			logOnce = env
			return echoTools, nil
		})},
		Secrets: secrets,
		Log:     slog.New(slog.NewJSONHandler(&logBuf, nil)),
	})
	c := inproc(t, s)
	var outputs []string
	for _, tl := range echoTools {
		res := call(t, c, tl.Def.Name, map[string]any{"echo": canary})
		b, _ := json.Marshal(res)
		outputs = append(outputs, text(res), string(b))
		if !strings.Contains(text(res), connector.Redacted) {
			t.Errorf("%s: no redaction marker in %q", tl.Def.Name, text(res))
		}
	}
	// A connector that logs the secret by mistake is scrubbed too.
	tok, _ := secrets.Get("FAKE_TOKEN")
	logOnce.Log.Info("calling api with "+tok, "key", tok, "err", errors.New("bad key "+tok), "grp", slog.Group("g", "k", url.QueryEscape(tok)))
	outputs = append(outputs, logBuf.String())
	needles := map[string]string{"plain": canary}
	for k, v := range forms {
		needles[k] = v
	}
	// JSON escaping of the plain form, as a JSON log handler writes it.
	js, _ := json.Marshal(canary)
	needles["json"] = string(js[1 : len(js)-1])
	for i, out := range outputs {
		for k, n := range needles {
			n = strings.TrimPrefix(n, "Basic ")
			if strings.Contains(out, n) {
				t.Errorf("output %d contains the canary (%s form): %s", i, k, out)
			}
		}
		if strings.Contains(out, "s3cr3t") {
			t.Errorf("output %d contains part of the canary: %s", i, out)
		}
	}
	if !strings.Contains(logBuf.String(), `"outcome":"ok"`) {
		t.Error("no audit lines captured")
	}
}

// authAPI builds the daemon's echo server (httpapi.New with its
// bearer middleware) for a config listening on addr.
func authAPI(t testing.TB, listen, token string) *echo.Echo {
	t.Helper()
	state := t.TempDir()
	y := testbin.ConfigYAML("/bin/true", state, "process", "", 1, 2, "10ms")
	cfg, err := config.Parse("mcp-test", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen = listen
	cfg.APITokenEnv = "GPUHOST_MCP_TEST_TOKEN"
	t.Setenv("GPUHOST_MCP_TEST_TOKEN", token)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	sup := appliance.NewSupervisor(cfg, nil, nil, nil, log)
	t.Cleanup(sup.Close)
	e, err := httpapi.New(sup, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func httpClient(t testing.TB, base string, headers map[string]string) (*client.Client, error) {
	t.Helper()
	c, err := client.NewStreamableHttpClient(base+mcp.MountPath, transport.WithHTTPHeaders(headers))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	req := mcpgo.InitializeRequest{}
	req.Params.ProtocolVersion = mcpgo.LATEST_PROTOCOL_VERSION
	req.Params.ClientInfo = mcpgo.Implementation{Name: "test", Version: "1"}
	if _, err := c.Initialize(ctx, req); err != nil {
		_ = c.Close()
		return nil, err
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, nil
}

func TestHTTPRoundTrip(t *testing.T) {
	const token = "tok-8d2c7e-0123456789abcdef"
	tests := []struct {
		name    string
		listen  string
		headers map[string]string
		wantErr string
	}{
		{"loopback without token", "127.0.0.1:8080", nil, ""},
		{"all interfaces with token", "0.0.0.0:8080", map[string]string{"Authorization": "Bearer " + token}, ""},
		{"all interfaces without token", "0.0.0.0:8080", nil, "authorization required"},
		{"all interfaces wrong token", "0.0.0.0:8080", map[string]string{"Authorization": "Bearer nope"}, "authorization required"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := behaviourServer(t, nil)
			e := authAPI(t, tc.listen, token)
			s.Register(e)
			srv := httptest.NewServer(e)
			t.Cleanup(srv.Close)
			c, err := httpClient(t, srv.URL, tc.headers)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("initialize: err %v, want %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r := call(t, c, "t_status", map[string]any{"device": "kitchen"}); r.IsError || text(r) != "ok kitchen" {
				t.Fatalf("call: %q", text(r))
			}
			if r := call(t, c, "t_status", map[string]any{"device": "attic"}); !r.IsError {
				t.Fatalf("unknown target over HTTP is not isError: %q", text(r))
			}
			if r := call(t, c, "t_panic", nil); !r.IsError {
				t.Fatal("panic over HTTP is not isError")
			}
			if r := call(t, c, "t_sum", map[string]any{"a": 1, "b": 1}); r.IsError {
				t.Fatalf("server stopped serving: %q", text(r))
			}
		})
	}
}

// TestHTTPDNSRebinding: on a loopback connection, a foreign Host header is
// refused by mcp-go's protection, which Register keeps on.
func TestHTTPDNSRebinding(t *testing.T) {
	s := behaviourServer(t, nil)
	e := echo.New()
	s.Register(e)
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`
	for _, tc := range []struct {
		host string
		want int
	}{{"evil.example", http.StatusForbidden}, {"", http.StatusOK}} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+mcp.MountPath, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if tc.host != "" {
			req.Host = tc.host
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("Host %q: status %d, want %d", tc.host, resp.StatusCode, tc.want)
		}
	}
}

func TestStdio(t *testing.T) {
	s := behaviourServer(t, nil)
	in := strings.Join([]string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"t_status","arguments":{"device":"garage"}}}`,
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"t_status","arguments":{"device":"attic"}}}`,
	}, "\n") + "\n"
	pr, pw := io.Pipe()
	var out testkit.SyncBuffer
	done := make(chan error, 1)
	go func() { done <- s.ServeStdio(context.Background(), pr, &out) }()
	if _, err := io.WriteString(pw, in); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(out.String(), "\n") < 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	_ = pw.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("ServeStdio: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ServeStdio did not return after stdin closed")
	}
	byID := map[float64]map[string]any{}
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("stdout carries a non-protocol line %q: %v", l, err)
		}
		if id, ok := m["id"].(float64); ok {
			byID[id] = m
		}
	}
	r2, _ := byID[2]["result"].(map[string]any)
	r3, _ := byID[3]["result"].(map[string]any)
	if r2 == nil || r2["isError"] == true {
		t.Errorf("call 2: %v", byID[2])
	}
	if r3 == nil || r3["isError"] != true {
		t.Errorf("call 3 (unknown target) should be an isError result: %v", byID[3])
	}
}

func TestReloadExtra(t *testing.T) {
	decl := func(names ...string) *fakeConn {
		var ts []connector.Tool
		for _, n := range names {
			ts = append(ts, connector.Tool{Def: ro(n), Handler: okHandler})
		}
		return &fakeConn{build: tools(ts...)}
	}
	s := newServer(t, mcp.ServerOptions{
		Config:    map[string]yaml.Node{"t": section()},
		Factories: map[string]connector.Factory{"t": factory(tools(deviceTool("t_status")))},
		Extra:     []connector.Named{{Name: "att", Connector: decl("att_today")}, {Name: "old", Connector: decl("wrong_prefix")}},
	})
	if _, off := s.Disabled()["old"]; !off {
		t.Fatalf("old should be disabled: %v", s.Disabled())
	}
	c := inproc(t, s)
	s.ReloadExtra([]connector.Named{{Name: "att", Connector: decl("att_absences", "att_today")}, {Name: "t", Connector: decl("t_x")}})
	list, err := c.ListTools(context.Background(), mcpgo.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range list.Tools {
		names = append(names, tl.Name)
	}
	if got := strings.Join(names, ","); got != "att_absences,att_today,t_status" {
		t.Errorf("tools after reload: %s", got)
	}
	d := s.Disabled()
	if _, off := d["old"]; off {
		t.Errorf("old connector's entry survived the reload: %v", d)
	}
	if !strings.Contains(d["t"], "name of a built-in connector") {
		t.Errorf("declarative t should be refused: %v", d)
	}
	if got := strings.Join(s.Enabled(), ","); got != "att,t" {
		t.Errorf("enabled: %s", got)
	}
	if r := call(t, c, "att_absences", nil); r.IsError || text(r) != "ok " {
		t.Errorf("new tool: %q", text(r))
	}
	if r := call(t, c, "t_status", map[string]any{"device": "garage"}); r.IsError {
		t.Errorf("compiled connector broke: %q", text(r))
	}
}

func TestReloadExtraClearsOldRefusals(t *testing.T) {
	s := newServer(t, mcp.ServerOptions{
		Config:    map[string]yaml.Node{"t": section()},
		Factories: map[string]connector.Factory{"t": factory(tools(deviceTool("t_status")))},
		Extra:     []connector.Named{{Name: "t", Connector: &fakeConn{build: tools()}}},
	})
	if _, off := s.Disabled()["t"]; !off {
		t.Fatal("clash not reported")
	}
	s.ReloadExtra(nil)
	if d := s.Disabled(); len(d) != 0 {
		t.Errorf("disabled after reload without declarative connectors: %v", d)
	}
	if got := strings.Join(s.Enabled(), ","); got != "t" {
		t.Errorf("enabled: %s", got)
	}
}
