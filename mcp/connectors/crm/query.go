package crm

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"gpuhost/mcp/connector"
	"gpuhost/mcp/connectors/crm/crmwire"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// Result is the tool's answer; its shape lives in crmwire for readers that
// must not link this package's PostgreSQL driver.
type Result = crmwire.Result

// database runs templates. It opens one connection per call with the DSN
// read at that moment, so a rotated password or a fixed environment takes
// effect without a restart, and no connection outlives a call.
type database struct {
	secrets *connector.Secrets
	dsnEnv  string
	timeout time.Duration
	maxRows int
	log     *slog.Logger
}

// connectTimeout bounds connecting on top of the statement timeout.
const connectTimeout = 10 * time.Second

func (db *database) handler(tpl Template) func(context.Context, connector.Args) (any, error) {
	return func(ctx context.Context, args connector.Args) (any, error) {
		vals, err := BindArgs(tpl, args)
		if err != nil {
			return nil, fmt.Errorf("crm_%s: %w", tpl.Name, err)
		}
		res, err := db.Run(ctx, tpl, vals)
		if err != nil {
			return nil, err
		}
		return res, nil
	}
}

// Run executes tpl with already-bound values inside a READ ONLY
// transaction with SET LOCAL statement_timeout, reading at most maxRows
// rows. Errors are phrased for the model and never contain the DSN's
// password (they are scrubbed of the whole DSN and its password here, on
// top of the registry's scrubbing).
func (db *database) Run(ctx context.Context, tpl Template, vals []any) (*Result, error) {
	dsn, err := db.secrets.Get(db.dsnEnv)
	if err != nil {
		return nil, err // *connector.MissingSecretError names the variable
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("crm_%s: the DSN in %s is not a valid PostgreSQL connection string: %s",
			tpl.Name, db.dsnEnv, scrub(err.Error(), dsn, ""))
	}
	password := cfg.Password
	s := func(err error) string { return scrub(err.Error(), dsn, password) }
	where := fmt.Sprintf("%s:%d", cfg.Host, cfg.Port)
	if strings.HasPrefix(cfg.Host, "/") {
		where = cfg.Host
	}
	cfg.ConnectTimeout = connectTimeout

	// The whole call is bounded even if the server ignores the timeout.
	ctx, cancel := context.WithTimeout(ctx, connectTimeout+db.timeout+5*time.Second)
	defer cancel()

	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "28P01" || pgErr.Code == "28000") {
			return nil, fmt.Errorf("crm_%s: the CRM database at %s refused the login of role %q from %s (%s); the operator must fix the credentials, retrying will not help",
				tpl.Name, where, cfg.User, db.dsnEnv, pgErr.Message)
		}
		return nil, fmt.Errorf("crm_%s: cannot reach the CRM database at %s (is it running?): %s", tpl.Name, where, s(err))
	}
	defer func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer ccancel()
		_ = conn.Close(cctx)
	}()

	tx, err := conn.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("crm_%s: begin a read-only transaction on %s: %s", tpl.Name, where, s(err))
	}
	defer func() { // read-only: nothing to commit
		rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer rcancel()
		_ = tx.Rollback(rctx)
	}()

	ms := db.timeout.Milliseconds()
	if ms < 1 {
		ms = 1
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL statement_timeout = %d", ms)); err != nil {
		return nil, fmt.Errorf("crm_%s: set statement_timeout on %s: %s", tpl.Name, where, s(err))
	}

	start := time.Now()
	rows, err := tx.Query(ctx, tpl.SQL, vals...)
	if err != nil {
		return nil, db.queryError(tpl, err, s)
	}
	defer rows.Close()
	fields := rows.FieldDescriptions()
	res := &Result{Template: tpl.Name, Columns: make([]string, len(fields)), Rows: []map[string]any{}, MaxRows: db.maxRows}
	for i, f := range fields {
		res.Columns[i] = f.Name
	}
	for rows.Next() {
		if len(res.Rows) == db.maxRows {
			res.Truncated = true
			break
		}
		values, err := rows.Values()
		if err != nil {
			return nil, fmt.Errorf("crm_%s: decode row %d: %s", tpl.Name, len(res.Rows)+1, s(err))
		}
		row := make(map[string]any, len(values))
		for i, v := range values {
			row[fields[i].Name] = jsonValue(v, fields[i].DataTypeOID)
		}
		res.Rows = append(res.Rows, row)
	}
	rows.Close()
	if err := rows.Err(); err != nil && !res.Truncated {
		return nil, db.queryError(tpl, err, s)
	}
	res.RowCount = len(res.Rows)
	if res.Truncated {
		res.Note = fmt.Sprintf("truncated: more than %d rows matched; narrow the search", db.maxRows)
	}
	db.log.Debug("crm template ran", "template", tpl.Name, "rows", res.RowCount, "truncated", res.Truncated, "duration", time.Since(start))
	return res, nil
}

