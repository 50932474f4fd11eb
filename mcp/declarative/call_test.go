package declarative

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"gpuhost/mcp/connector"
)

// echoServer answers every request with a JSON document describing it,
// including the credential it received, so tests see exactly what went on
// the wire and can check the credential is scrubbed on the way back.
type echoServer struct {
	mu   sync.Mutex
	last *http.Request
}

func (e *echoServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	e.last = r.Clone(context.Background())
	e.mu.Unlock()
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	fmt.Fprintf(w, `{"path":%q,"raw_path":%q,"query":%q,"auth":%q,"authorization":%q,"key":%q,"nested":{"list":[{"v":1},{"v":2}],"a/b":"slash","m~n":"tilde"}}`,
		r.URL.Path, r.URL.EscapedPath(), r.URL.RawQuery, r.Header.Get("X-Api-Key"), r.Header.Get("Authorization"), r.URL.Query().Get("api_key"))
}

func (e *echoServer) request() *http.Request {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.last
}

func mustParse(t *testing.T, yml string) *Connector {
	t.Helper()
	c, err := Parse("test.yaml", []byte(yml))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return c
}

func buildTool(t *testing.T, c *Connector, env connector.Env, name string) connector.Tool {
	t.Helper()
	tools, err := c.Build(env)
	if err != nil {
		t.Fatal(err)
	}
	return toolByName(t, tools, name)
}

