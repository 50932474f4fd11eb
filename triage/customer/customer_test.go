package customer

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"gpuhost/internal/testkit"
	"gpuhost/mcp"
	"gpuhost/mcp/connector"
	// The real connector registers itself; the package under test reads only
	// its answer (crmwire), so the test links it here.
	_ "gpuhost/mcp/connectors/crm"
	"gpuhost/mcp/connectors/crm/pgtest"
)

const (
	dsnVar     = "TRIAGE_CRM_TEST_DSN"
	roPassword = "canary-triage-ro-4d2e"
	profileURL = "https://crm.example.com/users/{id}"
)

const schemaSQL = `
CREATE TABLE users (id bigint PRIMARY KEY, name text NOT NULL, email text NOT NULL, company text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT '2025-01-01T10:00:00Z');
INSERT INTO users (id, name, email, company) VALUES
  (1, 'Alice Anderson', 'alice@acme.test', 'Acme'),
  (2, 'Jo Ann', 'joann@example.test', 'Example'),
  (3, 'Bob Builder', 'Bob@Build.test', 'BuildCo'),
  (4, 'Zed Sales', 'sales@big.test', 'Big'),
  (5, 'Anna Sales', 'anna.sales@big.test', 'Big'),
  (6, 'Bert Sales', 'bert.sales@big.test', 'Big'),
  (7, 'Carl Sales', 'carl.sales@big.test', 'Big'),
  (8, 'Una Score', 'una_score@big.test', 'Big'),
  (9, 'Per Cent', 'per%cent@big.test', 'Big');
`

// startCRM starts a real PostgreSQL (or skips, see pgtest), loads a small
// CRM and the read-only role of scripts/crm-readonly-role.sql, and returns
// the role's DSN over TCP with a password.
func startCRM(t *testing.T) string {
	t.Helper()
	return pgtest.StartCRM(t, schemaSQL, roPassword).RoleDSN
}

// environ is the process environment the MCP server reads secrets from,
// changeable between calls.
type environ struct {
	mu sync.Mutex
	m  map[string]string
}

func (e *environ) lookup(k string) (string, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	v, ok := e.m[k]
	return v, ok
}

func (e *environ) set(k, v string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if v == "" {
		delete(e.m, k)
	} else {
		e.m[k] = v
	}
}

