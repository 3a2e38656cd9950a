package idempotency

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/idempotency/internal/dbsqlc"
)

// DB is what PostgresStore needs: a *pgxpool.Pool, a *pgx.Conn or anything
// else that runs statements and begins transactions.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
}

// PostgresStore keeps records in the idempotency_key table (migration 001),
// in the schema of the connection's search_path. Lease and retention are
// measured in database time, so instances with skewed clocks agree.
type PostgresStore struct {
	db DB
	q  *dbsqlc.Queries
}

// NewPostgresStore returns a store over db.
func NewPostgresStore(db DB) *PostgresStore {
	return &PostgresStore{db: db, q: dbsqlc.New(db)}
}

var _ TxStore = (*PostgresStore)(nil)

// claimAttempts bounds the re-runs of a claim that raced a concurrent
// insert (see the retry outcome in queries.sql).
const claimAttempts = 5

// Claim implements Store in one statement (one round trip), re-run only in
// the rare race described in queries.sql.
func (s *PostgresStore) Claim(ctx context.Context, c Claim) (ClaimResult, error) {
	for range claimAttempts {
		row, err := s.q.Claim(ctx, dbsqlc.ClaimParams{
			KeyHash:     c.Key[:],
			Fingerprint: c.Fingerprint[:],
			LeaseS:      c.Lease.Seconds(),
			RetentionS:  c.Retention.Seconds(),
		})
		if err != nil {
			return ClaimResult{}, fmt.Errorf("idempotency: claim: %w", err)
		}
		res, retry, err := claimResult(row.Outcome, row.Fence, row.RetryAfterUs, row.ExpiresInUs, row.ResponseStatus, row.ResponseHeaders, row.ResponseBody)
		if err != nil || !retry {
			return res, err
		}
	}
	return ClaimResult{Outcome: OutcomeInProgress, RetryAfter: time.Second}, nil
}

func claimResult(outcome string, fence, retryUs, expiresUs int64, status int32, headers, body []byte) (ClaimResult, bool, error) {
	switch outcome {
	case "claimed":
		return ClaimResult{Outcome: OutcomeClaimed, Fence: fence}, false, nil
	case "took_over":
		return ClaimResult{Outcome: OutcomeTookOver, Fence: fence}, false, nil
	case "mismatch":
		return ClaimResult{Outcome: OutcomeMismatch}, false, nil
	case "in_progress":
		ra := time.Duration(retryUs) * time.Microsecond
		if ra <= 0 {
			ra = time.Second
		}
		return ClaimResult{Outcome: OutcomeInProgress, RetryAfter: ra}, false, nil
	case "completed":
		resp := &Response{Status: int(status), Header: http.Header{}, Body: body}
		if resp.Body == nil {
			resp.Body = []byte{}
		}
		if len(headers) > 0 {
			if err := json.Unmarshal(headers, &resp.Header); err != nil {
				return ClaimResult{}, false, fmt.Errorf("idempotency: stored headers: %w", err)
			}
		}
		return ClaimResult{Outcome: OutcomeCompleted, Response: resp, ExpiresIn: time.Duration(expiresUs) * time.Microsecond}, false, nil
	case "retry":
		return ClaimResult{}, true, nil
	}
	return ClaimResult{}, false, fmt.Errorf("idempotency: unknown claim outcome %q", outcome)
}

// Complete implements Store.
func (s *PostgresStore) Complete(ctx context.Context, key KeyHash, fence int64, resp *Response, retention time.Duration) error {
	return complete(ctx, s.q, key, fence, resp, retention)
}

func complete(ctx context.Context, q *dbsqlc.Queries, key KeyHash, fence int64, resp *Response, retention time.Duration) error {
	hdr, err := json.Marshal(resp.Header)
	if err != nil {
		return fmt.Errorf("idempotency: encode headers: %w", err)
	}
	body := resp.Body
	if body == nil {
		body = []byte{}
	}
	n, err := q.Complete(ctx, dbsqlc.CompleteParams{
		KeyHash: key[:], Fence: fence, Status: int32(resp.Status), Headers: hdr, Body: body,
		RetentionS: retention.Seconds(),
	})
	if err != nil {
		return fmt.Errorf("idempotency: complete: %w", err)
	}
	if n == 0 {
		return ErrFenced
	}
	return nil
}

// Release implements Store.
func (s *PostgresStore) Release(ctx context.Context, key KeyHash, fence int64) error {
	n, err := s.q.Release(ctx, dbsqlc.ReleaseParams{KeyHash: key[:], Fence: fence})
	if err != nil {
		return fmt.Errorf("idempotency: release: %w", err)
	}
	if n == 0 {
		return ErrFenced
	}
	return nil
}

// Purge implements Store: one DELETE of at most limit rows, skipping rows
// that other sessions hold locked.
func (s *PostgresStore) Purge(ctx context.Context, limit int) (int, error) {
	n, err := s.q.Purge(ctx, int32(limit))
	if err != nil {
		return 0, fmt.Errorf("idempotency: purge: %w", err)
	}
	return int(n), nil
}

// lockID maps a key to the bigint of pg_try_advisory_xact_lock. Two keys
// sharing one (chance 2^-64) only make one of them wait its turn.
func lockID(k KeyHash) int64 { return int64(binary.BigEndian.Uint64(k[:8])) }

// claimTx is the request transaction over a DB that is not a pool: the
// claim rides along for CommitComplete.
type claimTx struct {
	pgx.Tx
	claim Claim
}

