package mcp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"

	"gpuhost/mcp"
	"gpuhost/mcp/connector"
)

const cliSecret = "cli-canary-91be77"

// The CLI builds from the registry, so the test registers its own
// connector (the test binary's registry holds only this one).
func init() {
	connector.Register("clitest", func() connector.Connector {
		return &fakeConn{build: func(env connector.Env) ([]connector.Tool, error) {
			t := deviceTool("clitest_status")
			t.Handler = func(_ context.Context, a connector.Args) (any, error) {
				key, err := env.Secrets.Get("CLITEST_KEY")
				if err != nil {
					return nil, err
				}
				if a.String("device") == "garage" {
					return nil, fmt.Errorf("device garage refused key %s", key)
				}
				return "fine", nil
			}
			t.Targets.TestArgs = func(string) map[string]any { return map[string]any{} }
			return []connector.Tool{t}, nil
		}}
	})
}

type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit %d", int(e)) }

// setupOf builds the server over sections, as the daemon's assembly
// would over a config's mcp.connectors.
func setupOf(sections map[string]yaml.Node) mcp.Setup {
	return mcp.Setup{Build: func(log *slog.Logger) (*mcp.Server, error) {
		return mcp.NewServer(mcp.ServerOptions{Config: sections, Log: log})
	}}
}

func runCmd(t *testing.T, sections map[string]yaml.Node, args ...string) (string, error) {
	t.Helper()
	cmd := mcp.NewCmd(mcp.CmdDeps{
		Load: func(*cobra.Command) (mcp.Setup, error) { return setupOf(sections), nil },
		Demo: func(*cobra.Command) (mcp.Setup, error) {
			return setupOf(map[string]yaml.Node{"clitest": section()}), nil
		},
		Exit: func(code int) error { return exitCode(code) },
	})
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetIn(strings.NewReader(""))
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func TestCmd(t *testing.T) {
	t.Setenv("CLITEST_KEY", cliSecret)
	on := map[string]yaml.Node{"clitest": section()}
	broken := map[string]yaml.Node{"clitest": section(), "nosuch": section()}
	tests := []struct {
		name     string
		sections map[string]yaml.Node
		args     []string
		wantErr  string
		want     []string
	}{
		{"tools", on, []string{"tools"}, "", []string{"clitest_status", `"enum":["garage","kitchen"]`}},
		{"tools demo", nil, []string{"tools", "--demo"}, "", []string{"clitest_status"}},
		{"tools disabled", broken, []string{"tools"}, "", []string{"disabled connector nosuch: mcp.connectors.nosuch: no such connector"}},
		{"test", on, []string{"test"}, "exit 1", []string{"ok   clitest_status device=kitchen", "FAIL clitest_status device=garage: device garage refused key [redacted]", "1 check(s) failed"}},
		{"test one", on, []string{"test", "clitest"}, "exit 1", []string{"device=kitchen"}},
		{"test unknown", on, []string{"test", "other"}, `connector "other" is not configured`, nil},
		{"test disabled", broken, []string{"test", "nosuch"}, "exit 1", []string{"FAIL connector nosuch disabled"}},
		{"serve stdio eof", on, nil, "", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := runCmd(t, tc.sections, tc.args...)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("err = %v, want %q\n%s", err, tc.wantErr, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			if strings.Contains(out, cliSecret) {
				t.Errorf("output leaks the secret:\n%s", out)
			}
		})
	}
	t.Run("tools json", func(t *testing.T) {
		out, err := runCmd(t, on, "tools", "--json")
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Tools    []mcpgo.Tool      `json:"tools"`
			Disabled map[string]string `json:"disabled"`
		}
		if err := json.Unmarshal([]byte(out), &doc); err != nil {
			t.Fatalf("%v:\n%s", err, out)
		}
		if len(doc.Tools) != 1 || doc.Tools[0].Name != "clitest_status" {
			t.Fatalf("tools = %+v", doc.Tools)
		}
	})
	t.Run("missing secret", func(t *testing.T) {
		t.Setenv("CLITEST_KEY", "")
		out, err := runCmd(t, on, "test")
		var ec exitCode
		if !errors.As(err, &ec) || !strings.Contains(out, "CLITEST_KEY is not set") {
			t.Fatalf("err %v, output:\n%s", err, out)
		}
	})
}
