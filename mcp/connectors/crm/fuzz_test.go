package crm

import (
	"gpuhost/mcp/connector"
	"strings"
	"testing"
)

// FuzzBindArgs: whatever a model sends as a parameter value, binding never
// panics, and a value it accepts is bound unchanged (strings) or typed.
func FuzzBindArgs(f *testing.F) {
	for _, s := range []string{"acme", "'; DROP TABLE users; --", "2026-02-10", "", "\x00", "9999-99-99", strings.Repeat("x", 300)} {
		f.Add(s, 1.0)
	}
	f.Add("x", 1.5)
	f.Add("x", 1e300)
	tpl := Template{Name: "t", Params: []Param{
		{Name: "s", Type: TypeString, Required: true},
		{Name: "n", Type: TypeInt},
		{Name: "d", Type: TypeDate},
	}}
	f.Fuzz(func(t *testing.T, s string, n float64) {
		vals, err := BindArgs(tpl, connector.Args{"s": s, "n": n})
		if err == nil {
			if vals[0] != s {
				t.Fatalf("string bound as %#v, want %q unchanged", vals[0], s)
			}
			if _, ok := vals[1].(int64); !ok {
				t.Fatalf("int bound as %T", vals[1])
			}
		}
		_, _ = BindArgs(tpl, connector.Args{"s": "x", "d": s})
	})
}

// FuzzTemplateValidate: operator-written SQL and param lists never make
// validation panic, and an accepted template uses exactly $1..$N.
func FuzzTemplateValidate(f *testing.F) {
	f.Add("SELECT $1, $2", 2)
	f.Add("SELECT $99999999999999999999", 1)
	f.Add("SELECT '$1'", 1)
	f.Add("", 0)
	f.Fuzz(func(t *testing.T, sql string, nParams int) {
		if nParams < 0 || nParams > 20 {
			return
		}
		tpl := Template{Name: "t", Description: "d", SQL: sql}
		for i := 0; i < nParams; i++ {
			tpl.Params = append(tpl.Params, Param{Name: "p" + string(rune('a'+i)), Type: TypeString})
		}
		if err := tpl.validate(); err == nil {
			used := Placeholders(sql)
			if len(used) != nParams {
				t.Fatalf("accepted %q with %d params but placeholders %v", sql, nParams, used)
			}
		}
	})
}
