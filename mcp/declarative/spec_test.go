package declarative

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"os/signal"
)

const validFile = `
name: svc
description: a service
base_url: https://svc.example/api
auth: {header: {name: Authorization, env: SVC_TOKEN, prefix: "Bearer "}}
timeout: 5s
tools:
  - name: item
    description: one item
    path: /v1/items/{id}
    params:
      - {name: id, in: path, type: string}
      - {name: day, in: query, type: date, required: true}
    select: /data
`

// TestParseErrors: each mistake an operator can make is refused with the
// file name, the key path and what to do.
func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		edit func(string) string
		want []string
	}{
		{"unknown top-level key", func(s string) string { return s + "retries: 3\n" },
			[]string{"retries: unknown key", "allowed here: name, description, base_url, auth, timeout, tools"}},
		{"unknown key in a param", func(s string) string {
			return strings.Replace(s, "{name: day, in: query", "{name: day, default: today, in: query", 1)
		}, []string{"tools[0].params[1].default: unknown key", "line 13"}},
		{"unknown auth key", func(s string) string { return strings.Replace(s, `prefix: "Bearer "`, `value: "abc"`, 1) },
			[]string{"auth.header.value: unknown key"}},
		{"undeclared path param", func(s string) string { return strings.Replace(s, "/v1/items/{id}", "/v1/items/{id}/{rev}", 1) },
			[]string{"tools[0].path: placeholder {rev} has no parameter declared with in: path"}},
		{"path param not in path", func(s string) string { return strings.Replace(s, "/v1/items/{id}", "/v1/items", 1) },
			[]string{`tools[0].path: path parameter "id" is declared but the path has no {id}`}},
		{"relative base_url", func(s string) string { return strings.Replace(s, "https://svc.example/api", "/api", 1) },
			[]string{"base_url: \"/api\" must be an absolute http or https URL"}},
		{"ftp base_url", func(s string) string { return strings.Replace(s, "https://svc.example/api", "ftp://svc.example", 1) },
			[]string{"base_url:", "absolute http or https"}},
		{"credentials in base_url", func(s string) string {
			return strings.Replace(s, "https://svc.example", "https://bob:hunter2@svc.example", 1)
		},
			[]string{"base_url:", "carries credentials"}},
		{"query in base_url", func(s string) string { return strings.Replace(s, "/api", "/api?key=1", 1) },
			[]string{"base_url:", "has a query"}},
		{"POST", func(s string) string { return strings.Replace(s, "    path:", "    method: POST\n    path:", 1) },
			[]string{`tools[0].method: "POST" is not allowed`, "only GET"}},
		{"upper-case name", func(s string) string { return strings.Replace(s, "name: svc", "name: Svc", 1) },
			[]string{`name: "Svc" must be lower-case`}},
		{"dash in tool name", func(s string) string { return strings.Replace(s, "name: item", "name: get-item", 1) },
			[]string{`tools[0].name: "get-item"`}},
		{"enum without values", func(s string) string { return strings.Replace(s, "type: string", "type: enum", 1) },
			[]string{"tools[0].params[0].values: an enum needs at least one value"}},
		{"values on a date", func(s string) string { return strings.Replace(s, "type: date", "type: date, values: [x]", 1) },
			[]string{"tools[0].params[1].values: only enum parameters take values"}},
		{"unknown type", func(s string) string { return strings.Replace(s, "type: date", "type: url", 1) },
			[]string{`tools[0].params[1].type: "url" must be string, integer, date or enum`}},
		{"bad in", func(s string) string { return strings.Replace(s, "in: query", "in: header", 1) },
			[]string{`tools[0].params[1].in: "header" must be path or query`}},
		{"optional path param", func(s string) string {
			return strings.Replace(s, "in: path, type: string", "in: path, type: string, required: false", 1)
		},
			[]string{"tools[0].params[0].required: path parameters are always required"}},
		{"both auth kinds", func(s string) string {
			return strings.Replace(s, `prefix: "Bearer "}`, `prefix: "Bearer "}, query: {name: k, env: K}`, 1)
		},
			[]string{"auth: set either header or query"}},
		{"secret instead of env name", func(s string) string { return strings.Replace(s, "env: SVC_TOKEN", "env: sk-live-123", 1) },
			[]string{"auth.header.env:", "must name an environment variable"}},
		{"query in path", func(s string) string { return strings.Replace(s, "/v1/items/{id}", "/v1/items/{id}?full=1", 1) },
			[]string{"tools[0].path:", "declare query parameters instead"}},
		{"dot-dot in path", func(s string) string { return strings.Replace(s, "/v1/items/{id}", "/v1/../admin/{id}", 1) },
			[]string{"tools[0].path:", ". or .. segment"}},
		{"unclosed placeholder", func(s string) string { return strings.Replace(s, "/v1/items/{id}", "/v1/items/{id", 1) },
			[]string{"tools[0].path:", "unclosed {"}},
		{"bad pointer", func(s string) string { return strings.Replace(s, "select: /data", "select: data", 1) },
			[]string{"tools[0].select:", "RFC 6901"}},
		{"bad pointer escape", func(s string) string { return strings.Replace(s, "select: /data", "select: /a~2", 1) },
			[]string{"tools[0].select:", "~0"}},
		{"timeout too long", func(s string) string { return strings.Replace(s, "timeout: 5s", "timeout: 5m", 1) },
			[]string{"timeout: 5m0s must be above 0 and at most 1m0s"}},
		{"timeout not a duration", func(s string) string { return strings.Replace(s, "timeout: 5s", "timeout: soon", 1) },
			[]string{`timeout: "soon" is not a duration`}},
		{"missing description", func(s string) string { return strings.Replace(s, "description: one item", "description: ''", 1) },
			[]string{"tools[0].description: is required"}},
		{"duplicate tool", func(s string) string {
			return s + "  - {name: item, description: again, path: /x}\n"
		}, []string{`tools[1].name: tool "item" is defined twice`}},
		{"duplicate param", func(s string) string { return strings.Replace(s, "{name: day,", "{name: id,", 1) },
			[]string{`tools[0].params[1].name: parameter "id" is declared twice`}},
		{"wrong type for tools", func(s string) string {
			return s[:strings.Index(s, "tools:")] + "tools: many\n"
		},
			[]string{"cannot unmarshal"}},
		{"duplicate key", func(s string) string { return s + "name: other\n" },
			[]string{`"name" already defined`}},
		{"two documents", func(s string) string { return s + "---\nname: b\n" },
			[]string{"more than one YAML document"}},
		{"empty", func(string) string { return "" }, []string{"empty file"}},
		{"a list", func(string) string { return "- a\n- b\n" }, []string{"must be a mapping"}},
		{"no tools", func(s string) string { return s[:strings.Index(s, "tools:")] }, []string{"tools: at least one tool"}},
		{"too long tool name", func(s string) string { return strings.Replace(s, "name: item", "name: "+strings.Repeat("x", 61), 1) },
			[]string{"longer than the 64 characters"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("/etc/gpuhost/connectors.d/svc.yaml", []byte(tc.edit(validFile)))
			if err == nil {
				t.Fatal("accepted")
			}
			msg := err.Error()
			if !strings.Contains(msg, "/etc/gpuhost/connectors.d/svc.yaml") {
				t.Errorf("%v\ndoes not name the file", msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("%v\nmissing %q", msg, w)
				}
			}
			if strings.Contains(msg, "hunter2") {
				t.Errorf("password from base_url quoted: %v", msg)
			}
		})
	}
}