func TestPathAndQueryEncoding(t *testing.T) {
	echo := &echoServer{}
	srv := httptest.NewServer(echo)
	defer srv.Close()
	c := mustParse(t, `
name: items
base_url: `+srv.URL+`/base/
tools:
  - name: get
    description: one item
    path: /v1/{kind}/{id}/on/{day}.json
    params:
      - {name: kind, in: path, type: enum, values: [a b, c/d]}
      - {name: id, in: path, type: string}
      - {name: day, in: path, type: date}
      - {name: n, in: query, type: integer}
      - {name: q, in: query, type: string}
`)
	tool := buildTool(t, c, testEnv("items", nil), "items_get")
	tests := []struct {
		name        string
		args        connector.Args
		wantRawPath string
		wantQuery   string
		wantErr     string
	}{
		{"plain", connector.Args{"kind": "a b", "id": "42", "day": "2026-01-31"}, "/base/v1/a%20b/42/on/2026-01-31.json", "", ""},
		{"slash stays in its segment", connector.Args{"kind": "c/d", "id": "../../admin?x=1#f", "day": "2026-01-31", "n": 7.0, "q": "a&b=c d"},
			"/base/v1/c%2Fd/..%2F..%2Fadmin%3Fx=1%23f/on/2026-01-31.json", "n=7&q=a%26b%3Dc+d", ""},
		{"percent is literal", connector.Args{"kind": "a b", "id": "%2e%2e", "day": "2026-01-31"}, "/base/v1/a%20b/%252e%252e/on/2026-01-31.json", "", ""},
		{"dot dot refused", connector.Args{"kind": "a b", "id": "..", "day": "2026-01-31"}, "", "", `".." is not a valid value`},
		{"fractional integer", connector.Args{"kind": "a b", "id": "1", "day": "2026-01-31", "n": 1.5}, "", "", "1.5 is not an integer"},
		{"integer as string", connector.Args{"kind": "a b", "id": "1", "day": "2026-01-31", "n": "7"}, "", "", "want an integer, got string"},
		{"control character", connector.Args{"kind": "a b", "id": "a\nb", "day": "2026-01-31"}, "", "", "printable"},
		{"empty string", connector.Args{"kind": "a b", "id": "", "day": "2026-01-31"}, "", "", "printable"},
		{"missing path param", connector.Args{"kind": "a b", "day": "2026-01-31"}, "", "", `missing required parameter "id"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := tool.Handler(context.Background(), tc.args)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			m := res.(map[string]any)
			if m["raw_path"] != tc.wantRawPath || m["query"] != tc.wantQuery {
				t.Errorf("server saw path %v query %v, want %v %v", m["raw_path"], m["query"], tc.wantRawPath, tc.wantQuery)
			}
			if r := echo.request(); r.Host != strings.TrimPrefix(srv.URL, "http://") || r.Method != http.MethodGet {
				t.Errorf("request went to %s %s", r.Method, r.Host)
			}
		})
	}
}

func TestSelect(t *testing.T) {
	echo := &echoServer{}
	srv := httptest.NewServer(echo)
	defer srv.Close()
	tests := []struct {
		sel     string
		want    string
		wantErr string
	}{
		{"", `"nested":{"a/b":"slash"`, ""},
		{"/nested/list", `[{"v":1},{"v":2}]`, ""},
		{"/nested/list/1/v", `2`, ""},
		{"/nested/a~1b", `"slash"`, ""},
		{"/nested/m~0n", `"tilde"`, ""},
		{"/nested/missing", "", `no key "missing" at /nested (keys there: a/b, list, m~n)`},
		{"/nested/list/2", "", "past the end (2 elements)"},
		{"/nested/list/01", "", "not an array index"},
		{"/nested/list/-", "", "not an array index"},
		{"/path/x", "", "/path is a string"},
	}
	for _, tc := range tests {
		t.Run(tc.sel, func(t *testing.T) {
			c := mustParse(t, fmt.Sprintf(`
name: sel
base_url: %s
tools: [{name: get, description: d, path: /x, select: %q}]
`, srv.URL, tc.sel))
			res, err := buildTool(t, c, testEnv("sel", nil), "sel_get").Handler(context.Background(), connector.Args{})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, errSelect) || !strings.Contains(err.Error(), "test.yaml") {
					t.Fatalf("err = %v, want %q naming test.yaml", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := mustJSON(t, res); !strings.Contains(got, tc.want) {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
}

func TestAuth(t *testing.T) {
	echo := &echoServer{}
	srv := httptest.NewServer(echo)
	defer srv.Close()
	tests := []struct {
		name, auth string
		check      func(r *http.Request) error
	}{
		{"header", `header: {name: X-Api-Key, env: API_KEY}`, func(r *http.Request) error {
			if r.Header.Get("X-Api-Key") != canary || r.URL.Query().Has("api_key") {
				return fmt.Errorf("header %q query %q", r.Header.Get("X-Api-Key"), r.URL.RawQuery)
			}
			return nil
		}},
		{"header with prefix", `header: {name: Authorization, env: API_KEY, prefix: "Token "}`, func(r *http.Request) error {
			if r.Header.Get("Authorization") != "Token "+canary {
				return fmt.Errorf("authorization %q", r.Header.Get("Authorization"))
			}
			return nil
		}},
		{"query", `query: {name: api_key, env: API_KEY}`, func(r *http.Request) error {
			if r.URL.Query().Get("api_key") != canary || r.URL.Query().Get("day") != "2026-01-02" {
				return fmt.Errorf("query %q", r.URL.RawQuery)
			}
			return nil
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := mustParse(t, fmt.Sprintf(`
name: svc
base_url: %s
auth: {%s}
tools: [{name: get, description: d, path: /x, params: [{name: day, in: query, type: date}]}]
`, srv.URL, tc.auth))
			env := testEnv("svc", map[string]string{"API_KEY": canary})
			tool := buildTool(t, c, env, "svc_get")
			res, err := tool.Handler(context.Background(), connector.Args{"day": "2026-01-02"})
			if err != nil {
				t.Fatal(err)
			}
			if err := tc.check(echo.request()); err != nil {
				t.Error(err)
			}
			// The echo puts the credential (in every escaping) in the body.
			if got := mustJSON(t, res); strings.Contains(got, "canary") || !strings.Contains(got, connector.Redacted) {
				t.Errorf("result not scrubbed: %s", got)
			}

			// Without the variable: a MissingSecretError naming it, no request.
			echo.mu.Lock()
			echo.last = nil
			echo.mu.Unlock()
			_, err = buildTool(t, c, testEnv("svc", nil), "svc_get").Handler(context.Background(), connector.Args{})
			var missing *connector.MissingSecretError
			if !errors.As(err, &missing) || missing.Name != "API_KEY" {
				t.Fatalf("err = %v, want *connector.MissingSecretError{API_KEY}", err)
			}
			if echo.request() != nil {
				t.Error("a request was sent without the secret")
			}
		})
	}
}

// TestFailures: every way the API can fail is an error naming the tool and
// saying what happened; none carries the credential, although each fake
// echoes it (including in the URL a transport error would quote).
func TestFailures(t *testing.T) {
	block := make(chan struct{})
	defer close(block)
	other := httptest.NewServer(&echoServer{})
	defer other.Close()
	var redirectedTo sync.Map
	mux := http.NewServeMux()
	mux.HandleFunc("/500", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprintf(w, `{"error":"database down","request":%q}`, r.URL.String())
	})
	mux.HandleFunc("/401", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "bad key "+r.URL.Query().Get("api_key"), http.StatusUnauthorized)
	})
	mux.HandleFunc("/html", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, "<html><body><h1>Please log in</h1><p>%s</p></body></html>", r.URL.Query().Get("api_key"))
	})
	mux.HandleFunc("/notjson", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"truncated": `)
	})
	mux.HandleFunc("/trailing", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"a":1} {"b":2}`)
	})
	mux.HandleFunc("/huge", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, "[%q]", strings.Repeat("a", maxResponseBytes))
	})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-block:
		case <-r.Context().Done():
		}
	})
	mux.HandleFunc("/redirect", func(w http.ResponseWriter, r *http.Request) {
		redirectedTo.Store("hit", true)
		http.Redirect(w, r, other.URL+"/stolen", http.StatusFound)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	c := mustParse(t, `
name: flaky
base_url: `+srv.URL+`
auth: {query: {name: api_key, env: FLAKY_KEY}}
timeout: 300ms
tools:
  - {name: e500, description: d, path: /500}
  - {name: e401, description: d, path: /401}
  - {name: html, description: d, path: /html}
  - {name: notjson, description: d, path: /notjson}
  - {name: trailing, description: d, path: /trailing}
  - {name: slow, description: d, path: /slow}
  - {name: redirect, description: d, path: /redirect}
  - {name: refused, description: d, path: /x}
`)
	env := testEnv("flaky", map[string]string{"FLAKY_KEY": canary})
	tools, err := c.Build(env)
	if err != nil {
		t.Fatal(err)
	}
	dead := mustParse(t, "name: dead\nbase_url: http://127.0.0.1:1\nauth: {query: {name: api_key, env: FLAKY_KEY}}\ntools: [{name: refused, description: d, path: /x}]\n")
	deadTools, err := dead.Build(env)
	if err != nil {
		t.Fatal(err)
	}
	tools = append(tools, deadTools...)
	big := mustParse(t, "name: big\nbase_url: "+srv.URL+"\ntimeout: 30s\ntools: [{name: huge, description: d, path: /huge}]\n")
	bigTools, err := big.Build(env)
	if err != nil {
		t.Fatal(err)
	}
	tools = append(tools, bigTools...)

	tests := []struct {
		tool string
		want []string
	}{
		{"flaky_e500", []string{"flaky_e500", "500 Internal Server Error", "try again later", "database down"}},
		{"flaky_e401", []string{"401 Unauthorized", "FLAKY_KEY was refused", "bad key"}},
		{"flaky_html", []string{"flaky_html", "the flaky API answered 200 OK", `"text/html; charset=utf-8" instead of JSON`, "Please log in"}},
		{"flaky_notjson", []string{"invalid JSON", "truncated"}},
		{"flaky_trailing", []string{"trailing data"}},
		{"flaky_slow", []string{"did not answer GET " + srv.URL + "/slow", "timeout 300ms, set in test.yaml"}},
		{"big_huge", []string{"more than 4 MiB", "narrow the query"}},
		{"flaky_redirect", []string{"302 Found", "not followed"}},
		{"dead_refused", []string{"GET http://127.0.0.1:1/x failed", "refused", "reachable"}},
	}
	for _, tc := range tests {
		t.Run(tc.tool, func(t *testing.T) {
			res, err := toolByName(t, tools, tc.tool).Handler(context.Background(), connector.Args{})
			if err == nil {
				t.Fatalf("no error; result %v", res)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%v\nmissing %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "canary") {
				t.Errorf("credential leaked: %v", err)
			}
		})
	}
	if _, ok := redirectedTo.Load("hit"); !ok {
		t.Error("redirect handler never ran")
	}
}

func TestCancelledCall(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
	defer srv.Close()
	c := mustParse(t, "name: c\nbase_url: "+srv.URL+"\ntools: [{name: t, description: d, path: /x}]\n")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := buildTool(t, c, testEnv("c", nil), "c_t").Handler(ctx, connector.Args{})
	if err == nil || !strings.Contains(err.Error(), "cancelled") {
		t.Fatalf("err = %v, want a cancellation", err)
	}
}

func TestBuildRefusesConfigSection(t *testing.T) {
	c := mustParse(t, "name: c\nbase_url: http://x\ntools: [{name: t, description: d, path: /x}]\n")
	env := testEnv("c", nil)
	if err := env.Config.Encode(map[string]any{"base_url": "http://other"}); err != nil {
		t.Fatal(err)
	}
	_, err := c.Build(env)
	if err == nil || !strings.Contains(err.Error(), "test.yaml") || !strings.Contains(err.Error(), "base_url") {
		t.Fatalf("err = %v, want a refusal naming the file and the key", err)
	}
	env.Config.Encode(map[string]any{})
	if _, err := c.Build(env); err != nil {
		t.Fatalf("empty section: %v", err)
	}
}
