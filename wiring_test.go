package main

import (
	"fmt"
	"go/ast"
	"go/constant"
	"go/token"
	"go/types"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"

	"golang.org/x/tools/go/packages"
)

// wiringRule is one "one construction site" rule: the functions (by
// types.Func.FullName, e.g. "gpuhost/appliance.OpenGPU") and the named
// types (composite literals and new(T), e.g. "gpuhost/mcp.Server") that
// build the thing, and where they may be used: a package path, or a
// package path and its top-level function ("gpuhost/internal/assemble.openGPU",
// a method as "pkg.Type.Method"). Test files are not loaded: a test may
// build what it needs.
type wiringRule struct {
	name    string
	funcs   []string
	types   []string
	allowed []string
	why     string
}

var wiringRules = []wiringRule{
	{
		name:    "one daemon assembly",
		funcs:   []string{"gpuhost/appliance.NewBox", "gpuhost/appliance.NewSupervisor", "gpuhost/appliance.OpenUnits", "gpuhost/triage.FromConfig"},
		types:   []string{"gpuhost/appliance.Box", "gpuhost/appliance.Supervisor"},
		allowed: []string{"gpuhost/internal/assemble.OpenCore", "gpuhost/internal/assemble.OpenTriage", "gpuhost/appliance", "gpuhost/appliance/appliancetest", "gpuhost/triage"},
		why:     "the Box (its Supervisors), the unit runner and the triage worker are built in internal/assemble (OpenCore, OpenTriage); appliancetest is the tests' real-Supervisor fixture",
	},
	{
		name:    "one MCP server",
		funcs:   []string{"gpuhost/mcp.NewServer"},
		types:   []string{"gpuhost/mcp.Server"},
		allowed: []string{"gpuhost/internal/assemble.newMCPServer", "gpuhost/mcp.NewServer"},
		why:     "every MCP server (/mcp, `gpuhost mcp`, a triage worker's CRM lookup) gets the declarative connectors, the backend dialer and the session cap from assemble's newMCPServer",
	},
	{
		name:    "one GPU opener",
		funcs:   []string{"gpuhost/appliance.OpenGPU", "gpuhost/nvml/driver.Open", "gpuhost/nvml.NewSim"},
		allowed: []string{"gpuhost/internal/assemble.openGPU", "gpuhost/appliance.OpenGPU", "gpuhost/appliance/appliancetest"},
		why:     "the GPU is opened by appliance.OpenGPU, called only through assemble's openGPU (the core, a triage worker's power reading, bench's GPU facts)",
	},
	{
		name:    "one daemon finder",
		funcs:   []string{"gpuhost/api.NewClient"},
		types:   []string{"gpuhost/api.Client"},
		allowed: []string{"gpuhost.daemonTarget.client", "gpuhost/api.NewClient"},
		why:     "every command finds the daemon by resolveDaemon (--url, $GPUHOST_URL, the config's listen, the default) and its client (daemonTarget.client: $GPUHOST_API_TOKEN, the config's token)",
	},
	{
		name:    "one systemd connection rule",
		funcs:   []string{"gpuhost/systemd.ConnectSystem", "gpuhost/systemd.ConnectPrivate"},
		allowed: []string{"gpuhost/systemd.Connect"},
		why:     "systemd.Connect picks the system bus or systemd.socket's private socket, for the daemon and `gpuhost units install` alike",
	},
	{
		name: "one loopback helper",
		funcs: []string{"(net.IP).IsLoopback", "(net.IP).IsUnspecified",
			"(net/netip.Addr).IsLoopback", "(net/netip.Addr).IsUnspecified"},
		allowed: []string{"gpuhost/internal/loopback"},
		why:     "\"is this loopback\" and \"is this a wildcard\" have one answer each, in internal/loopback (IsHost, DialsLoopback, ListensOnly, IsWildcard, DialHost, IsAddr)",
	},
}

// hostLiterals are the literals a hand-written wildcard or loopback check
// compares with; outside internal/loopback a comparison with one breaks
// the loopback rule. literalChecksAllowed: config's listen check accepts
// "an IP address or localhost" as syntax (it decides nothing about
// loopback; ListensOnly does).
var (
	hostLiterals         = []string{"0.0.0.0", "::", "[::]", "127.0.0.1", "::1", "localhost"}
	literalChecksAllowed = []string{"gpuhost/internal/loopback", "gpuhost/config.Config.validate"}
)

// servedNameRule: the active profile's served name is computed by
// api.ActiveServedName only. A function elsewhere that reads a ServedName
// field and refers to api.PhaseActive computes it a second time (copying
// ServedName into an api.ProfileInfo literal, as the Supervisor's profile
// list does, is not computing it).
const servedNameHome = "gpuhost/api"

