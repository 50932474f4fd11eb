package calc

import (
	"context"
	"errors"
	"gpuhost/mcp/connector"
	"math"
	"strings"
	"testing"
	"time"
)

func TestEvaluate(t *testing.T) {
	tests := []struct {
		expr string
		want float64
	}{
		{"1 + 1", 2},
		{"2 + 3 * 4", 14},
		{"(2 + 3) * 4", 20},
		{"10 - 4 - 3", 3},
		{"100 / 10 / 5", 2},
		{"2 ^ 3 ^ 2", 512}, // right-associative
		{"(2 ^ 3) ^ 2", 64},
		{"-2 ^ 2", -4}, // ^ binds tighter than unary minus
		{"(-2) ^ 2", 4},
		{"2 ^ -1", 0.5},
		{"--3", 3},
		{"+3", 3},
		{"-(1 + 2) * 3", -9},
		{"3 × 4 ÷ 2 − 1", 5},
		{"3·4", 12},
		{"1.5 + .5", 2},
		{"1e3 + 2.5E-1", 1000.25},
		{"2e", 0}, // marker: error case handled below
		{"sqrt(16)", 4},
		{"abs(-3.5)", 3.5},
		{"round(2.5)", 3},
		{"round(-2.5)", -3},
		{"round(100 / 7, 2)", 14.29},
		{"floor(-1.5)", -2},
		{"ceil(1.2)", 2},
		{"min(3, 1, 2)", 1},
		{"max(3, 1, 2)", 3},
		{"max(7)", 7},
		{"ln(e)", 1},
		{"log10(1000)", 3},
		{"exp(0)", 1},
		{"2 * pi", 2 * math.Pi},
		{"PI", math.Pi},
		{"SQRT(4)", 2},
		{"  7\t", 7},
		{"0 * -1", 0},
		{"sqrt(2) ^ 2", 2.0000000000000004},
	}
	for _, tt := range tests {
		if tt.expr == "2e" {
			continue
		}
		t.Run(tt.expr, func(t *testing.T) {
			got, err := Evaluate(tt.expr)
			if err != nil {
				t.Fatalf("Evaluate(%q): %v", tt.expr, err)
			}
			if math.Abs(got-tt.want) > 1e-12*math.Max(1, math.Abs(tt.want)) {
				t.Fatalf("Evaluate(%q) = %v, want %v", tt.expr, got, tt.want)
			}
			if math.Signbit(got) && got == 0 {
				t.Fatalf("Evaluate(%q) = -0, want 0", tt.expr)
			}
		})
	}
}