func TestParseValid(t *testing.T) {
	c, err := Parse("svc.yaml", []byte(validFile))
	if err != nil {
		t.Fatal(err)
	}
	if c.Name() != "svc" || c.File() != "svc.yaml" || c.timeout != 5*time.Second || c.base.String() != "https://svc.example/api" {
		t.Errorf("parsed %s %s %s %s", c.Name(), c.File(), c.timeout, c.base)
	}
	// Defaults: timeout 10s; method may be written in any case.
	c, err = Parse("x.yaml", []byte("name: x\nbase_url: http://h\ntools: [{name: t, description: d, path: /, method: get}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.timeout != defaultTimeout {
		t.Errorf("timeout %s", c.timeout)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "name: alpha\nbase_url: http://h\ntools: [{name: t, description: d, path: /}]\n")
	write("b.yaml", "name: beta\nbase_url: http://h\nbogus: 1\ntools: [{name: t, description: d, path: /}]\n")
	write("c.yaml", "name: alpha\nbase_url: http://h\ntools: [{name: t, description: d, path: /}]\n")
	write("d.yaml", "name: delta\nbase_url: http://h\ntools: [{name: t, description: d, path: /}]\n")
	write("notes.txt", "not a connector")
	write(".e.yaml", "broken: [")
	write("f.yaml.bak", "broken: [")
	if err := os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo.yaml"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, errs := Load(dir)
	var names []string
	for _, c := range got {
		names = append(names, c.Name)
	}
	if strings.Join(names, ",") != "alpha,delta" {
		t.Errorf("loaded %v, want alpha,delta", names)
	}
	wantErrs := []*regexp.Regexp{
		regexp.MustCompile(`b\.yaml: line 3: bogus: unknown key`),
		regexp.MustCompile(`c\.yaml: name: connector "alpha" is already declared in .*a\.yaml`),
		regexp.MustCompile(`fifo\.yaml: not a regular file`),
	}
	if len(errs) != len(wantErrs) {
		t.Fatalf("errors %v, want %d", errs, len(wantErrs))
	}
	for _, re := range wantErrs {
		found := false
		for _, e := range errs {
			found = found || re.MatchString(e.Error())
		}
		if !found {
			t.Errorf("no error matching %s in %v", re, errs)
		}
	}

	got, errs = Load(filepath.Join(dir, "missing"))
	if got != nil || errs != nil {
		t.Errorf("missing dir: %v %v, want nothing", got, errs)
	}
	_, errs = Load(filepath.Join(dir, "a.yaml"))
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "read connectors directory") {
		t.Errorf("file as dir: %v", errs)
	}
}