// BeginClaim implements TxStore: BEGIN, a try-lock on the key and a read of
// its record (see TxLock and TxRead in queries.sql). Nothing is written
// until CommitComplete. With a pool (*pgxpool.Pool) the three statements
// travel in one pgx.Batch: one round trip. In this mode ClaimResult.Fence is
// 0: the transaction itself is the fence.
func (s *PostgresStore) BeginClaim(ctx context.Context, c Claim) (pgx.Tx, ClaimResult, error) {
	var (
		tx  pgx.Tx
		got bool
		row dbsqlc.TxReadRow
	)
	readArgs := dbsqlc.TxReadParams{KeyHash: c.Key[:], Fingerprint: c.Fingerprint[:]}
	if a, ok := s.db.(acquirer); ok {
		pc, err := a.Acquire(ctx)
		if err != nil {
			return nil, ClaimResult{}, fmt.Errorf("idempotency: acquire: %w", err)
		}
		pt := &pipeTx{pc: pc, conn: pc.Conn(), claim: c}
		b := &pgx.Batch{}
		b.Queue("begin")
		b.Queue(dbsqlc.TxLockSQL, lockID(c.Key)).QueryRow(func(r pgx.Row) error { return r.Scan(&got) })
		b.Queue(dbsqlc.TxReadSQL, dbsqlc.TxReadArgs(readArgs)...).QueryRow(func(r pgx.Row) error {
			return r.Scan(&row.Outcome, &row.RetryAfterUs, &row.ExpiresInUs, &row.ResponseStatus, &row.ResponseHeaders, &row.ResponseBody)
		})
		if err := pt.conn.SendBatch(ctx, b).Close(); err != nil {
			// A failed batch leaves the transaction aborted (or never
			// begun); the pool destroys a connection released inside one.
			_ = pt.Rollback(context.WithoutCancel(ctx))
			return nil, ClaimResult{}, fmt.Errorf("idempotency: claim: %w", err)
		}
		tx = pt
	} else {
		btx, err := s.db.Begin(ctx)
		if err != nil {
			return nil, ClaimResult{}, fmt.Errorf("idempotency: begin: %w", err)
		}
		q := dbsqlc.New(btx)
		got, err = q.TxLock(ctx, lockID(c.Key))
		if err == nil {
			row, err = q.TxRead(ctx, readArgs)
		}
		if err != nil {
			_ = btx.Rollback(context.WithoutCancel(ctx))
			return nil, ClaimResult{}, fmt.Errorf("idempotency: claim: %w", err)
		}
		tx = &claimTx{Tx: btx, claim: c}
	}
	outcome := row.Outcome
	if !got && (outcome == "claimed" || outcome == "took_over") {
		// Another transaction holds the key: its record is not committed
		// yet, so we cannot see it (nor compare fingerprints).
		outcome = "in_progress"
	}
	res, _, err := claimResult(outcome, 0, row.RetryAfterUs, row.ExpiresInUs, row.ResponseStatus, row.ResponseHeaders, row.ResponseBody)
	if err == nil && (res.Outcome == OutcomeClaimed || res.Outcome == OutcomeTookOver) {
		return tx, res, nil
	}
	// Not ours: end the transaction (and its advisory lock) now.
	if rerr := tx.Rollback(context.WithoutCancel(ctx)); rerr != nil && err == nil {
		err = fmt.Errorf("idempotency: rollback: %w", rerr)
	}
	return nil, res, err
}

// CommitComplete implements TxStore: it writes the complete record in tx
// and commits. For a transaction over a pool, the two travel in one
// pgx.Batch: one round trip, one commit. If the key was taken meanwhile (a
// two-step claim on the same key), the record statement aborts the
// transaction, so the COMMIT behind it rolls back, and the result is
// ErrFenced.
func (s *PostgresStore) CommitComplete(ctx context.Context, tx pgx.Tx, key KeyHash, fence int64, resp *Response, retention time.Duration) error {
	var c Claim
	switch t := tx.(type) {
	case *pipeTx:
		c = t.claim
	case *claimTx:
		c = t.claim
	default:
		return fmt.Errorf("idempotency: CommitComplete needs a transaction from BeginClaim, got %T", tx)
	}
	hdr, err := json.Marshal(resp.Header)
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return fmt.Errorf("idempotency: encode headers: %w", err)
	}
	body := resp.Body
	if body == nil {
		body = []byte{}
	}
	params := dbsqlc.TxCompleteParams{
		KeyHash: c.Key[:], Fingerprint: c.Fingerprint[:], Status: int32(resp.Status), Headers: hdr, Body: body,
		RetentionS: retention.Seconds(),
	}
	pt, ok := tx.(*pipeTx)
	if !ok {
		if _, err := dbsqlc.New(tx).TxComplete(ctx, params); err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			if isDivisionByZero(err) {
				return ErrFenced
			}
			return fmt.Errorf("idempotency: complete: %w", err)
		}
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("idempotency: commit: %w", err)
		}
		return nil
	}
	if pt.closed {
		return pgx.ErrTxClosed
	}
	var commitTag pgconn.CommandTag
	b := &pgx.Batch{}
	b.Queue(dbsqlc.TxCompleteSQL, dbsqlc.TxCompleteArgs(params)...)
	b.Queue("commit").Exec(func(ct pgconn.CommandTag) error { commitTag = ct; return nil })
	err = pt.conn.SendBatch(ctx, b).Close()
	if err == nil && commitTag.String() == "ROLLBACK" {
		err = pgx.ErrTxCommitRollback
	}
	if err != nil {
		if pt.conn.PgConn().TxStatus() != 'I' {
			_ = pt.end(context.WithoutCancel(ctx), "rollback")
		}
		pt.release()
		if isDivisionByZero(err) {
			return ErrFenced
		}
		return fmt.Errorf("idempotency: complete and commit: %w", err)
	}
	pt.release()
	return nil
}
