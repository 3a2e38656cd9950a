// Package sqlpgx runs idem's sqlc queries, generated for pgx, on a
// database/sql transaction: DB gives a *sql.Tx (or *sql.DB, *sql.Conn) the
// Exec/Query/QueryRow shape of pgx that the generated code calls, so that
// the pgx entry points and their database/sql twins share one query text
// and one Go path. It works with any PostgreSQL driver (lib/pq, pgx's
// stdlib): Go slices, which lib/pq cannot send, travel as PostgreSQL array
// literals, which the server parses for the query's ::text[], ::bytea[] or
// ::bigint[] cast.
package sqlpgx

import (
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// Querier is what *sql.Tx, *sql.DB and *sql.Conn have in common.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// DB is a Querier seen as pgx's DBTX (Exec, Query, QueryRow).
type DB struct{ Q Querier }

// Exec runs a statement; the command tag carries only the rows affected.
func (d DB) Exec(ctx context.Context, query string, args ...any) (pgconn.CommandTag, error) {
	res, err := d.Q.ExecContext(ctx, query, convert(args)...)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return pgconn.NewCommandTag("SQL " + strconv.FormatInt(n, 10)), nil
}

// Query runs a query.
func (d DB) Query(ctx context.Context, query string, args ...any) (pgx.Rows, error) {
	rs, err := d.Q.QueryContext(ctx, query, convert(args)...)
	if err != nil {
		return nil, err
	}
	return &rows{rs: rs}, nil
}

// QueryRow runs a query for one row; Scan reports pgx.ErrNoRows when
// there is none, as pgx does (the generated code and its callers test for
// that error).
func (d DB) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	rs, err := d.Query(ctx, query, args...)
	return row{rs: rs, err: err}
}

type row struct {
	rs  pgx.Rows
	err error
}

func (r row) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rs.Close()
	if !r.rs.Next() {
		if err := r.rs.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rs.Scan(dest...); err != nil {
		return err
	}
	r.rs.Close()
	return r.rs.Err()
}

type rows struct {
	rs     *sql.Rows
	closed bool
}

func (r *rows) Close() {
	if !r.closed {
		r.closed = true
		_ = r.rs.Close()
	}
}
func (r *rows) Err() error { return r.rs.Err() }
func (r *rows) Next() bool {
	if r.rs.Next() {
		return true
	}
	r.Close()
	return false
}
func (r *rows) Scan(dest ...any) error                       { return r.rs.Scan(dest...) }
func (r *rows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (r *rows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (r *rows) RawValues() [][]byte                          { return nil }
func (r *rows) Conn() *pgx.Conn                              { return nil }
func (r *rows) TypeMap() *pgtype.Map                         { return nil }

var errValues = errors.New("sqlpgx: Values is not supported over database/sql")

func (r *rows) Values() ([]any, error) { return nil, errValues }

// convert turns the slices sqlc passes for array parameters into array
// literals; every other argument goes to the driver as it is.
func convert(args []any) []any {
	out, copied := args, false
	for i, a := range args {
		var lit string
		switch v := a.(type) {
		case []string:
			lit = textArray(v)
		case [][]byte:
			lit = byteaArray(v)
		case []int64:
			lit = int64Array(v)
		default:
			continue
		}
		if !copied {
			out, copied = append([]any(nil), args...), true
		}
		out[i] = lit
	}
	return out
}

func textArray(v []string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, s := range v {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for j := 0; j < len(s); j++ {
			if s[j] == '"' || s[j] == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(s[j])
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

func byteaArray(v [][]byte) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, s := range v {
		if i > 0 {
			b.WriteByte(',')
		}
		// "\\x…": the array literal unescapes \\ to the \ of bytea's hex form.
		b.WriteString(`"\\x`)
		b.WriteString(hex.EncodeToString(s))
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

func int64Array(v []int64) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, n := range v {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(n, 10))
	}
	b.WriteByte('}')
	return b.String()
}

// SQLState returns the SQLSTATE of a driver's server error (pgconn's
// *PgError and lib/pq's *Error both have the method), or "".
func SQLState(err error) string {
	var s interface{ SQLState() string }
	if errors.As(err, &s) {
		return s.SQLState()
	}
	return ""
}
