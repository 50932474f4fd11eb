package crm

import (
	"encoding/json"
	"gpuhost/mcp/connector"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestBuildRejectsBadConfig: every config mistake is refused at Build with
// the key named, instead of surfacing at the first call.
func TestBuildRejectsBadConfig(t *testing.T) {
	tests := []struct {
		name, yaml, want string
	}{
		{"no dsn_env", "max_rows: 5\n", "dsn_env is required"},
		{"dsn in config", "dsn_env: postgres://u:p@h/db\n", "not an environment variable name"},
		{"unknown key", "dsn_env: X\ndsn: postgres://x\n", "dsn"},
		{"unknown template key", "dsn_env: X\ntemplates:\n  - {name: a, description: d, sql: SELECT 1, query: x}\n", "query"},
		{"negative max_rows", "dsn_env: X\nmax_rows: -1\n", "max_rows -1"},
		{"huge max_rows", "dsn_env: X\nmax_rows: 1000000\n", "max_rows 1000000"},
		{"huge timeout", "dsn_env: X\nstatement_timeout: 1h\n", "statement_timeout 1h0m0s"},
		{"bad timeout", "dsn_env: X\nstatement_timeout: soon\n", "`soon` into time.Duration"},
		{"empty templates", "dsn_env: X\ntemplates: []\n", "templates is empty"},
		{"bad name", "dsn_env: X\ntemplates:\n  - {name: Find-Users, description: d, sql: SELECT 1}\n", "templates[0]: name \"Find-Users\""},
		{"no sql", "dsn_env: X\ntemplates:\n  - {name: a, description: d}\n", "sql is empty"},
		{"no description", "dsn_env: X\ntemplates:\n  - {name: a, sql: SELECT 1}\n", "description is empty"},
		{"duplicate template", "dsn_env: X\ntemplates:\n  - {name: a, description: d, sql: SELECT 1}\n  - {name: a, description: d, sql: SELECT 2}\n", "templates[1]: duplicate name \"a\""},
		{"bad param type", "dsn_env: X\ntemplates:\n  - {name: a, description: d, sql: SELECT $1, params: [{name: p, type: float}]}\n", "type \"float\""},
		{"unused param", "dsn_env: X\ntemplates:\n  - {name: a, description: d, sql: SELECT $1, params: [{name: p, type: int}, {name: q, type: int}]}\n", "param \"q\" is never used"},
		{"undeclared placeholder", "dsn_env: X\ntemplates:\n  - {name: a, description: d, sql: SELECT $1 + $2, params: [{name: p, type: int}]}\n", "uses $2"},
		{"placeholder zero", "dsn_env: X\ntemplates:\n  - {name: a, description: d, sql: SELECT $0}\n", "uses $0"},
		{"duplicate param", "dsn_env: X\ntemplates:\n  - {name: a, description: d, sql: SELECT $1 + $2, params: [{name: p, type: int}, {name: p, type: int}]}\n", "duplicate name \"p\""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := buildTools(t, tc.yaml, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), "mcp.connectors.crm") {
				t.Errorf("err = %v, want it to start with the config path", err)
			}
		})
	}
}

// TestDefaults: an empty-but-present section with only dsn_env gets the
// documented defaults and the four default tools.
func TestDefaults(t *testing.T) {
	cfg := Config{DSNEnv: "X"}
	if err := cfg.normalize(); err != nil {
		t.Fatal(err)
	}
	if cfg.StatementTimeout != 5*time.Second || cfg.MaxRows != 200 || len(cfg.Templates) != 4 {
		t.Fatalf("defaults = %s %d %d templates", cfg.StatementTimeout, cfg.MaxRows, len(cfg.Templates))
	}
	tools := mustBuild(t, "dsn_env: X\n", nil)
	var names []string
	for n := range tools {
		names = append(names, n)
	}
	slices.Sort(names)
	want := []string{"crm_customer_history", "crm_search_invoices", "crm_search_projects", "crm_search_users"}
	if !slices.Equal(names, want) {
		t.Fatalf("tools = %v, want %v", names, want)
	}
}

