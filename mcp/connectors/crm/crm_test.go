package crm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"gpuhost/internal/testkit"
	"gpuhost/mcp/connector"
)

const dsnVar = "CRM_TEST_DSN"

// TestAgainstPostgres runs every database behaviour against one real
// PostgreSQL server (started once: initdb costs a few seconds).
func TestAgainstPostgres(t *testing.T) {
	db := startDB(t)
	environ := map[string]string{dsnVar: db.roDSN}
	tools := mustBuild(t, "dsn_env: "+dsnVar+"\n", environ) // default templates

	t.Run("templates return the right rows", func(t *testing.T) {
		tests := []struct {
			tool    string
			args    map[string]any
			wantIDs []int64
			check   func(t *testing.T, r *Result)
		}{
			{tool: "crm_search_users", args: map[string]any{"query": "acme"}, wantIDs: []int64{1, 3},
				check: func(t *testing.T, r *Result) {
					if got := r.Rows[0]["created_at"]; got != "2025-01-01T10:00:00Z" {
						t.Errorf("created_at = %#v, want RFC 3339 UTC string", got)
					}
					if r.Rows[1]["name"] != "Carol O'Brien" {
						t.Errorf("row 2 name = %#v", r.Rows[1]["name"])
					}
				}},
			{tool: "crm_search_users", args: map[string]any{"query": "nobody-matches-this"}, wantIDs: []int64{}},
			{tool: "crm_search_projects", args: map[string]any{"query": "GPU"}, wantIDs: []int64{2},
				check: func(t *testing.T, r *Result) {
					if r.Rows[0]["started_on"] != "2025-06-01" || r.Rows[0]["customer"] != "Alice Anderson" {
						t.Errorf("row = %#v, want started_on 2025-06-01 and customer Alice Anderson", r.Rows[0])
					}
				}},
			{tool: "crm_search_invoices", args: map[string]any{"customer_id": float64(1)}, wantIDs: []int64{2, 1},
				check: func(t *testing.T, r *Result) {
					b, _ := json.Marshal(r.Rows[1]["amount"])
					if string(b) != "1200.50" {
						t.Errorf("amount JSON = %s, want exact 1200.50", b)
					}
					if r.Rows[0]["due_on"] != "2026-03-01" {
						t.Errorf("due_on = %#v", r.Rows[0]["due_on"])
					}
				}},
			{tool: "crm_search_invoices", args: map[string]any{"status": "overdue"}, wantIDs: []int64{3}},
			{tool: "crm_search_invoices", args: map[string]any{"customer_id": float64(1), "status": "overdue"}, wantIDs: []int64{}},
			{tool: "crm_search_invoices", args: map[string]any{}, wantIDs: []int64{2, 3, 1}},
			{tool: "crm_customer_history", args: map[string]any{"user_id": float64(1)}, wantIDs: []int64{1, 2, 1, 1, 2},
				check: func(t *testing.T, r *Result) {
					var kinds []string
					for _, row := range r.Rows {
						kinds = append(kinds, fmt.Sprint(row["kind"], "@", row["day"]))
					}
					want := "ticket@2026-02-10 invoice@2026-02-01 project@2026-01-10 invoice@2025-07-01 project@2025-06-01"
					if strings.Join(kinds, " ") != want {
						t.Errorf("history = %s\nwant      %s", strings.Join(kinds, " "), want)
					}
				}},
			{tool: "crm_customer_history", args: map[string]any{"user_id": float64(999)}, wantIDs: []int64{}},
		}
		for _, tc := range tests {
			t.Run(fmt.Sprintf("%s %v", tc.tool, tc.args), func(t *testing.T) {
				r, err := call(t, tools, tc.tool, tc.args)
				if err != nil {
					t.Fatalf("call: %v", err)
				}
				ids := []int64{}
				for _, row := range r.Rows {
					id, _ := row["id"].(int64)
					ids = append(ids, id)
				}
				if fmt.Sprint(ids) != fmt.Sprint(tc.wantIDs) {
					t.Fatalf("ids = %v, want %v (rows %v)", ids, tc.wantIDs, r.Rows)
				}
				if r.RowCount != len(tc.wantIDs) || r.Truncated {
					t.Errorf("row_count %d truncated %v, want %d false", r.RowCount, r.Truncated, len(tc.wantIDs))
				}
				if _, err := json.Marshal(r); err != nil {
					t.Errorf("result does not marshal: %v", err)
				}
				if tc.check != nil && len(r.Rows) > 0 {
					tc.check(t, r)
				}
			})
		}
	})

	t.Run("SQL in a parameter is only data", func(t *testing.T) {
		before := db.count(t, "users")
		for _, q := range []string{"'; DROP TABLE users; --", "x' OR '1'='1", "%'; DELETE FROM invoices; --", "$1", `\'; SELECT pg_sleep(5); --`} {
			r, err := call(t, tools, "crm_search_users", map[string]any{"query": q})
			if err != nil {
				t.Fatalf("query %q: %v", q, err)
			}
			if r.RowCount != 0 {
				t.Errorf("query %q matched %d rows (%v), want 0: the text must be searched for, not executed", q, r.RowCount, r.Rows)
			}
		}
		// The stored name with SQL in it is found by searching for that text.
		r, err := call(t, tools, "crm_search_users", map[string]any{"query": "DROP TABLE students"})
		if err != nil || r.RowCount != 1 || r.Rows[0]["id"] != int64(4) {
			t.Fatalf("search for stored SQL text: %v %v, want user 4", r, err)
		}
		if after := db.count(t, "users"); after != before {
			t.Fatalf("users changed from %d to %d", before, after)
		}
		if n := db.count(t, "invoices"); n != 3 {
			t.Fatalf("invoices = %d, want 3", n)
		}
	})

	t.Run("a writing template is stopped by both layers", func(t *testing.T) {
		before := db.count(t, "users")
		careless := mustBuild(t, `dsn_env: `+dsnVar+`
templates:
  - name: purge_users
    description: a careless operator's template
    sql: DELETE FROM users
  - name: purge_user
    description: another one, with a parameter
    sql: DELETE FROM users WHERE id = $1 RETURNING id
    params: [{name: id, type: int, required: true}]
`, environ)
		// Layer 1: the connector's READ ONLY transaction refuses it.
		for name, args := range map[string]map[string]any{"crm_purge_users": {}, "crm_purge_user": {"id": float64(1)}} {
			_, err := call(t, careless, name, args)
			if err == nil || !strings.Contains(err.Error(), "read-only transaction") {
				t.Fatalf("%s: err = %v, want refusal by the read-only transaction", name, err)
			}
		}

		// Layer 1 alone: even as the superuser (all privileges, no
		// read-only default), the connector's transaction refuses it.
		asAdmin := mustBuild(t, `dsn_env: `+dsnVar+`
templates:
  - {name: purge_users, description: careless, sql: DELETE FROM users}
`, map[string]string{dsnVar: db.adminDSN})
		if _, err := call(t, asAdmin, "crm_purge_users", nil); err == nil || !strings.Contains(err.Error(), "read-only transaction") {
			t.Fatalf("as superuser: err = %v, want refusal by the read-only transaction", err)
		}

		// Layer 2: as the same role, but outside any read-only setting,
		// the missing privilege refuses it.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, db.roDSN)
		if err != nil {
			t.Fatalf("connect as gpuhost_crm_ro: %v", err)
		}
		defer conn.Close(ctx)
		// The role's own default is read-only (the script sets it)...
		var ro string
		if err := conn.QueryRow(ctx, "SHOW default_transaction_read_only").Scan(&ro); err != nil || ro != "on" {
			t.Fatalf("role default_transaction_read_only = %q, %v; want on", ro, err)
		}
		// ...but a session can turn that off, so the grants must hold alone.
		if _, err := conn.Exec(ctx, "SET default_transaction_read_only = off"); err != nil {
			t.Fatalf("SET default_transaction_read_only = off: %v", err)
		}
		for _, stmt := range []string{
			"DELETE FROM users",
			"UPDATE invoices SET status = 'paid'",
			"INSERT INTO tickets VALUES (99, 1, 'x', 'open', '2026-01-01')",
			"TRUNCATE users CASCADE",
			"DROP TABLE users CASCADE",
			"CREATE TABLE public.sneaky (id int)",
		} {
			tx, err := conn.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadWrite})
			if err != nil {
				t.Fatalf("begin read-write: %v", err)
			}
			_, err = tx.Exec(ctx, stmt)
			_ = tx.Rollback(ctx)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
				t.Fatalf("%s as gpuhost_crm_ro in a read-write transaction: err = %v, want permission denied (SQLSTATE 42501)", stmt, err)
			}
		}
		if after := db.count(t, "users"); after != before {
			t.Fatalf("users changed from %d to %d", before, after)
		}
		if n := db.count(t, "tickets"); n != 2 {
			t.Fatalf("tickets = %d, want 2", n)
		}
	})

	t.Run("statement_timeout stops a slow query", func(t *testing.T) {
		slow := mustBuild(t, `dsn_env: `+dsnVar+`
statement_timeout: 300ms
templates:
  - {name: slow, description: sleeps, sql: SELECT pg_sleep(10)}
`, environ)
		_, err := call(t, slow, "crm_slow", nil)
		if err == nil || !strings.Contains(err.Error(), "statement_timeout") {
			t.Fatalf("err = %v, want cancelled by statement_timeout", err)
		}
	})

	t.Run("row cap truncates", func(t *testing.T) {
		for _, tc := range []struct {
			maxRows   int
			wantRows  int
			truncated bool
		}{{5, 5, true}, {250, 250, false}, {249, 249, true}, {1000, 250, false}} {
			capped := mustBuild(t, fmt.Sprintf("dsn_env: %s\nmax_rows: %d\n", dsnVar, tc.maxRows), environ)
			r, err := call(t, capped, "crm_search_users", map[string]any{"query": "Bulk User"})
			if err != nil {
				t.Fatalf("max_rows %d: %v", tc.maxRows, err)
			}
			if r.RowCount != tc.wantRows || len(r.Rows) != tc.wantRows || r.Truncated != tc.truncated {
				t.Errorf("max_rows %d: rows %d truncated %v, want %d %v", tc.maxRows, r.RowCount, r.Truncated, tc.wantRows, tc.truncated)
			}
			if r.Truncated != strings.Contains(r.Note, "truncated") {
				t.Errorf("max_rows %d: note %q does not match truncated=%v", tc.maxRows, r.Note, r.Truncated)
			}
		}
	})

	t.Run("wrong password is refused without echoing it", func(t *testing.T) {
		const wrong = "wrong-canary-pw-55d1e0"
		bad := strings.Replace(db.roDSN, roPassword, wrong, 1)
		tl := mustBuild(t, "dsn_env: "+dsnVar+"\n", map[string]string{dsnVar: bad})
		_, err := call(t, tl, "crm_search_users", map[string]any{"query": "a"})
		if err == nil {
			t.Fatal("call with a wrong password succeeded")
		}
		if strings.Contains(err.Error(), wrong) || strings.Contains(err.Error(), roPassword) {
			t.Fatalf("error leaks the password: %v", err)
		}
		if !strings.Contains(err.Error(), "refused the login") || !strings.Contains(err.Error(), dsnVar) {
			t.Fatalf("err = %v, want a login refusal naming %s", err, dsnVar)
		}
	})

	t.Run("round trip through the MCP server", func(t *testing.T) { roundTrip(t, db) })

	t.Run("results never contain the password", func(t *testing.T) {
		r, err := call(t, tools, "crm_search_users", map[string]any{"query": ""})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(r)
		if strings.Contains(string(b), roPassword) {
			t.Fatal("result contains the DSN password")
		}
	})
}

