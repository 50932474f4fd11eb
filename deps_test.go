package main

import (
	"os/exec"
	"path"
	"sort"
	"strings"
	"testing"
)

// The dependency rules of docs/architecture.md, kept by a test so that a
// convenient import cannot quietly turn a service back into a part of the
// daemon core. Each rule names packages (a trailing "/..." includes the
// subtree) and what they must not depend on, directly or through others;
// except names packages under pkgs the rule does not hold for. Only
// non-test dependencies count: a test may run a real Supervisor.
var depRules = []struct {
	pkgs   []string
	except []string
	forbid []string
	why    string
}{
	{
		pkgs:   []string{"gpuhost/mcp/...", "gpuhost/triage/...", "gpuhost/agent/...", "gpuhost/bench/...", "gpuhost/units/...", "gpuhost/simulator/...", "gpuhost/backend/..."},
		forbid: []string{"gpuhost/appliance/...", "gpuhost/systemd/...", "gpuhost/frontdoor/...", "gpuhost/internal/mcpview", "github.com/godbus/dbus/v5/...", "github.com/coreos/go-systemd/v22/..."},
		why:    "services and connectors use the box only through the daemon's API and small interfaces; they never control systemd",
	},
	{
		pkgs:   []string{"gpuhost/mcp/connector", "gpuhost/mcp/connectors/...", "gpuhost/mcp/declarative"},
		forbid: []string{"gpuhost/mcp", "github.com/mark3labs/mcp-go/server", "github.com/mark3labs/mcp-go/client/..."},
		why:    "a connector implements the contract in gpuhost/mcp/connector; the MCP server and its stack are the registry's, built by internal/assemble",
	},
	{
		pkgs:   []string{"gpuhost/mcp/connector", "gpuhost/mcp/connectors/...", "gpuhost/mcp/declarative"},
		except: []string{"gpuhost/mcp/connectors/gpu", "gpuhost/mcp/connectors/inference", "gpuhost/mcp/connectors/all"},
		forbid: []string{"gpuhost/api/...", "gpuhost/bench/...", "gpuhost/nvml/...", "github.com/NVIDIA/go-nvml/..."},
		why:    "a connector that does not read the daemon links none of it: the contract hands the daemon over untyped and only gpu and inference assert their own interfaces",
	},
	{
		pkgs:   []string{"gpuhost/mcp/connector", "gpuhost/mcp/connectors/...", "gpuhost/mcp/declarative"},
		forbid: []string{"gpuhost/bench/benchcmd", "gpuhost/bench/benchapi", "github.com/labstack/echo/v4/...", "github.com/spf13/cobra/...", "github.com/spf13/pflag/..."},
		why:    "no connector links a command line or an HTTP server, not even gpu and inference, which read the daemon: inference shows bench results through the core gpuhost/bench (Summary), whose command is benchcmd and whose service is benchapi",
	},
	{
		pkgs:   []string{"gpuhost/bench"},
		forbid: []string{"gpuhost/bench/benchcmd", "gpuhost/bench/benchapi", "github.com/spf13/cobra/...", "github.com/spf13/pflag/...", "github.com/labstack/echo/v4/...", "github.com/schollz/progressbar/v3/...", "golang.org/x/term/..."},
		why:    "the measurement core is linked by every reader of results (panel, MCP inference); its command line is gpuhost/bench/benchcmd and its HTTP service gpuhost/bench/benchapi",
	},
	{
		pkgs:   []string{"gpuhost/bench/benchcmd"},
		forbid: []string{"gpuhost/bench/benchapi", "github.com/labstack/echo/v4/..."},
		why:    "the bench command reaches the daemon's bench service over HTTP (api.Client, the core's body types), never by linking the server",
	},
	{
		pkgs:   []string{"gpuhost/bench/benchapi"},
		forbid: []string{"gpuhost/bench/benchcmd", "github.com/spf13/cobra/...", "github.com/spf13/pflag/...", "github.com/schollz/progressbar/v3/...", "golang.org/x/term/..."},
		why:    "the daemon's bench service links no command line or terminal",
	},
	{
		pkgs:   []string{"gpuhost/mcp/connector"},
		forbid: []string{"gpuhost/..."},
		why:    "the contract is linked by every connector, so it holds only the standard library, mcp-go's types and yaml",
	},
	{
		pkgs:   []string{"gpuhost/frontdoor/..."},
		forbid: []string{"gpuhost/appliance/...", "gpuhost/systemd/...", "github.com/godbus/dbus/v5/..."},
		why:    "front doors call the Supervisor through their own small interfaces; internal/assemble hands it over",
	},
	{
		pkgs:   []string{"gpuhost/frontdoor/..."},
		forbid: []string{"gpuhost/triage/...", "github.com/emersion/go-imap/v2/...", "github.com/slack-go/slack/..."},
		why:    "the panel shows the triage worker through api's plain types (the worker implements its Mail interface); a page must not link the mail client and chat SDKs",
	},
	{
		pkgs:   []string{"gpuhost/api/...", "gpuhost/frontdoor/...", "gpuhost/mcp/...", "gpuhost/triage/...", "gpuhost/agent/...", "gpuhost/bench/...", "gpuhost/simulator/...", "gpuhost/units/...", "gpuhost/config/...", "gpuhost/backend/...", "gpuhost/internal/activity"},
		forbid: []string{"gpuhost/nvml/driver", "github.com/NVIDIA/go-nvml/..."},
		why:    "only the packages that open the real driver (appliance and internal/assemble) link go-nvml through gpuhost/nvml/driver; everyone else reads GPU facts as gpuhost/nvml's plain Snapshot",
	},
	{
		pkgs:   []string{"gpuhost/triage/..."},
		forbid: []string{"gpuhost/mcp/connectors/crm", "github.com/jackc/pgx/v5/..."},
		why:    "the triage worker reads the CRM through the MCP tool's answer (crmwire.Result), never through the connector or its PostgreSQL driver",
	},
	{
		pkgs:   []string{"gpuhost/api/...", "gpuhost/config/...", "gpuhost/internal/atomicfile", "gpuhost/internal/pairing", "gpuhost/internal/redactlog", "gpuhost/internal/testkit", "gpuhost/internal/activity", "gpuhost/internal/apishape", "gpuhost/internal/jsonlimit", "gpuhost/internal/membudget"},
		forbid: []string{"gpuhost/appliance/...", "gpuhost/systemd/...", "gpuhost/frontdoor/...", "gpuhost/mcp/...", "gpuhost/triage/...", "gpuhost/agent/...", "gpuhost/bench/...", "github.com/godbus/dbus/v5/...", "github.com/labstack/echo/v4/..."},
		why:    "leaf packages hold what everyone shares and pull in nothing heavy",
	},
}

