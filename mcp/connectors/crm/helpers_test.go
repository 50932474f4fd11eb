package crm

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"gopkg.in/yaml.v3"

	"gpuhost/mcp/connector"
	"gpuhost/mcp/connectors/crm/pgtest"
)

// roPassword is recognisable so tests can assert it never leaks.
const roPassword = "canary-ro-pw-7f3a9c"

// testDB is a real PostgreSQL with the sample CRM schema and the read-only
// role created by scripts/crm-readonly-role.sql.
type testDB struct {
	adminDSN string // superuser, database crm, Unix socket
	roDSN    string // gpuhost_crm_ro over TCP with password
	host     string
	port     uint16
}

const schemaSQL = `
CREATE TABLE users (id bigint PRIMARY KEY, name text NOT NULL, email text NOT NULL, company text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT '2025-01-01T10:00:00Z');
CREATE TABLE projects (id bigint PRIMARY KEY, customer_id bigint NOT NULL REFERENCES users, name text NOT NULL,
  description text NOT NULL DEFAULT '', status text NOT NULL, started_on date NOT NULL);
CREATE TABLE invoices (id bigint PRIMARY KEY, number text NOT NULL, customer_id bigint NOT NULL REFERENCES users,
  amount numeric(12,2) NOT NULL, currency text NOT NULL, status text NOT NULL, issued_on date NOT NULL, due_on date NOT NULL);
CREATE TABLE tickets (id bigint PRIMARY KEY, customer_id bigint NOT NULL REFERENCES users, subject text NOT NULL,
  status text NOT NULL, opened_on date NOT NULL);
INSERT INTO users (id, name, email, company) VALUES
  (1, 'Alice Anderson', 'alice@acme.test', 'Acme'),
  (2, 'Bob Builder', 'bob@build.test', 'BuildCo'),
  (3, 'Carol O''Brien', 'carol@acme.test', 'Acme'),
  (4, 'Robert''); DROP TABLE students;--', 'bobby@tables.test', 'Tables Inc');
INSERT INTO users (id, name, email, company)
  SELECT n, 'Bulk User ' || n, 'bulk' || n || '@bulk.test', 'Bulkcorp' FROM generate_series(100, 349) AS n;
INSERT INTO projects VALUES
  (1, 1, 'Website relaunch', 'new shop', 'active', '2026-01-10'),
  (2, 1, 'GPU cluster', 'inference box', 'done', '2025-06-01'),
  (3, 2, 'Warehouse', 'storage racks', 'active', '2026-03-01');
INSERT INTO invoices VALUES
  (1, 'INV-001', 1, 1200.50, 'EUR', 'paid', '2025-07-01', '2025-07-31'),
  (2, 'INV-002', 1, 99.99, 'EUR', 'open', '2026-02-01', '2026-03-01'),
  (3, 'INV-003', 2, 5000.00, 'EUR', 'overdue', '2026-01-15', '2026-02-15');
INSERT INTO tickets VALUES
  (1, 1, 'Login broken', 'open', '2026-02-10'),
  (2, 2, 'Invoice question', 'closed', '2026-01-20');
`

// startDB starts PostgreSQL (or skips, see pgtest) with database crm, the
// sample data and the read-only role able to log in.
func startDB(t *testing.T) *testDB {
	t.Helper()
	db := pgtest.StartCRM(t, schemaSQL, roPassword)
	return &testDB{adminDSN: db.AdminDSN, roDSN: db.RoleDSN, host: "127.0.0.1", port: db.Port}
}

// count returns SELECT count(*) FROM table, as the superuser.
func (db *testDB) count(t *testing.T, table string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, db.adminDSN)
	if err != nil {
		t.Fatalf("connect as admin: %v", err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize()).Scan(&n); err != nil {
		t.Fatalf("count %s: %v", table, err)
	}
	return n
}

// buildTools builds the connector from a YAML section and an environment.
func buildTools(t *testing.T, section string, environ map[string]string) (map[string]connector.Tool, error) {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(section), &doc); err != nil {
		t.Fatalf("test yaml: %v", err)
	}
	env := connector.Env{
		Name: "crm",
		Secrets: connector.NewSecrets(func(k string) (string, bool) {
			v, ok := environ[k]
			return v, ok
		}),
		Log: slog.New(slog.DiscardHandler),
	}
	if len(doc.Content) > 0 {
		env.Config = *doc.Content[0]
	}
	tools, err := (&builder{}).Build(env)
	if err != nil {
		return nil, err
	}
	out := map[string]connector.Tool{}
	for _, tl := range tools {
		out[tl.Def.Name] = tl
	}
	return out, nil
}

func mustBuild(t *testing.T, section string, environ map[string]string) map[string]connector.Tool {
	t.Helper()
	tools, err := buildTools(t, section, environ)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	return tools
}

// call runs a tool's handler directly with a bounded context.
func call(t *testing.T, tools map[string]connector.Tool, name string, args map[string]any) (*Result, error) {
	t.Helper()
	tl, ok := tools[name]
	if !ok {
		t.Fatalf("no tool %q", name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := tl.Handler(ctx, connector.Args(args))
	if err != nil {
		return nil, err
	}
	res, ok := out.(*Result)
	if !ok {
		t.Fatalf("%s returned %T, want *Result", name, out)
	}
	return res, nil
}
