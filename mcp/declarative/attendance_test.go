package declarative

import (
	"context"
	"encoding/json"
	"gpuhost/mcp/connector"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// canary is the attendance token in these tests; the fake echoes whatever
// credential it receives, so any leak shows up as this string.
const canary = "canary-tok-7f3a9c/+=secret"

// fakeAttendance implements the REST shape documented in
// examples/attendance.yaml, with the two quirks that make tests useful: it
// echoes the Authorization header it got (in data.debug_auth and in 401
// bodies), and it counts requests so tests can prove a bad argument never
// left the process.
type fakeAttendance struct {
	token    string
	requests atomic.Int64
}

type employee struct {
	ID, Name, Department, Since, Shift string
}

var (
	present = []employee{
		{"E1001", "Ada Berg", "assembly", "06:02", "early"},
		{"E1003", "Cem Öz", "paint", "06:10", "early"},
		{"E1004", "Dana Ek", "assembly", "13:58", "late"},
	}
	absences = []struct{ ID, Name, Department, From, To, Kind string }{
		{"E1002", "Bo Lind", "paint", "2026-11-30", "2026-12-04", "vacation"},
		{"E1005", "Eva Nyberg", "welding", "2026-11-02", "2026-11-03", "sick"},
		{"E1006", "Finn Holm", "assembly", "2026-12-10", "2026-12-11", "training"},
	}
)

func (f *fakeAttendance) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.requests.Add(1)
	got := r.Header.Get("Authorization")
	w.Header().Set("Content-Type", "application/json")
	if r.Method != http.MethodGet {
		w.WriteHeader(http.StatusMethodNotAllowed)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": "read-only API"})
		return
	}
	if got != "Bearer "+f.token {
		w.WriteHeader(http.StatusUnauthorized)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": "invalid credentials: " + got})
		return
	}
	dept := r.URL.Query().Get("department")
	switch r.URL.Path {
	case "/api/v1/presence/today":
		list := []map[string]string{}
		for _, e := range present {
			if dept == "" || e.Department == dept {
				list = append(list, map[string]string{"employee_id": e.ID, "name": e.Name, "department": e.Department, "since": e.Since, "shift": e.Shift})
			}
		}
		_ = json.NewEncoder(w).Encode(map[string]any{
			"data": map[string]any{"date": "2026-11-30", "present": list, "count": len(list), "debug_auth": got},
			"meta": map[string]any{"generated_at": "2026-11-30T09:15:00Z"},
		})
	case "/api/v1/absences":
		from, err1 := time.Parse(time.DateOnly, r.URL.Query().Get("from"))
		to, err2 := time.Parse(time.DateOnly, r.URL.Query().Get("to"))
		if err1 != nil || err2 != nil || from.After(to) {
			w.WriteHeader(http.StatusBadRequest)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": "from and to must be dates with from <= to"})
			return
		}
		items := []map[string]string{}
		for _, a := range absences {
			af, _ := time.Parse(time.DateOnly, a.From)
			at, _ := time.Parse(time.DateOnly, a.To)
			if (dept == "" || a.Department == dept) && !af.After(to) && !at.Before(from) {
				items = append(items, map[string]string{"employee_id": a.ID, "name": a.Name, "department": a.Department, "from": a.From, "to": a.To, "kind": a.Kind})
			}
		}
		_ = json.NewEncoder(w).Encode(map[string]any{
			"data": map[string]any{"items": items, "total": len(items)},
			"meta": map[string]any{"from": r.URL.Query().Get("from"), "to": r.URL.Query().Get("to")},
		})
	default:
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": "no route " + r.URL.Path})
	}
}

