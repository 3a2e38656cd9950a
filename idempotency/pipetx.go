package idempotency

import (
	"context"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/sqlpgx"
)

// acquirer is a pool that hands out a dedicated connection (*pgxpool.Pool).
type acquirer interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// dedicated returns db's connection when db is one connection outside any
// transaction of pgx's (a *pgx.Conn or an acquired *pgxpool.Conn), which
// the claim may pipeline on. A pgx.Tx also has a Conn but is not one: its
// Begin is a savepoint, and so must the claim's be.
func dedicated(db DB) (*pgx.Conn, bool) {
	switch c := db.(type) {
	case *pgx.Conn:
		return c, true
	case *pgxpool.Conn:
		return c.Conn(), true
	}
	return nil, false
}

// pipeTx is the request transaction of ModeTransactional when the store's
// DB gives a dedicated connection: a pool (*pgxpool.Pool, a connection
// acquired per request), or one connection (*pgx.Conn, *pgxpool.Conn).
// BEGIN is pipelined with the claim and COMMIT with the stored response
// (one pgx.Batch each), so a request pays no round trip of its own for
// BEGIN or COMMIT: claim, the handler's statements, complete+commit.
// pgx's own transaction cannot do that: it sends BEGIN by itself.
//
// It implements pgx.Tx on the connection, for TxFromContext. Nested Begin
// uses savepoints as pgx does. An acquired connection goes back to the
// pool when the transaction ends; pgxpool destroys a connection released
// inside a transaction, so a path that forgets to end it cannot leak an
// open one. A connection of the caller's own stays the caller's.
//
// pgx.Tx is an interface that pgx may extend in a minor release (pgx
// exempts it from its semver promise). The assertion below turns such an
// upgrade into a compile error here instead of a silent gap. Version
// floor: pgx v5.12.0, which go.mod requires and the tests run against
// (pgx.Tx has the same method set in v5.9.2). On a pgx that adds a method,
// add it here, delegating to the connection as the others do.
type pipeTx struct {
	pc     *pgxpool.Conn // the acquired connection, nil on the caller's own
	conn   *pgx.Conn
	sp     int64
	closed bool
	lo     pgx.Tx
}

var _ pgx.Tx = (*pipeTx)(nil)

func (t *pipeTx) release() {
	if !t.closed {
		t.closed = true
		if t.pc != nil {
			t.pc.Release()
		}
	}
}

// end sends COMMIT or ROLLBACK and releases the connection.
func (t *pipeTx) end(ctx context.Context, sql string) error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	defer t.release()
	tag, err := t.conn.Exec(ctx, sql)
	if err != nil {
		return err
	}
	if sql == "commit" && tag.String() == "ROLLBACK" {
		return pgx.ErrTxCommitRollback
	}
	return nil
}

func (t *pipeTx) Commit(ctx context.Context) error   { return t.end(ctx, "commit") }
func (t *pipeTx) Rollback(ctx context.Context) error { return t.end(ctx, "rollback") }

func (t *pipeTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.closed {
		return nil, pgx.ErrTxClosed
	}
	t.sp++
	if _, err := t.conn.Exec(ctx, "savepoint sp_"+strconv.FormatInt(t.sp, 10)); err != nil {
		return nil, err
	}
	return &savepointTx{parent: t, n: t.sp}, nil
}

func (t *pipeTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if t.closed {
		return 0, pgx.ErrTxClosed
	}
	return t.conn.CopyFrom(ctx, table, cols, src)
}

func (t *pipeTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.closed {
		return closedBatch{}
	}
	return t.conn.SendBatch(ctx, b)
}

// closedRow and closedBatch answer a handler that kept the transaction past
// its request: the connection is back in the pool, serving someone else.
type closedRow struct{}

func (closedRow) Scan(...any) error { return pgx.ErrTxClosed }

type closedBatch struct{}

func (closedBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, pgx.ErrTxClosed }
func (closedBatch) Query() (pgx.Rows, error)         { return nil, pgx.ErrTxClosed }
func (closedBatch) QueryRow() pgx.Row                { return closedRow{} }
func (closedBatch) Close() error                     { return pgx.ErrTxClosed }
func (closedBatch) Tx() pgx.Tx                       { return nil }

// LargeObjects needs a pgx-made Tx (its field is unexported): one is made
// on first use over the same, already open, transaction.
func (t *pipeTx) LargeObjects() pgx.LargeObjects {
	if t.lo == nil {
		tx, err := t.conn.BeginTx(context.Background(), pgx.TxOptions{BeginQuery: "select 1"})
		if err != nil {
			return pgx.LargeObjects{}
		}
		t.lo = tx
	}
	return t.lo.LargeObjects()
}

func (t *pipeTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if t.closed {
		return nil, pgx.ErrTxClosed
	}
	return t.conn.Prepare(ctx, name, sql)
}

func (t *pipeTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.closed {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return t.conn.Exec(ctx, sql, args...)
}

func (t *pipeTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.closed {
		return nil, pgx.ErrTxClosed
	}
	return t.conn.Query(ctx, sql, args...)
}

func (t *pipeTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.closed {
		return closedRow{}
	}
	return t.conn.QueryRow(ctx, sql, args...)
}

func (t *pipeTx) Conn() *pgx.Conn { return t.conn }

// savepointTx is a nested transaction of a pipeTx.
type savepointTx struct {
	parent *pipeTx
	n      int64
	closed bool
}

func (s *savepointTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if s.closed {
		return nil, pgx.ErrTxClosed
	}
	return s.parent.Begin(ctx)
}

func (s *savepointTx) Commit(ctx context.Context) error {
	if s.closed {
		return pgx.ErrTxClosed
	}
	s.closed = true
	_, err := s.parent.Exec(ctx, "release savepoint sp_"+strconv.FormatInt(s.n, 10))
	return err
}

func (s *savepointTx) Rollback(ctx context.Context) error {
	if s.closed {
		return pgx.ErrTxClosed
	}
	s.closed = true
	_, err := s.parent.Exec(ctx, "rollback to savepoint sp_"+strconv.FormatInt(s.n, 10))
	return err
}

func (s *savepointTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	return s.parent.CopyFrom(ctx, table, cols, src)
}
func (s *savepointTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return s.parent.SendBatch(ctx, b)
}
func (s *savepointTx) LargeObjects() pgx.LargeObjects { return s.parent.LargeObjects() }
func (s *savepointTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return s.parent.Prepare(ctx, name, sql)
}
func (s *savepointTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return s.parent.Exec(ctx, sql, args...)
}
func (s *savepointTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return s.parent.Query(ctx, sql, args...)
}
func (s *savepointTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return s.parent.QueryRow(ctx, sql, args...)
}
func (s *savepointTx) Conn() *pgx.Conn { return s.parent.conn }

// isDivisionByZero is how TxComplete reports a fenced-out claim.
// pgx's *pgconn.PgError and lib/pq's *pq.Error both carry the SQLSTATE.
func isDivisionByZero(err error) bool { return sqlpgx.SQLState(err) == "22012" }
