package idempotency

import (
	"context"
	"database/sql"
	"fmt"
	"time"

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
// claim and the record.
type SQLStore struct {
	db *sql.DB
	pg *PostgresStore // its statements, on db
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
// The transaction is begun on ctx without its cancellation, since
// database/sql rolls a transaction back the moment its ctx ends: the
// ClaimTx's Commit or Rollback ends it (the middleware always calls one;
// with Config.KeepOnClientGone it commits after the client hung up). ctx
// still bounds each statement.
func (s *SQLStore) BeginClaim(ctx context.Context, c Claim) (*ClaimTx, ClaimResult, error) {
	stx, err := s.db.BeginTx(context.WithoutCancel(ctx), nil)
	if err != nil {
		return nil, ClaimResult{}, fmt.Errorf("idempotency: begin: %w", err)
	}
	q := dbsqlc.New(sqlpgx.DB{Q: stx})
	got, err := q.TxLock(ctx, lockID(c.Key))
	var row dbsqlc.TxReadRow
	if err == nil {
		row, err = q.TxRead(ctx, dbsqlc.TxReadParams{KeyHash: c.Key[:], Fingerprint: c.Fingerprint[:]})
	}
	if err == nil {
		_, err = stx.ExecContext(ctx, savepointSQL)
	}
	if err != nil {
		_ = stx.Rollback()
		return nil, ClaimResult{}, fmt.Errorf("idempotency: claim: %w", err)
	}
	return endUnowned(ctx, &ClaimTx{claim: c, stx: stx}, got, row)
}