// TestToolDefs: every tool is annotated read-only and non-destructive, and
// its parameters are typed, capped JSON Schema properties.
func TestToolDefs(t *testing.T) {
	tools := mustBuild(t, `dsn_env: X
max_rows: 7
templates:
  - name: by_day
    description: Tickets opened on a day.
    sql: SELECT * FROM tickets WHERE opened_on = $1 AND customer_id = $2 AND subject ILIKE $3
    params:
      - {name: day, type: date, required: true, description: The day.}
      - {name: customer, type: int, required: true}
      - {name: subject, type: string}
`, nil)
	for name, tl := range tools {
		a := tl.Def.Annotations
		if a.ReadOnlyHint == nil || !*a.ReadOnlyHint || a.DestructiveHint == nil || *a.DestructiveHint {
			t.Errorf("%s: annotations %+v, want readOnly true, destructive false", name, a)
		}
		if tl.Targets != nil {
			t.Errorf("%s: unexpected targets", name)
		}
	}
	def := tools["crm_by_day"].Def
	if !strings.Contains(def.Description, "Tickets opened on a day.") || !strings.Contains(def.Description, "at most 7 rows") {
		t.Errorf("description = %q", def.Description)
	}
	b, err := json.Marshal(def.InputSchema)
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties map[string]map[string]any `json:"properties"`
		Required   []string                  `json:"required"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	if schema.Properties["day"]["type"] != "string" || schema.Properties["day"]["pattern"] == nil {
		t.Errorf("day = %v, want a patterned string", schema.Properties["day"])
	}
	if schema.Properties["customer"]["type"] != "integer" {
		t.Errorf("customer = %v, want integer", schema.Properties["customer"])
	}
	if schema.Properties["subject"]["type"] != "string" || schema.Properties["subject"]["maxLength"] != float64(MaxStringLen) {
		t.Errorf("subject = %v, want string with maxLength %d", schema.Properties["subject"], MaxStringLen)
	}
	slices.Sort(schema.Required)
	if !slices.Equal(schema.Required, []string{"customer", "day"}) {
		t.Errorf("required = %v", schema.Required)
	}
}

// TestBindArgs: arguments become typed bound values in parameter order;
// anything else is a clear error before the database is touched.
func TestBindArgs(t *testing.T) {
	tpl := Template{Name: "t", Params: []Param{
		{Name: "q", Type: TypeString, Required: true},
		{Name: "n", Type: TypeInt},
		{Name: "d", Type: TypeDate},
	}}
	day := time.Date(2026, 2, 10, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name    string
		args    connector.Args
		want    []any
		wantErr string
	}{
		{"all", connector.Args{"q": "x", "n": float64(42), "d": "2026-02-10"}, []any{"x", int64(42), day}, ""},
		{"optional omitted", connector.Args{"q": "x"}, []any{"x", nil, nil}, ""},
		{"optional null", connector.Args{"q": "x", "n": nil}, []any{"x", nil, nil}, ""},
		{"sql is data", connector.Args{"q": "'; DROP TABLE users; --"}, []any{"'; DROP TABLE users; --", nil, nil}, ""},
		{"missing required", connector.Args{"n": float64(1)}, nil, `parameter "q" is required`},
		{"wrong type string", connector.Args{"q": float64(1)}, nil, `"q" must be a string`},
		{"too long", connector.Args{"q": strings.Repeat("é", MaxStringLen+1)}, nil, "longer than 200"},
		{"NUL", connector.Args{"q": "a\x00b"}, nil, "NUL"},
		{"fraction", connector.Args{"q": "x", "n": 1.5}, nil, "whole number"},
		{"huge", connector.Args{"q": "x", "n": math.Inf(1)}, nil, "whole number"},
		{"int as string", connector.Args{"q": "x", "n": "7"}, nil, "must be an integer"},
		{"bad date", connector.Args{"q": "x", "d": "2026-13-01"}, nil, "YYYY-MM-DD"},
		{"date with time", connector.Args{"q": "x", "d": "2026-02-10T00:00:00Z"}, nil, "YYYY-MM-DD"},
		{"unknown", connector.Args{"q": "x", "sql": "DELETE FROM users"}, nil, `unknown parameter "sql"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := BindArgs(tpl, tc.args)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for i := range got {
				if gt, ok := got[i].(time.Time); ok {
					if !gt.Equal(tc.want[i].(time.Time)) {
						t.Errorf("[%d] = %v, want %v", i, got[i], tc.want[i])
					}
					continue
				}
				if got[i] != tc.want[i] {
					t.Errorf("[%d] = %#v, want %#v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

// TestJSONValue: database values become plain JSON.
func TestJSONValue(t *testing.T) {
	ts := time.Date(2026, 2, 10, 8, 30, 0, 0, time.UTC)
	tests := []struct {
		in   any
		oid  uint32
		want string
	}{
		{ts, 1082, `"2026-02-10"`},
		{ts, 1184, `"2026-02-10T08:30:00Z"`},
		{[16]byte{0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 1, 2, 3, 4, 5, 6, 7, 8}, 2950, `"12345678-9abc-def0-0102-030405060708"`},
		{int64(7), 20, `7`},
		{nil, 25, `null`},
		{map[string]any{"a": 1.0}, 3802, `{"a":1}`},
	}
	for _, tc := range tests {
		b, err := json.Marshal(jsonValue(tc.in, tc.oid))
		if err != nil || string(b) != tc.want {
			t.Errorf("jsonValue(%v) = %s, %v; want %s", tc.in, b, err, tc.want)
		}
	}
}

// TestScrub: the DSN and its password are removed from messages.
func TestScrub(t *testing.T) {
	got := scrub("failed for postgres://u:pw123@h/db and pw123", "postgres://u:pw123@h/db", "pw123")
	if strings.Contains(got, "pw123") {
		t.Fatalf("scrub left the password: %q", got)
	}
}
