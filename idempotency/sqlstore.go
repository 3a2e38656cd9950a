package idempotency

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idempotency/internal/dbsqlc"
	"github.com/idemkit/idem/internal/sqlpgx"
)

// SQLStore is PostgresStore over database/sql (lib/pq, pgx's stdlib
// driver, or the *sql.DB under an ORM): the same table, the same
// statements, the same guarantees, for a service that has no pgx pool.
// Over a SQLStore, ModeTransactional gives the handler the request's
// *sql.Tx (SQLTxFromContext) instead of a pgx.Tx: the claim, the
// handler's writes and the stored response commit in that one
// transaction.
//
// BEGIN and COMMIT are round trips of their own here (database/sql sends
// them by itself), where PostgresStore on a pool pipelines them with the
// claim and the record. On pgx's stdlib driver the claim's statements
// still share one round trip (see BeginClaim).
type SQLStore struct {
	db     *sql.DB
	pg     *PostgresStore // its statements, on db
	notPgx atomic.Bool    // db's driver is not pgx's stdlib: no pipelined claim
}

// NewSQLStore returns a store over db.
func NewSQLStore(db *sql.DB) *SQLStore {
	return &SQLStore{db: db, pg: &PostgresStore{q: dbsqlc.New(sqlpgx.DB{Q: db})}}
}

var _ TxStore = (*SQLStore)(nil)

// Claim implements Store.
func (s *SQLStore) Claim(ctx context.Context, c Claim) (ClaimResult, error) {
	return s.pg.Claim(ctx, c)
}

// Renew implements Store.
func (s *SQLStore) Renew(ctx context.Context, key KeyHash, fence int64, lease time.Duration) error {
	return s.pg.Renew(ctx, key, fence, lease)
}

// Complete implements Store.
func (s *SQLStore) Complete(ctx context.Context, key KeyHash, fence int64, resp *Response, retention time.Duration) error {
	return s.pg.Complete(ctx, key, fence, resp, retention)
}

// Release implements Store.
func (s *SQLStore) Release(ctx context.Context, key KeyHash, fence int64) error {
	return s.pg.Release(ctx, key, fence)
}

// Purge implements Store.
func (s *SQLStore) Purge(ctx context.Context, limit int) (int, error) { return s.pg.Purge(ctx, limit) }

// BeginClaim implements TxStore as PostgresStore's does, in a *sql.Tx:
// BEGIN, the try-lock on the key, the read of its record and the
// handler's savepoint.
//
// On pgx's stdlib driver the lock, the read and the savepoint travel in
// one round trip, pipelined on the *pgx.Conn under the transaction's
// connection (see beginClaimPgx); on any other driver (lib/pq) each is a
// statement of its own. BEGIN and COMMIT stay database/sql's, a round trip
// each: database/sql sends them by itself.
//
// The transaction is begun on ctx without its cancellation, since
// database/sql rolls a transaction back the moment its ctx ends: the
// ClaimTx's Commit or Rollback ends it (the middleware always calls one;
// with Config.KeepOnClientGone it commits after the client hung up). ctx
// still bounds each statement.
func (s *SQLStore) BeginClaim(ctx context.Context, c Claim) (*ClaimTx, ClaimResult, error) {
	if !s.notPgx.Load() {
		return s.beginClaimPgx(ctx, c)
	}
	// A connection first, waited for under ctx (a full pool must not hold
	// the request for ever), then the transaction on it without ctx's
	// cancellation.
	conn, stx, err := s.beginOnConn(ctx)
	if err != nil {
		return nil, ClaimResult{}, fmt.Errorf("idempotency: begin: %w", err)
	}
	return claimStatements(ctx, &ClaimTx{claim: c, stx: stx, sconn: conn})
}

// claimStatements is the claim of BeginClaim on any driver, in ct's
// transaction: the lock, the read and the savepoint, one statement each.
func claimStatements(ctx context.Context, ct *ClaimTx) (*ClaimTx, ClaimResult, error) {
	q := dbsqlc.New(sqlpgx.DB{Q: ct.stx})
	got, err := q.TxLock(ctx, lockID(ct.claim.Key))
	var row dbsqlc.TxReadRow
	if err == nil {
		row, err = q.TxRead(ctx, dbsqlc.TxReadParams{KeyHash: ct.claim.Key[:], Fingerprint: ct.claim.Fingerprint[:]})
	}
	if err == nil {
		_, err = ct.stx.ExecContext(ctx, savepointSQL)
	}
	if err != nil {
		ct.done = true
		_ = ct.rollback(context.WithoutCancel(ctx))
		return nil, ClaimResult{}, fmt.Errorf("idempotency: claim: %w", err)
	}
	return endUnowned(ctx, ct, got, row)
}

