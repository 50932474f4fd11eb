package api

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The event kinds, statuses and Detail keys are written in one place, this
// package. A reader elsewhere that matched a bare string would keep
// compiling when a kind is renamed and quietly stop matching, so the guard
// below scans every non-test Go file of the module outside api for:
//
//   - x.Kind or x.Status compared (==, !=, switch case) with a string
//     literal that is an event kind or status, x.Step with a step name;
//   - an api.Event literal whose Kind or Status is a string literal;
//   - x.Detail["key"] with a string literal that is one of DetailKeys.
//
// It looks at syntax, not types: a comparison of some other Kind field
// with an unrelated string ("syntax", "maildir") passes, and so would a
// brand-new kind written as a literal in a comparison; the api.Event
// literal rule catches that one where it is emitted.

// eventGuardFinding is one place that matches events by a bare string.
type eventGuardFinding struct {
	pos  token.Position
	what string
}

// eventGuardSets are the strings the guard refuses as literals.
type eventGuardSets struct {
	kindOrStatus map[string]bool
	step         map[string]bool
	detail       map[string]bool
}

func newEventGuardSets() eventGuardSets {
	s := eventGuardSets{kindOrStatus: map[string]bool{}, step: map[string]bool{StepRollback: true}, detail: map[string]bool{}}
	for _, st := range Steps() {
		s.step[st] = true
	}
	for _, k := range EventKinds() {
		s.kindOrStatus[string(k)] = true
	}
	for _, st := range EventStatuses() {
		s.kindOrStatus[string(st)] = true
	}
	for _, d := range DetailKeys() {
		s.detail[d] = true
	}
	return s
}

// scanEventLiterals reports the places in f that match events by strings.
func scanEventLiterals(fset *token.FileSet, f *ast.File, sets eventGuardSets) []eventGuardFinding {
	var out []eventGuardFinding
	add := func(n ast.Node, what string) {
		out = append(out, eventGuardFinding{fset.Position(n.Pos()), what})
	}
	field := func(e ast.Expr) string {
		if s, ok := e.(*ast.SelectorExpr); ok && (s.Sel.Name == "Kind" || s.Sel.Name == "Status" || s.Sel.Name == "Step") {
			return s.Sel.Name
		}
		return ""
	}
	refused := func(name, v string) bool {
		if name == "Step" {
			return sets.step[v]
		}
		return sets.kindOrStatus[v]
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.BinaryExpr:
			if n.Op != token.EQL && n.Op != token.NEQ {
				break
			}
			for _, pair := range [][2]ast.Expr{{n.X, n.Y}, {n.Y, n.X}} {
				if name := field(pair[0]); name != "" {
					if v, ok := stringLit(pair[1]); ok && refused(name, v) {
						add(n, name+" compared with "+strconv.Quote(v))
					}
				}
			}
		case *ast.SwitchStmt:
			name := field(n.Tag)
			if name == "" {
				break
			}
			for _, c := range n.Body.List {
				for _, e := range c.(*ast.CaseClause).List {
					if v, ok := stringLit(e); ok && refused(name, v) {
						add(e, "switch on "+name+" with case "+strconv.Quote(v))
					}
				}
			}
		case *ast.CompositeLit:
			if t, ok := n.Type.(*ast.SelectorExpr); !ok || t.Sel.Name != "Event" || !isIdent(t.X, "api") {
				break
			}
			for _, el := range n.Elts {
				kv, ok := el.(*ast.KeyValueExpr)
				if !ok || !(isIdent(kv.Key, "Kind") || isIdent(kv.Key, "Status")) {
					continue
				}
				if v, ok := stringLit(kv.Value); ok {
					add(kv, "api.Event with "+kv.Key.(*ast.Ident).Name+" "+strconv.Quote(v))
				}
			}
		case *ast.IndexExpr:
			if s, ok := n.X.(*ast.SelectorExpr); ok && s.Sel.Name == "Detail" {
				if v, ok := stringLit(n.Index); ok && sets.detail[v] {
					add(n, "Detail["+strconv.Quote(v)+"]")
				}
			}
		}
		return true
	})
	return out
}