func TestWatch(t *testing.T) {
	// Keep SIGHUP caught for the whole test, so a signal that arrives
	// before Watch registers cannot terminate the test binary.
	guard := make(chan os.Signal, 1)
	signal.Notify(guard, syscall.SIGHUP)
	defer signal.Stop(guard)

	ctx, cancel := context.WithCancel(context.Background())
	reloads := make(chan struct{}, 16)
	done := make(chan struct{})
	go func() {
		Watch(ctx, t.TempDir(), func() { reloads <- struct{}{} })
		close(done)
	}()
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for got := false; !got; {
		select {
		case <-reloads:
			got = true
		case <-tick.C:
			if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
		case <-deadline:
			t.Fatal("reload was not called after SIGHUP")
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Watch did not return after cancel")
	}
}

func TestWatchLoop(t *testing.T) {
	ch := make(chan os.Signal, 1)
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	done := make(chan struct{})
	go func() {
		watch(ctx, ch, func() { n++ })
		close(done)
	}()
	ch <- syscall.SIGHUP
	ch <- syscall.SIGHUP // accepted only after the first was taken
	ch <- syscall.SIGHUP
	cancel()
	<-done
	if n < 2 {
		t.Errorf("reload ran %d times for 3 signals, want at least 2", n)
	}
}

func TestPointerRFC6901(t *testing.T) {
	// The example document and expectations of RFC 6901 section 5.
	var doc any
	if err := json.Unmarshal([]byte(`{"foo": ["bar", "baz"], "": 0, "a/b": 1, "c%d": 2, "e^f": 3, "g|h": 4, "i\\j": 5, "k\"l": 6, " ": 7, "m~n": 8}`), &doc); err != nil {
		t.Fatal(err)
	}
	tests := []struct{ ptr, want string }{
		{"", `{"":0," ":7,"a/b":1,"c%d":2,"e^f":3,"foo":["bar","baz"],"g|h":4,"i\\j":5,"k\"l":6,"m~n":8}`},
		{"/foo", `["bar","baz"]`},
		{"/foo/0", `"bar"`},
		{"/", `0`},
		{"/a~1b", `1`},
		{"/c%d", `2`},
		{"/e^f", `3`},
		{"/g|h", `4`},
		{"/i\\j", `5`},
		{"/k\"l", `6`},
		{"/ ", `7`},
		{"/m~0n", `8`},
	}
	for _, tc := range tests {
		p, err := parsePointer(tc.ptr)
		if err != nil {
			t.Fatalf("%q: %v", tc.ptr, err)
		}
		if p.String() != tc.ptr {
			t.Errorf("%q round-trips as %q", tc.ptr, p.String())
		}
		v, err := p.resolve(doc)
		if err != nil {
			t.Fatalf("%q: %v", tc.ptr, err)
		}
		b, _ := json.Marshal(v)
		if string(b) != tc.want {
			t.Errorf("%q = %s, want %s", tc.ptr, b, tc.want)
		}
	}
}