// pgxConner is the driver connection of pgx's stdlib driver
// (*stdlib.Conn): the *pgx.Conn it runs on.
type pgxConner interface{ Conn() *pgx.Conn }

// beginClaimPgx is BeginClaim on a dedicated *sql.Conn: BEGIN through
// database/sql (so that the handler gets a real *sql.Tx, which only
// BeginTx makes), then, when the driver connection is pgx's, the lock,
// the read and the savepoint in one pgx.Batch on its *pgx.Conn, inside
// the transaction database/sql has just opened on that very connection.
// The first claim on another driver finds out, takes the statement path
// on its transaction and records that the pool is not pgx's, so that
// later claims take it from the start.
//
// Why this is legal database/sql: Conn.Raw hands f the driver connection
// under the Conn's read lock and its driverConn mutex, the same that each
// statement of the transaction takes for itself, so the batch cannot
// interleave with another statement on the connection; the transaction
// holds a read lock of the Conn until it ends, and Raw takes a second one,
// which blocks only behind Conn.Close, which nothing calls before the
// transaction ends (ClaimTx closes the Conn after its Commit or
// Rollback). f must not fail with driver.ErrBadConn nor panic: Raw would
// then close the Conn, which waits for the transaction's read lock, which
// is ours: a deadlock. So f reports through err and a recovered panic is
// re-raised after Raw returns. pgx stays usable by database/sql after the
// batch: it leaves the connection idle in the transaction (or aborted, and
// then rolled back here), as any statement of the transaction would.
func (s *SQLStore) beginClaimPgx(ctx context.Context, c Claim) (*ClaimTx, ClaimResult, error) {
	conn, stx, err := s.beginOnConn(ctx)
	if err != nil {
		return nil, ClaimResult{}, fmt.Errorf("idempotency: begin: %w", err)
	}
	ct := &ClaimTx{claim: c, stx: stx, sconn: conn}
	var (
		isPgx    bool
		got      bool
		row      dbsqlc.TxReadRow
		panicked any
	)
	_ = conn.Raw(func(dc any) error {
		pc, ok := dc.(pgxConner)
		if !ok {
			return nil
		}
		isPgx = true
		defer func() { panicked = recover() }()
		b := &pgx.Batch{}
		b.Queue(dbsqlc.TxLockSQL, lockID(c.Key)).QueryRow(func(r pgx.Row) error { return r.Scan(&got) })
		b.Queue(dbsqlc.TxReadSQL, dbsqlc.TxReadArgs(dbsqlc.TxReadParams{KeyHash: c.Key[:], Fingerprint: c.Fingerprint[:]})...).QueryRow(func(r pgx.Row) error {
			return r.Scan(&row.Outcome, &row.RetryAfterUs, &row.ExpiresInUs, &row.ResponseStatus, &row.ResponseHeaders, &row.ResponseBody)
		})
		b.Queue(savepointSQL)
		err = pc.Conn().SendBatch(ctx, b).Close()
		return nil // never an error of f's own: see above
	})
	if panicked != nil {
		ct.done = true
		_ = ct.rollback(context.WithoutCancel(ctx))
		panic(panicked)
	}
	if !isPgx {
		s.notPgx.Store(true)
		return claimStatements(ctx, ct)
	}
	if err != nil {
		// A failed batch leaves the transaction aborted: rolled back.
		ct.done = true
		_ = ct.rollback(context.WithoutCancel(ctx))
		return nil, ClaimResult{}, fmt.Errorf("idempotency: claim: %w", err)
	}
	return endUnowned(ctx, ct, got, row)
}

// beginOnConn takes a connection of s.db (waiting for one at most as long
// as ctx lets it) and begins a transaction on it. A connection the driver
// finds dead (driver.ErrBadConn) is discarded by database/sql and another
// taken, as DB.BeginTx does: three attempts in all.
func (s *SQLStore) beginOnConn(ctx context.Context) (*sql.Conn, *sql.Tx, error) {
	var err error
	for range 3 {
		var conn *sql.Conn
		conn, err = s.db.Conn(ctx)
		if err != nil {
			return nil, nil, err
		}
		var stx *sql.Tx
		stx, err = conn.BeginTx(context.WithoutCancel(ctx), nil)
		if err == nil {
			return conn, stx, nil
		}
		_ = conn.Close()
		if !errors.Is(err, driver.ErrBadConn) {
			break
		}
	}
	return nil, nil, err
}