// testEnv is an Env whose secrets come from vars.
func testEnv(name string, vars map[string]string) connector.Env {
	return connector.Env{
		Name: name,
		Secrets: connector.NewSecrets(func(k string) (string, bool) {
			v, ok := vars[k]
			return v, ok
		}),
		HTTP: &http.Client{Timeout: 5 * time.Second},
		Log:  slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

// loadExample copies the shipped example into a temp connectors directory
// with base_url pointed at srvURL and loads it through Load, the path the
// daemon takes.
func loadExample(t *testing.T, srvURL string) *Connector {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("examples", "attendance.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	const prod = "base_url: http://attendance.internal:8080/api"
	if !strings.Contains(string(data), prod) {
		t.Fatalf("example no longer has %q; update the test", prod)
	}
	data = []byte(strings.Replace(string(data), prod, "base_url: "+srvURL+"/api", 1))
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "attendance.yaml"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	got, errs := Load(dir)
	if len(errs) > 0 || len(got) != 1 {
		t.Fatalf("Load: %d connectors, errors %v", len(got), errs)
	}
	if got[0].Name != "attendance" {
		t.Fatalf("name %q", got[0].Name)
	}
	return got[0].Connector.(*Connector)
}

func toolByName(t *testing.T, tools []connector.Tool, name string) connector.Tool {
	t.Helper()
	for _, tl := range tools {
		if tl.Def.Name == name {
			return tl
		}
	}
	t.Fatalf("no tool %s", name)
	return connector.Tool{}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestAttendanceExampleDefinitions(t *testing.T) {
	c := loadExample(t, "http://127.0.0.1:1")
	tools, err := c.Build(testEnv("attendance", nil))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools {
		names = append(names, tl.Def.Name)
		a := tl.Def.Annotations
		if a.ReadOnlyHint == nil || !*a.ReadOnlyHint || a.DestructiveHint == nil || *a.DestructiveHint {
			t.Errorf("%s: annotations %+v, want readOnly true, destructive false", tl.Def.Name, a)
		}
		if tl.Def.InputSchema.AdditionalProperties != false {
			t.Errorf("%s: additionalProperties %v, want false", tl.Def.Name, tl.Def.InputSchema.AdditionalProperties)
		}
		dept, _ := tl.Def.InputSchema.Properties["department"].(map[string]any)
		if want := []string{"assembly", "paint", "welding", "logistics", "quality", "maintenance"}; !slices.Equal(dept["enum"].([]string), want) {
			t.Errorf("%s: department enum %v, want %v", tl.Def.Name, dept["enum"], want)
		}
		if slices.Contains(tl.Def.InputSchema.Required, "department") {
			t.Errorf("%s: department must be optional", tl.Def.Name)
		}
	}
	if !slices.Equal(names, []string{"attendance_present_today", "attendance_absences"}) {
		t.Fatalf("tools %v", names)
	}
	abs := toolByName(t, tools, "attendance_absences").Def.InputSchema
	if !slices.Equal(abs.Required, []string{"from", "to"}) {
		t.Errorf("absences required %v, want [from to]", abs.Required)
	}
	for _, p := range []string{"from", "to"} {
		prop := abs.Properties[p].(map[string]any)
		if prop["pattern"] != datePattern || prop["format"] != "date" || prop["type"] != "string" {
			t.Errorf("%s schema %v, want a date string", p, prop)
		}
	}
}

func TestAttendanceExampleCalls(t *testing.T) {
	fake := &fakeAttendance{token: canary}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	tools, err := loadExample(t, srv.URL).Build(testEnv("attendance", map[string]string{"ATTENDANCE_TOKEN": canary}))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, tool string
		args       connector.Args
		want       []string // substrings of the JSON result, or of the error
		wantErr    bool
		noRequest  bool // the error must come before any HTTP request
	}{
		{name: "present today", tool: "attendance_present_today", args: connector.Args{},
			want: []string{`"date":"2026-11-30"`, `"count":3`, `"Ada Berg"`, `"Dana Ek"`, `"debug_auth":"Bearer [redacted]"`}},
		{name: "present today in paint", tool: "attendance_present_today", args: connector.Args{"department": "paint"},
			want: []string{`"count":1`, `"Cem Öz"`}},
		{name: "absences this week", tool: "attendance_absences", args: connector.Args{"from": "2026-11-30", "to": "2026-12-06"},
			want: []string{`[{"department":"paint","employee_id":"E1002","from":"2026-11-30","kind":"vacation","name":"Bo Lind","to":"2026-12-04"}]`}},
		{name: "absences in November, welding", tool: "attendance_absences", args: connector.Args{"from": "2026-11-01", "to": "2026-11-30", "department": "welding"},
			want: []string{`"E1005"`, `"sick"`}},
		{name: "absences none", tool: "attendance_absences", args: connector.Args{"from": "2027-01-01", "to": "2027-01-31"},
			want: []string{`[]`}},
		{name: "from after to is the API's 400", tool: "attendance_absences", args: connector.Args{"from": "2026-12-06", "to": "2026-11-30"},
			wantErr: true, want: []string{"attendance_absences", "400 Bad Request", "from and to must be dates"}},
		{name: "German date", tool: "attendance_absences", args: connector.Args{"from": "30.11.2026", "to": "2026-12-06"},
			wantErr: true, noRequest: true, want: []string{`parameter "from"`, "YYYY-MM-DD"}},
		{name: "impossible date", tool: "attendance_absences", args: connector.Args{"from": "2026-02-30", "to": "2026-03-06"},
			wantErr: true, noRequest: true, want: []string{"not a date"}},
		{name: "missing to", tool: "attendance_absences", args: connector.Args{"from": "2026-11-30"},
			wantErr: true, noRequest: true, want: []string{`missing required parameter "to"`}},
		{name: "unknown department", tool: "attendance_present_today", args: connector.Args{"department": "hr"},
			wantErr: true, noRequest: true, want: []string{`"hr" is not allowed`, "assembly, paint"}},
		{name: "department as a number", tool: "attendance_present_today", args: connector.Args{"department": 3.0},
			wantErr: true, noRequest: true, want: []string{"got number"}},
		{name: "smuggled URL parameter", tool: "attendance_present_today", args: connector.Args{"url": "http://evil/"},
			wantErr: true, noRequest: true, want: []string{`unknown parameter "url"`, "takes: department"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := fake.requests.Load()
			res, err := toolByName(t, tools, tc.tool).Handler(context.Background(), tc.args)
			text := ""
			if err != nil {
				text = err.Error()
			} else {
				text = mustJSON(t, res)
			}
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, result %s", err, text)
			}
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Errorf("%s\nmissing %q", text, w)
				}
			}
			if strings.Contains(text, "canary") {
				t.Errorf("token leaked: %s", text)
			}
			if tc.noRequest && fake.requests.Load() != before {
				t.Errorf("a request was sent for an argument that should have been refused locally")
			}
		})
	}
}
