package pgtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// CRM is a throw-away PostgreSQL holding database crm with a test's schema
// and data, and the read-only role of scripts/crm-readonly-role.sql able to
// log in: what the crm connector and the triage customer lookup read.
type CRM struct {
	AdminDSN string // superuser, database crm
	RoleDSN  string // gpuhost_crm_ro over TCP with the password
	Port     uint16
}

// StartCRM starts PostgreSQL (or skips, see Start), creates database crm,
// runs schemaSQL, then the role script twice (it must be idempotent: an
// operator re-runs it after a schema change) and enables the role's login
// with rolePassword.
func StartCRM(t testing.TB, schemaSQL, rolePassword string) CRM {
	t.Helper()
	dsn, _ := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect as admin: %v", err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE crm"); err != nil {
		t.Fatalf("create database crm: %v", err)
	}
	_ = admin.Close(ctx)

	adminCRM := strings.Replace(dsn, "dbname=postgres", "dbname=crm", 1)
	conn, err := pgx.Connect(ctx, adminCRM)
	if err != nil {
		t.Fatalf("connect to crm as admin: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.PgConn().Exec(ctx, schemaSQL).ReadAll(); err != nil {
		t.Fatalf("create schema and sample data: %v", err)
	}
	script, err := os.ReadFile(roleScript())
	if err != nil {
		t.Fatalf("read the role script: %v", err)
	}
	for i := 1; i <= 2; i++ {
		if _, err := conn.PgConn().Exec(ctx, string(script)).ReadAll(); err != nil {
			t.Fatalf("run scripts/crm-readonly-role.sql (run %d): %v", i, err)
		}
	}
	if _, err := conn.Exec(ctx, "ALTER ROLE gpuhost_crm_ro LOGIN PASSWORD '"+rolePassword+"'"); err != nil {
		t.Fatalf("enable role login: %v", err)
	}
	port := conn.Config().Port
	return CRM{
		AdminDSN: adminCRM,
		RoleDSN:  fmt.Sprintf("postgres://gpuhost_crm_ro:%s@127.0.0.1:%d/crm?sslmode=disable", rolePassword, port),
		Port:     port,
	}
}

// roleScript is scripts/crm-readonly-role.sql of this checkout, found from
// this file's place so any package's test can call StartCRM.
func roleScript() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "..", "scripts", "crm-readonly-role.sql")
}