// queryError turns a PostgreSQL error into a message a model (and the
// operator reading the audit log) can act on.
func (db *database) queryError(tpl Template, err error, s func(error) string) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "25006": // read_only_sql_transaction
			return fmt.Errorf("crm_%s: refused: the template tries to change data, and CRM tools only read (read-only transaction: %s); the operator must fix this template", tpl.Name, pgErr.Message)
		case "42501": // insufficient_privilege
			return fmt.Errorf("crm_%s: refused by the database: the CRM role lacks the privilege (%s); the operator must fix the template or grant SELECT", tpl.Name, pgErr.Message)
		case "57014": // query_canceled (statement_timeout)
			return fmt.Errorf("crm_%s: the query ran longer than the %s statement_timeout and was cancelled; narrow the search and try again", tpl.Name, db.timeout)
		case "22P02", "22007", "22008", "22003": // bad text/date representation, out of range
			return fmt.Errorf("crm_%s: a parameter value was not valid for the database: %s", tpl.Name, pgErr.Message)
		}
		return fmt.Errorf("crm_%s: the database rejected the query (SQLSTATE %s): %s", tpl.Name, pgErr.Code, pgErr.Message)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("crm_%s: the CRM database did not answer in time: %s", tpl.Name, s(err))
	}
	return fmt.Errorf("crm_%s: query failed: %s", tpl.Name, s(err))
}

// scrub removes the DSN and its password from a message. The registry
// scrubs secret values too; this keeps the password out of this package's
// own errors even when the registry is bypassed (tests, other callers).
func scrub(msg, dsn, password string) string {
	if dsn != "" {
		msg = strings.ReplaceAll(msg, dsn, "[DSN]")
	}
	if password != "" {
		msg = strings.ReplaceAll(msg, password, "[REDACTED]")
	}
	return msg
}

// jsonValue converts a decoded PostgreSQL value to something that
// marshals to plain, readable JSON.
func jsonValue(v any, oid uint32) any {
	switch x := v.(type) {
	case nil, bool, string, int16, int32, int64, float32, float64:
		return x
	case time.Time:
		if oid == pgtype.DateOID {
			return x.Format("2006-01-02")
		}
		return x.Format(time.RFC3339Nano)
	case pgtype.Numeric:
		if !x.Valid {
			return nil
		}
		dv, err := x.Value()
		str, ok := dv.(string)
		if err != nil || !ok {
			return nil
		}
		if json.Valid([]byte(str)) {
			return json.Number(str) // exact: no float rounding of amounts
		}
		return str // NaN, Infinity
	case [16]byte: // uuid
		h := hex.EncodeToString(x[:])
		return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
	case []byte:
		return x // base64 in JSON
	case net.IPNet:
		return x.String()
	case pgtype.Interval:
		return fmt.Sprintf("%d months %d days %dus", x.Months, x.Days, x.Microseconds)
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = jsonValue(e, 0)
		}
		return out
	case map[string]any:
		return x // json/jsonb objects
	}
	if _, err := json.Marshal(v); err == nil {
		return v
	}
	return fmt.Sprint(v)
}