func stringLit(e ast.Expr) (string, bool) {
	b, ok := e.(*ast.BasicLit)
	if !ok || b.Kind != token.STRING {
		return "", false
	}
	v, err := strconv.Unquote(b.Value)
	return v, err == nil
}

func isIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}

// TestEventsMatchedByConstants scans the module (from the directory above
// this package) and fails for every place outside api that matches an
// event's kind, status or Detail key by a bare string.
func TestEventsMatchedByConstants(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	self, _ := filepath.Abs(".")
	sets := newEventGuardSets()
	fset := token.NewFileSet()
	files := 0
	var found []eventGuardFinding
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (path == self || d.Name() == "testdata" || d.Name() == "vendor" || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		found = append(found, scanEventLiterals(fset, f, sets)...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("scanned %d Go files under %s; the module has hundreds: the walk is broken", files, root)
	}
	for _, f := range found {
		rel, _ := filepath.Rel(root, f.pos.Filename)
		t.Errorf("%s:%d: %s: use the constants of gpuhost/api (EventKind, EventStatus, Detail…)", rel, f.pos.Line, f.what)
	}
}

// TestEventGuardFinds checks that the guard catches each form it claims
// to, and passes the forms that are fine.
func TestEventGuardFinds(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want int
	}{
		{"kind compared", `if e.Kind == "crash" {}`, 1},
		{"literal on the left", `if "switch" != ev.Kind {}`, 1},
		{"status compared", `ok := e.Status == "failed"`, 1},
		{"switch cases", "switch e.Kind {\ncase \"step\", \"switch\":\ncase \"other\":\n}", 2},
		{"switch on status", "switch e.Status {\ncase \"done\":\n}", 1},
		{"emitted with literals", `x := api.Event{Kind: "brand_new", Status: "info"}`, 2},
		{"detail key", `u, _ := e.Detail["unit"].(string)`, 1},
		{"step compared", `if e.Step == "wake" || e.Step != "start" {}`, 2},
		{"other steps are fine", `if st.Step == "deactivating" || st.Step == "" {}`, 0},
		{"constants are fine", `if e.Kind == api.EventCrash && e.Status == api.StatusDone {}`, 0},
		{"other kinds are fine", `if le.Kind != "syntax" {}`, 0},
		{"other detail keys are fine", `x := e.Detail["models"]`, 0},
		{"other composite literals are fine", `x := usage{Kind: "classification"}`, 0},
	}
	sets := newEventGuardSets()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, "x.go", "package x\nfunc f() {\n"+tt.src+"\n}\n", 0)
			if err != nil {
				t.Fatal(err)
			}
			if got := scanEventLiterals(fset, f, sets); len(got) != tt.want {
				t.Errorf("found %d, want %d: %v", len(got), tt.want, got)
			}
		})
	}
}

// TestEventListsComplete checks that the lists name each constant once, so
// that the guard and the panel's test know every kind (the untyped
// constants, Detail keys and steps, count as one list).
func TestEventListsComplete(t *testing.T) {
	src, err := os.ReadFile("events.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "events.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	declared := map[string][]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			typ := "detail"
			if id, ok := vs.Type.(*ast.Ident); ok {
				typ = id.Name
			}
			for _, v := range vs.Values {
				if lit, ok := stringLit(v); ok {
					declared[typ] = append(declared[typ], lit)
				}
			}
		}
	}
	var kinds, statuses []string
	for _, k := range EventKinds() {
		kinds = append(kinds, string(k))
	}
	for _, s := range EventStatuses() {
		statuses = append(statuses, string(s))
	}
	for _, c := range []struct {
		typ  string
		list []string
	}{{"EventKind", kinds}, {"EventStatus", statuses}, {"detail", append(DetailKeys(), append(Steps(), StepRollback)...)}} {
		want, got := slices.Sorted(slices.Values(declared[c.typ])), slices.Sorted(slices.Values(c.list))
		if !slices.Equal(want, got) || len(slices.Compact(slices.Clone(got))) != len(got) {
			t.Errorf("%s: constants %v, list %v", c.typ, want, got)
		}
	}
}