func TestEvaluateErrors(t *testing.T) {
	tests := []struct {
		expr    string
		wantPos int
		want    string
	}{
		{"1 + 1; process.exit()", 6, "unexpected ';' at 6"},
		{"process.exit()", 1, "unknown name 'process' at 1"},
		{"require('fs')", 1, "unknown name 'require'"},
		{"1 / 0", 3, "division by zero at 3"},
		{"1 / (2 - 2)", 3, "division by zero"},
		{"sqrt(-1)", 1, "sqrt of a negative number at 1"},
		{"ln(0)", 1, "ln of a number that is not positive"},
		{"log10(-5)", 1, "log10"},
		{"(-8) ^ 0.5", 6, "gives no real number"},
		{"10 ^ 400", 4, "too large result"},
		{"0 ^ -1", 3, "'^' gives an infinite"},
		{"exp(1000)", 1, "exp gives an infinite or too large result"},
		{"1e999", 1, "out of range"},
		{"", 0, "expression is empty"},
		{"   ", 0, "expression is empty"},
		{"1 +", 4, "expression ends where a number was expected"},
		{"(1 + 2", 7, "expected ')' to close the '(' at 1"},
		{"1 + 2)", 6, "unexpected ')' at 6"},
		{"2 3", 3, "unexpected '3' at 3"},
		{"2e", 2, "unexpected 'e' at 2"},
		{"2 pi", 3, "unexpected 'pi'"},
		{"sqrt 4", 6, "expected '(' after function sqrt"},
		{"sqrt()", 1, "sqrt takes exactly 1 argument, got 0"},
		{"sqrt(1, 2)", 1, "sqrt takes exactly 1 argument, got 2"},
		{"min()", 1, "min takes at least 1 argument(s), got 0"},
		{"round(1, 2, 3)", 1, "round takes 1 to 2 arguments"},
		{"round(1, 0.5)", 1, "whole number from 0 to 15"},
		{"max(1; 2)", 6, "expected ',' or ')' in the call of max, found ';' at 6"},
		{"max(1 2)", 7, "expected ',' or ')' in the call of max"},
		{"x = 1", 1, "unknown name 'x'"},
		{"1 % 2", 3, "unexpected '%'"},
		{"..5", 1, "unexpected '.'"},
		{"1.2.3", 4, "unexpected '.3'"},
		{"1 & 2", 3, "unexpected '&'"},
		{"a\x00", 1, "unknown name 'a'"},
		{"1\x00", 2, "unexpected U+0000 at 2"},
		{"1 = 1", 3, "unexpected '=' at 3"},
		{"1 + 1 // comment", 8, "unexpected '/' where a number was expected at 8"},
		{"\xff", 0, "not valid UTF-8"},
		{"2 ** 3", 4, "unexpected '*' where a number was expected"},
		{"é", 1, "unexpected 'é'"},
		{strings.Repeat("1+", 600) + "1", 0, "at most 1000 are accepted"},
		{strings.Repeat("(", 150) + "1" + strings.Repeat(")", 150), 101, "nested more than 100 levels deep"},
		{strings.Repeat("-", 150) + "1", 101, "nested more than 100"},
		{strings.Repeat("2^", 150) + "1", 201, "nested more than 100"},
	}
	for _, tt := range tests {
		name := tt.expr
		if len(name) > 40 {
			name = name[:40]
		}
		t.Run(name, func(t *testing.T) {
			v, err := Evaluate(tt.expr)
			if err == nil {
				t.Fatalf("Evaluate(%q) = %v, want error containing %q", tt.expr, v, tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Evaluate(%q) error = %q, want it to contain %q", tt.expr, err, tt.want)
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %T is not *calc.Error", err)
			}
			if e.Pos != tt.wantPos {
				t.Fatalf("Evaluate(%q) error position = %d, want %d (%v)", tt.expr, e.Pos, tt.wantPos, err)
			}
		})
	}
}

func TestSyntaxErrorsSayWhatIsAllowed(t *testing.T) {
	_, err := Evaluate("1 + 1; process.exit()")
	if err == nil || !strings.Contains(err.Error(), "sqrt abs round") {
		t.Fatalf("error %v does not list what is allowed", err)
	}
}

func TestBuildAndHandler(t *testing.T) {
	tools, err := (&builder{}).Build(connector.Env{Name: "calc"})
	if err != nil {
		t.Fatal(err)
	}
	if len(tools) != 1 {
		t.Fatalf("got %d tools, want 1", len(tools))
	}
	tool := tools[0]
	if tool.Def.Name != "calc_evaluate" {
		t.Fatalf("tool name %q", tool.Def.Name)
	}
	a := tool.Def.Annotations
	if a.ReadOnlyHint == nil || !*a.ReadOnlyHint || a.DestructiveHint == nil || *a.DestructiveHint {
		t.Fatalf("annotations %+v: want readOnly true, destructive false", a)
	}
	if len(tool.Def.InputSchema.Required) != 1 || tool.Def.InputSchema.Required[0] != "expression" {
		t.Fatalf("required = %v", tool.Def.InputSchema.Required)
	}
	out, err := tool.Handler(context.Background(), connector.Args{"expression": "round(10 / 3, 2)"})
	if err != nil {
		t.Fatal(err)
	}
	r, ok := out.(Result)
	if !ok || r.Result != 3.33 || r.Text != "3.33" || r.Expression != "round(10 / 3, 2)" {
		t.Fatalf("result %#v", out)
	}
	if _, err := tool.Handler(context.Background(), connector.Args{"expression": "1 + 1; process.exit()"}); err == nil ||
		!strings.Contains(err.Error(), "cannot evaluate the expression: unexpected ';' at 6") {
		t.Fatalf("handler error = %v", err)
	}
}

func TestBuildRejectsUnknownKeys(t *testing.T) {
	env := connector.Env{Name: "calc", Config: yamlNode(t, "precision: 3\n")}
	if _, err := (&builder{}).Build(env); err == nil || !strings.Contains(err.Error(), "precision") {
		t.Fatalf("Build with unknown key: err = %v", err)
	}
}

// FuzzEvaluate checks the parser on arbitrary input: it never panics,
// returns promptly, and any success is a finite number.
func FuzzEvaluate(f *testing.F) {
	for _, s := range []string{"1 + 1", "1 + 1; process.exit()", "-2^-2^-2", "round(1.005, 2)", "max(1,2,3)*min(4)",
		"((((1))))", "sqrt(16) ÷ 2 × 3 − 1", "1e308*10", ".5e-3", "pi^e", "ln(", ")(", "2e+", "\xff\xfe", "1,2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		start := time.Now()
		v, err := Evaluate(s)
		if d := time.Since(start); d > time.Second {
			t.Fatalf("Evaluate(%q) took %v", s, d)
		}
		if err == nil && (math.IsNaN(v) || math.IsInf(v, 0)) {
			t.Fatalf("Evaluate(%q) = %v without error", s, v)
		}
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Evaluate(%q) error %T is not *calc.Error", s, err)
			}
		}
	})
}
