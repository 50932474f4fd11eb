package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"strings"
	"testing"
)

// maxFuncLines is the longest a non-test function may be, counted from its
// func line to its closing brace: longer ones are read in pieces and
// changed by accident. A function that must be longer is split into named
// steps instead.
const maxFuncLines = 100

// TestFunctionLength keeps every non-test function (and function literal)
// of the repository within maxFuncLines.
func TestFunctionLength(t *testing.T) {
	out, err := exec.Command("git", "ls-files", "*.go").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v (the length rule needs the checkout's file list; CI always has git)", err)
	}
	files := 0
	for _, path := range strings.Fields(string(out)) {
		if strings.HasSuffix(path, "_test.go") || strings.Contains(path, "/testdata/") {
			continue
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatalf("parse %s: %v", path, err)
		}
		files++
		ast.Inspect(f, func(n ast.Node) bool {
			var body *ast.BlockStmt
			name := "a function literal"
			switch d := n.(type) {
			case *ast.FuncDecl:
				body, name = d.Body, d.Name.Name
			case *ast.FuncLit:
				body = d.Body
			}
			if body != nil {
				lines := fset.Position(body.End()).Line - fset.Position(n.Pos()).Line + 1
				if lines > maxFuncLines {
					t.Errorf("%s:%d: %s is %d lines (at most %d): split it into named steps", path, fset.Position(n.Pos()).Line, name, lines, maxFuncLines)
				}
			}
			return true
		})
	}
	if files < 100 {
		t.Fatalf("checked only %d files; the walk is broken", files)
	}
}
