package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"strings"
	"testing"
)

// TestPollResultsUsed: testkit.Poll returns whether its condition came
// true within the budget; a test that drops that result passes when the
// wait timed out. Every call must be used (testkit.Eventually fails the
// test itself and may stand alone).
func TestPollResultsUsed(t *testing.T) {
	out, err := exec.Command("git", "ls-files", "*_test.go").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v (the rule needs the checkout's file list; CI always has git)", err)
	}
	checked := 0
	for _, path := range strings.Fields(string(out)) {
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatalf("parse %s: %v", path, err)
		}
		checked++
		for _, at := range discardedPolls(f) {
			t.Errorf("%s: the result of testkit.Poll is dropped (use it, or testkit.Eventually)", fset.Position(at))
		}
	}
	if checked == 0 {
		t.Fatal("no test files checked")
	}
}

// discardedPolls finds testkit.Poll calls whose result is dropped: a call
// standing alone as a statement, or assigned to _.
func discardedPolls(f *ast.File) []token.Pos {
	isPoll := func(e ast.Expr) bool {
		call, ok := e.(*ast.CallExpr)
		if !ok {
			return false
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || sel.Sel.Name != "Poll" {
			return false
		}
		x, ok := sel.X.(*ast.Ident)
		return ok && x.Name == "testkit"
	}
	var found []token.Pos
	ast.Inspect(f, func(n ast.Node) bool {
		switch s := n.(type) {
		case *ast.ExprStmt:
			if isPoll(s.X) {
				found = append(found, s.Pos())
			}
		case *ast.AssignStmt:
			for i, r := range s.Rhs {
				if id, ok := s.Lhs[min(i, len(s.Lhs)-1)].(*ast.Ident); ok && id.Name == "_" && isPoll(r) {
					found = append(found, s.Pos())
				}
			}
		}
		return true
	})
	return found
}

// TestDiscardedPollsFound: the rule finds each way of dropping the result
// and none of the ways of using it.
func TestDiscardedPollsFound(t *testing.T) {
	src := `package x
func f() {
	testkit.Poll(1, nil)
	_ = testkit.Poll(1, nil)
	if !testkit.Poll(1, nil) {}
	ok := testkit.Poll(1, nil)
	_ = ok
	testkit.Eventually(t, 1, nil, "")
}`
	f, err := parser.ParseFile(token.NewFileSet(), "x.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(discardedPolls(f)); got != 2 {
		t.Fatalf("found %d dropped Poll results, want 2", got)
	}
}
