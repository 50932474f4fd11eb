package pgtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"gpuhost/mcp/connectors/crm/pgtest"
)

// TestStart proves the harness gives a server that answers queries and that
// stop really stops it.
func TestStart(t *testing.T) {
	dsn, stop := pgtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect %q: %v", dsn, err)
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT 40 + 2").Scan(&n); err != nil || n != 42 {
		t.Fatalf("SELECT 40+2 = %d, %v", n, err)
	}
	_ = conn.Close(ctx)
	stop()
	if c, err := pgx.Connect(ctx, dsn); err == nil {
		_ = c.Close(ctx)
		t.Fatal("server still answers after stop")
	}
	stop() // idempotent
}