// TestDSNMissing: no DSN in the environment is a *connector.MissingSecretError
// naming the variable, before any connection attempt.
func TestDSNMissing(t *testing.T) {
	tools := mustBuild(t, "dsn_env: CRM_NOT_SET_DSN\n", map[string]string{})
	_, err := call(t, tools, "crm_search_users", map[string]any{"query": "a"})
	var miss *connector.MissingSecretError
	if !errors.As(err, &miss) || miss.Name != "CRM_NOT_SET_DSN" {
		t.Fatalf("err = %v (%T), want *connector.MissingSecretError for CRM_NOT_SET_DSN", err, err)
	}
}

// TestDatabaseDown: nothing listening is a clear error, not a hang, and the
// password stays out of it.
func TestDatabaseDown(t *testing.T) {
	const pw = "down-canary-pw-e4b2"
	for _, dsn := range []string{
		fmt.Sprintf("postgres://gpuhost_crm_ro:%s@127.0.0.1:%d/crm?sslmode=disable&connect_timeout=5", pw, testkit.FreePort(t)),
		fmt.Sprintf("host=127.0.0.1 port=%d user=gpuhost_crm_ro password=%s dbname=crm sslmode=disable", testkit.FreePort(t), pw),
	} {
		tools := mustBuild(t, "dsn_env: "+dsnVar+"\n", map[string]string{dsnVar: dsn})
		_, err := call(t, tools, "crm_customer_history", map[string]any{"user_id": float64(1)})
		if err == nil || !strings.Contains(err.Error(), "cannot reach the CRM database at 127.0.0.1:") {
			t.Fatalf("err = %v, want 'cannot reach the CRM database'", err)
		}
		if strings.Contains(err.Error(), pw) {
			t.Fatalf("error leaks the password: %v", err)
		}
	}
}

// TestBadDSN: a DSN that does not parse is reported without echoing it.
func TestBadDSN(t *testing.T) {
	const dsn = "postgres://u:bad-dsn-pw-91@[::1:5432/crm" // broken IPv6 literal
	tools := mustBuild(t, "dsn_env: "+dsnVar+"\n", map[string]string{dsnVar: dsn})
	_, err := call(t, tools, "crm_search_users", map[string]any{"query": "a"})
	if err == nil || !strings.Contains(err.Error(), "not a valid PostgreSQL connection string") {
		t.Fatalf("err = %v, want invalid DSN", err)
	}
	if strings.Contains(err.Error(), "bad-dsn-pw-91") {
		t.Fatalf("error leaks the password: %v", err)
	}
}