// godbusAllowed are the only packages that may link godbus: the ones that
// control systemd, internal/assemble and main, and the harness that boots a private systemd.
var godbusAllowed = map[string]bool{
	"gpuhost":                         true,
	"gpuhost/appliance":               true,
	"gpuhost/appliance/appliancetest": true,
	"gpuhost/appliance/procunits":     true,
	"gpuhost/internal/assemble":       true,
	"gpuhost/systemd":                 true,
	"gpuhost/systemd/systemdtest":     true,
}

func matchPkg(pattern, pkg string) bool {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return pkg == base || strings.HasPrefix(pkg, base+"/")
	}
	return pkg == pattern
}

// listDeps maps every package of the module to its transitive non-test
// dependencies, from one `go list` run.
func listDeps(t *testing.T) map[string][]string {
	t.Helper()
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Deps \" \"}}", "./...").Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list ./...: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list ./...: %v", err)
	}
	deps := map[string][]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 {
			deps[f[0]] = f[1:]
		}
	}
	if len(deps) < 20 {
		t.Fatalf("go list found only %d packages; the rules would check nothing", len(deps))
	}
	return deps
}

func TestDependencyRules(t *testing.T) {
	deps := listDeps(t)
	pkgs := make([]string, 0, len(deps))
	for p := range deps {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	for _, r := range depRules {
		checked := 0
		for _, p := range pkgs {
			if !matchesAny(r.pkgs, p) || matchesAny(r.except, p) {
				continue
			}
			checked++
			for _, d := range deps[p] {
				if matchesAny(r.forbid, d) {
					t.Errorf("%s depends on %s: %s", p, d, r.why)
				}
			}
		}
		if checked == 0 {
			t.Errorf("rule %v matches no package of the module (renamed?)", r.pkgs)
		}
	}
	for _, p := range pkgs {
		for _, d := range deps[p] {
			if matchPkg("github.com/godbus/dbus/v5/...", d) && !godbusAllowed[p] {
				t.Errorf("%s links godbus (through its imports); only the packages that control systemd may: %v", p, keys(godbusAllowed))
				break
			}
		}
	}
}

func matchesAny(patterns []string, pkg string) bool {
	for _, pat := range patterns {
		if matchPkg(pat, pkg) {
			return true
		}
	}
	return false
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, path.Clean(k))
	}
	sort.Strings(out)
	return out
}