// TestOneWiringPlace type-checks every package of the module (no tests)
// and fails on any use of a rule's constructor or composite literal
// outside the places the rule allows, on a hand-written loopback or
// wildcard check beside internal/loopback, and on a second computation
// of the active profile's served name.
func TestOneWiringPlace(t *testing.T) {
	pkgs := loadModule(t, nil)
	for _, f := range checkWiring(pkgs) {
		t.Error(f)
	}
}

// TestOneWiringPlaceCatchesPlants plants, in memory (a go/packages
// overlay), a second construction site for every rule in a package that
// may not build any, and checks that each is reported: a rule that
// cannot fail keeps nothing.
func TestOneWiringPlaceCatchesPlants(t *testing.T) {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	planted := dir + "/bench/benchcmd/zz_planted_wiring.go"
	src := `package benchcmd

import (
	"context"
	"net"

	"gpuhost/api"
	"gpuhost/appliance"
	"gpuhost/config"
	"gpuhost/mcp"
	"gpuhost/systemd"
	"gpuhost/units"
)

func plantedSites(ctx context.Context, cfg *config.Config, st api.State, p *units.Profile, host string) any {
	_, _ = mcp.NewServer(mcp.ServerOptions{})
	_, _, _ = appliance.OpenGPU(cfg)
	_ = api.NewClient("http://127.0.0.1:8080", "")
	_, _ = systemd.ConnectSystem(ctx)
	_ = net.ParseIP(host).IsLoopback()
	if host == "0.0.0.0" {
		return nil
	}
	switch host {
	case "::1":
		return nil
	}
	if st.Phase == api.PhaseActive {
		return p.ServedName
	}
	return &api.Client{}
}
`
	pkgs := loadModule(t, map[string][]byte{planted: []byte(src)})
	found := checkWiring(pkgs)
	want := map[string]int{"one MCP server": 1, "one GPU opener": 1, "one daemon finder": 2,
		"one systemd connection rule": 1, "one loopback helper": 3, "served name": 1}
	for rule, n := range want {
		got := 0
		for _, f := range found {
			if strings.Contains(f, "zz_planted_wiring.go") && strings.Contains(f, "("+rule+")") {
				got++
			}
		}
		if got != n {
			t.Errorf("rule %q: %d planted site(s) reported, want %d; reports:\n%s", rule, got, n, strings.Join(found, "\n"))
		}
	}
}

// loadModule type-checks the module's non-test packages, with overlay
// (file path → contents) applied.
func loadModule(t *testing.T, overlay map[string][]byte) []*packages.Package {
	t.Helper()
	cfg := &packages.Config{
		Mode:    packages.NeedName | packages.NeedFiles | packages.NeedSyntax | packages.NeedTypes | packages.NeedTypesInfo,
		Overlay: overlay,
	}
	pkgs, err := packages.Load(cfg, "./...")
	if err != nil {
		t.Fatalf("load the module's packages: %v", err)
	}
	var errs []string
	packages.Visit(pkgs, nil, func(p *packages.Package) {
		for _, e := range p.Errors {
			errs = append(errs, e.Error())
		}
	})
	if len(errs) > 0 {
		t.Fatalf("the module does not type-check, so the wiring rules cannot be read:\n%s", strings.Join(errs, "\n"))
	}
	if len(pkgs) < 20 {
		t.Fatalf("only %d packages loaded; the rules would check nothing", len(pkgs))
	}
	return pkgs
}

// checkWiring returns one line per use that breaks a rule, sorted.
func checkWiring(pkgs []*packages.Package) []string {
	var out []string
	for _, p := range pkgs {
		for _, f := range p.Syntax {
			for _, d := range f.Decls {
				out = append(out, checkDecl(p, d)...)
			}
		}
	}
	sort.Strings(out)
	return out
}

// checkDecl checks one top-level declaration of p.
func checkDecl(p *packages.Package, d ast.Decl) []string {
	site := p.PkgPath + "." + declName(d)
	var out []string
	report := func(n ast.Node, rule, what, why string) {
		pos := p.Fset.Position(n.Pos())
		out = append(out, fmt.Sprintf("%s:%d: %s uses %s (%s): %s", pos.Filename, pos.Line, site, what, rule, why))
	}
	ast.Inspect(d, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.Ident:
			if fn, ok := p.TypesInfo.Uses[n].(*types.Func); ok {
				for _, r := range wiringRules {
					if slices.Contains(r.funcs, fn.FullName()) && !allowedSite(r.allowed, p.PkgPath, site) {
						report(n, r.name, fn.FullName(), r.why)
					}
				}
			}
		case *ast.CompositeLit:
			checkTypeUse(p, n, p.TypesInfo.TypeOf(n), site, report)
		case *ast.CallExpr:
			if id, ok := n.Fun.(*ast.Ident); ok && id.Name == "new" && len(n.Args) == 1 {
				if _, isBuiltin := p.TypesInfo.Uses[id].(*types.Builtin); isBuiltin {
					checkTypeUse(p, n, p.TypesInfo.TypeOf(n.Args[0]), site, report)
				}
			}
		case *ast.BinaryExpr:
			if n.Op == token.EQL || n.Op == token.NEQ {
				checkHostLiterals(p, site, report, n.X, n.Y)
			}
		case *ast.SwitchStmt:
			if n.Tag != nil {
				for _, c := range n.Body.List {
					checkHostLiterals(p, site, report, c.(*ast.CaseClause).List...)
				}
			}
		}
		return true
	})
	if fd, ok := d.(*ast.FuncDecl); ok && p.PkgPath != servedNameHome {
		out = append(out, checkServedName(p, fd.Body, site)...)
	}
	return out
}