// serve builds gpuhost's MCP server with the crm connector configured by
// section and returns an in-process mcp-go client to it.
func serve(t *testing.T, section string, env *environ) Caller {
	t.Helper()
	var node yaml.Node
	if err := yaml.Unmarshal([]byte(section), &node); err != nil {
		t.Fatalf("test yaml: %v", err)
	}
	srv, err := mcp.NewServer(mcp.ServerOptions{
		Config:  map[string]yaml.Node{"crm": *node.Content[0]},
		Secrets: connector.NewSecrets(env.lookup),
	})
	if err != nil {
		t.Fatalf("mcp.NewServer: %v", err)
	}
	if d := srv.Disabled(); len(d) != 0 {
		t.Fatalf("crm connector disabled: %v", d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := srv.InProcessClient(ctx)
	if err != nil {
		t.Fatalf("in-process client: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestFindAgainstPostgres looks customers up through the real MCP server,
// the real crm connector and a real PostgreSQL.
func TestFindAgainstPostgres(t *testing.T) {
	roDSN := startCRM(t)
	env := &environ{m: map[string]string{dsnVar: roDSN}}
	client := serve(t, "dsn_env: "+dsnVar+"\n", env)
	small := serve(t, `dsn_env: `+dsnVar+`
max_rows: 2
templates:
  - name: search_users
    description: Find users by name, email or company.
    sql: |
      SELECT id, name, email, company FROM users
      WHERE name ILIKE '%' || $1 || '%' OR email ILIKE '%' || $1 || '%' OR company ILIKE '%' || $1 || '%'
      ORDER BY name, id
    params: [{name: query, type: string, required: true}]
  - name: by_email
    description: The user with exactly this email.
    sql: SELECT id, name, email, company FROM users WHERE lower(email) = lower($1) ORDER BY id
    params: [{name: query, type: string, required: true}]
  - name: names_only
    description: Names without emails.
    sql: SELECT id, name FROM users WHERE email ILIKE '%' || $1 || '%' ORDER BY id
    params: [{name: query, type: string, required: true}]
`, env)

	tests := []struct {
		name    string
		client  Caller
		tool    string
		match   string
		email   string
		want    *Customer
		wantErr string
	}{
		{name: "known customer", email: "alice@acme.test",
			want: &Customer{ID: 1, Name: "Alice Anderson", Email: "alice@acme.test", Company: "Acme", URL: "https://crm.example.com/users/1"}},
		{name: "case and spaces do not matter", email: "  BOB@build.TEST ",
			want: &Customer{ID: 3, Name: "Bob Builder", Email: "Bob@Build.test", Company: "BuildCo", URL: "https://crm.example.com/users/3"}},
		{name: "unknown sender", email: "nobody@nowhere.test"},
		{name: "substring of another customer's email is not a customer", email: "ann@example.test"},
		{name: "tail of an email is not a customer", email: "ice@acme.test"},
		{name: "LIKE wildcard in the address matches nothing exact", email: "a_ice@acme.test"},
		{name: "exact match among several substring matches", email: "sales@big.test",
			want: &Customer{ID: 4, Name: "Zed Sales", Email: "sales@big.test", Company: "Big", URL: "https://crm.example.com/users/4"}},
		{name: "truncated result without the exact row is an error naming the substring template", client: small, email: "sales@big.test",
			wantErr: "contain it; use an exact-match template"},
		// LIKE wildcards in a sender are literal: "%@%" reads no other
		// customer's row (before, it read max_rows of them and advised
		// raising max_rows).
		{name: "percent wildcards read no other customer", client: small, email: "%@%"},
		{name: "underscore wildcard reads no other customer", client: small, email: "_ales@big.test"},
		{name: "backslash is literal", client: small, email: `\ales@big.test`},
		{name: "real address with an underscore", client: small, email: "una_score@big.test",
			want: &Customer{ID: 8, Name: "Una Score", Email: "una_score@big.test", Company: "Big", URL: "https://crm.example.com/users/8"}},
		{name: "real address with a percent sign", client: small, email: "per%cent@big.test",
			want: &Customer{ID: 9, Name: "Per Cent", Email: "per%cent@big.test", Company: "Big", URL: "https://crm.example.com/users/9"}},
		{name: "equality template gets the address as is", client: small, tool: "crm_by_email", match: MatchEqual, email: "una_score@big.test",
			want: &Customer{ID: 8, Name: "Una Score", Email: "una_score@big.test", Company: "Big", URL: "https://crm.example.com/users/8"}},
		{name: "equality template: wildcards match nothing", client: small, tool: "crm_by_email", match: MatchEqual, email: "%@%"},
		{name: "unknown match kind", match: "regex", email: "alice@acme.test", wantErr: `match "regex"`},
		{name: "template without an email column", client: small, tool: "crm_names_only", email: "alice@acme.test", wantErr: "no email column"},
		{name: "unknown tool", tool: "crm_nope", email: "alice@acme.test", wantErr: "crm_nope"},
		{name: "not an email", email: "acme", wantErr: "not an email address"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.client
			if c == nil {
				c = client
			}
			l := &Lookup{Client: c, Tool: tc.tool, Match: tc.match, ProfileURL: profileURL, Timeout: time.Minute}
			got, err := l.Find(context.Background(), tc.email)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Find(%q) = %+v, %v; want an error containing %q", tc.email, got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Find(%q): %v", tc.email, err)
			}
			if (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
				t.Fatalf("Find(%q) = %+v, want %+v", tc.email, got, tc.want)
			}
		})
	}

	t.Run("no profile URL gives no link", func(t *testing.T) {
		got, err := (&Lookup{Client: client}).Find(context.Background(), "alice@acme.test")
		if err != nil || got == nil || got.ID != 1 || got.URL != "" {
			t.Fatalf("Find = %+v, %v", got, err)
		}
	})

	// Tool failures are errors with the tool's message, never "not a
	// customer", and never carry the password.
	failures := []struct {
		name, dsn, want string
	}{
		{"database down", fmt.Sprintf("postgres://gpuhost_crm_ro:%s@127.0.0.1:%d/crm?sslmode=disable&connect_timeout=5", roPassword, testkit.FreePort(t)), "cannot reach the CRM database"},
		{"wrong password", strings.Replace(roDSN, roPassword, roPassword+"-wrong", 1), "refused the login"},
		{"DSN variable missing", "", dsnVar},
	}
	for _, tc := range failures {
		t.Run(tc.name, func(t *testing.T) {
			env.set(dsnVar, tc.dsn)
			defer env.set(dsnVar, roDSN)
			got, err := (&Lookup{Client: client, ProfileURL: profileURL}).Find(context.Background(), "alice@acme.test")
			if err == nil || got != nil {
				t.Fatalf("Find = %+v, %v; want an error", got, err)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "crm_search_users") {
				t.Fatalf("error %q does not contain %q and the tool name", err, tc.want)
			}
			if strings.Contains(err.Error(), roPassword) {
				t.Fatalf("error leaks the password: %q", err)
			}
		})
	}
}

func TestFindWithoutClient(t *testing.T) {
	var l *Lookup
	if _, err := l.Find(context.Background(), "a@b.test"); err == nil {
		t.Fatal("nil Lookup: want an error")
	}
	if _, err := (&Lookup{}).Find(context.Background(), "a@b.test"); err == nil || !strings.Contains(err.Error(), "no MCP client") {
		t.Fatalf("no client: err = %v", err)
	}
}

func TestPickExact(t *testing.T) {
	tests := []struct {
		name, text, want string
		id               int64
		wantErr          string
	}{
		{name: "exact after substring rows", text: `{"rows":[{"id":2,"email":"joann@x.test"},{"id":3,"email":"ANN@x.test","name":"Ann"}],"row_count":2}`, want: "ann@x.test", id: 3},
		{name: "no rows", text: `{"rows":[],"row_count":0}`, want: "ann@x.test"},
		{name: "id as string", text: `{"rows":[{"id":"42","email":"ann@x.test"}]}`, want: "ann@x.test", id: 42},
		{name: "id too large", text: `{"rows":[{"id":99999999999999999999,"email":"ann@x.test"}]}`, want: "ann@x.test", wantErr: "not an integer"},
		{name: "id fractional", text: `{"rows":[{"id":1.5,"email":"ann@x.test"}]}`, want: "ann@x.test", wantErr: "not an integer"},
		{name: "id missing", text: `{"rows":[{"email":"ann@x.test"}]}`, want: "ann@x.test", wantErr: "no id column"},
		{name: "not JSON", text: `crm_search_users: boom`, want: "ann@x.test", wantErr: "not a CRM result"},
		{name: "JSON without rows", text: `{"error":"x"}`, want: "ann@x.test", wantErr: "no rows field"},
		{name: "truncated with the match is fine", text: `{"rows":[{"id":7,"email":"ann@x.test"}],"truncated":true}`, want: "ann@x.test", id: 7},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := pickExact(tc.text, tc.want, false)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (tc.id == 0) != (c == nil) || (c != nil && c.ID != tc.id) {
				t.Fatalf("got %+v, want id %d", c, tc.id)
			}
		})
	}
}

func FuzzPickExact(f *testing.F) {
	f.Add(`{"rows":[{"id":1,"email":"a@b.test","name":"A"}],"row_count":1}`, "a@b.test")
	f.Add(`{"rows":[{"id":"x","email":"a@b.test"}]}`, "a@b.test")
	f.Add(`{"rows":null,"truncated":true}`, "")
	f.Add(`[1,2]`, "a@b.test")
	f.Fuzz(func(t *testing.T, text, want string) {
		c, err := pickExact(text, want, false)
		if err != nil && c != nil {
			t.Fatalf("both a customer and an error: %+v, %v", c, err)
		}
		if c != nil && !strings.EqualFold(c.Email, want) {
			t.Fatalf("customer %q returned for %q", c.Email, want)
		}
	})
}