// checkHostLiterals reports each of exprs (the sides of a comparison, a
// switch's cases) that is a host literal, outside the allowed sites.
func checkHostLiterals(p *packages.Package, site string, report func(ast.Node, string, string, string), exprs ...ast.Expr) {
	if allowedSite(literalChecksAllowed, p.PkgPath, site) {
		return
	}
	for _, e := range exprs {
		if v := p.TypesInfo.Types[e].Value; v != nil && v.Kind() == constant.String && slices.Contains(hostLiterals, constant.StringVal(v)) {
			report(e, "one loopback helper", "a hand-written host check (== "+v.ExactString()+")",
				"use internal/loopback (IsWildcard, DialHost, IsHost, DialsLoopback, ListensOnly)")
		}
	}
}

// checkTypeUse reports a composite literal or new(T) of a rule's type.
func checkTypeUse(p *packages.Package, n ast.Node, typ types.Type, site string, report func(ast.Node, string, string, string)) {
	if typ == nil {
		return
	}
	if ptr, ok := typ.(*types.Pointer); ok {
		typ = ptr.Elem()
	}
	named, ok := typ.(*types.Named)
	if !ok || named.Obj().Pkg() == nil {
		return
	}
	full := named.Obj().Pkg().Path() + "." + named.Obj().Name()
	for _, r := range wiringRules {
		if slices.Contains(r.types, full) && !allowedSite(r.allowed, p.PkgPath, site) {
			report(n, r.name, "a "+full+" literal", r.why)
		}
	}
}

// checkServedName reports each function body or literal (each on its
// own) that refers to api.PhaseActive and reads the ServedName of a
// profile (units.Profile, api.ProfileInfo) other than to copy it into a
// composite literal.
func checkServedName(p *packages.Package, body *ast.BlockStmt, site string) []string {
	if body == nil {
		return nil
	}
	var out []string
	var walk func(n ast.Node)
	// funcLits walks the function literals under n (a composite literal's
	// values may hold one) on their own.
	funcLits := func(n ast.Node) {
		ast.Inspect(n, func(m ast.Node) bool {
			if fl, ok := m.(*ast.FuncLit); ok {
				walk(fl)
				return false
			}
			return true
		})
	}
	walk = func(root ast.Node) {
		served, active := token.NoPos, false
		ast.Inspect(root, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncLit:
				if n != root {
					walk(n)
					return false
				}
			case *ast.CompositeLit:
				funcLits(n)
				return false
			case *ast.SelectorExpr:
				if n.Sel.Name == "ServedName" && isProfileField(p, n) && served == token.NoPos {
					served = n.Pos()
				}
			case *ast.Ident:
				if c, ok := p.TypesInfo.Uses[n].(*types.Const); ok && c.Pkg() != nil && c.Pkg().Path() == "gpuhost/api" && c.Name() == "PhaseActive" {
					active = true
				}
			}
			return true
		})
		if served != token.NoPos && active {
			pos := p.Fset.Position(served)
			out = append(out, fmt.Sprintf("%s:%d: %s computes the active profile's served name itself (served name): api.ActiveServedName (or api.Status.ActiveServedName) is the one rule", pos.Filename, pos.Line, site))
		}
	}
	walk(body)
	return out
}

// isProfileField reports whether sel reads a field of a profile type.
func isProfileField(p *packages.Package, sel *ast.SelectorExpr) bool {
	s := p.TypesInfo.Selections[sel]
	if s == nil || s.Kind() != types.FieldVal {
		return false
	}
	t := s.Recv()
	if ptr, ok := t.(*types.Pointer); ok {
		t = ptr.Elem()
	}
	name := t.String()
	return name == "gpuhost/units.Profile" || name == "gpuhost/api.ProfileInfo"
}

// declName is a top-level declaration's name: "Func", "Type.Method", or
// "" for var, const, type and import blocks.
func declName(d ast.Decl) string {
	fd, ok := d.(*ast.FuncDecl)
	if !ok {
		return ""
	}
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	t := fd.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if ix, ok := t.(*ast.IndexExpr); ok {
		t = ix.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}

// allowedSite reports whether pkg's declaration site (pkg.Func) may use a
// rule's constructor: allowed names its package or that very function.
func allowedSite(allowed []string, pkg, site string) bool {
	return slices.Contains(allowed, pkg) || slices.Contains(allowed, site)
}
