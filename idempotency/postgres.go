package idempotency

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
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
		res, retry, err := claimResult(row.Outcome, row.Fence, row.RetryAfterUs, row.ResponseStatus, row.ResponseHeaders, row.ResponseBody)
		if err != nil || !retry {
			return res, err
		}
	}
	return ClaimResult{Outcome: OutcomeInProgress, RetryAfter: time.Second}, nil
}

func claimResult(outcome string, fence, retryUs int64, status int32, headers, body []byte) (ClaimResult, bool, error) {
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
		return ClaimResult{Outcome: OutcomeCompleted, Response: resp}, false, nil
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

// BeginClaim implements TxStore: BEGIN, then the claim as the first
// statement of the transaction.
func (s *PostgresStore) BeginClaim(ctx context.Context, c Claim) (pgx.Tx, ClaimResult, error) {
	for range claimAttempts {
		tx, err := s.db.Begin(ctx)
		if err != nil {
			return nil, ClaimResult{}, fmt.Errorf("idempotency: begin: %w", err)
		}
		row, err := dbsqlc.New(tx).ClaimTx(ctx, dbsqlc.ClaimTxParams{
			KeyHash:     c.Key[:],
			Fingerprint: c.Fingerprint[:],
			LockID:      lockID(c.Key),
			LeaseS:      c.Lease.Seconds(),
			RetentionS:  c.Retention.Seconds(),
		})
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			return nil, ClaimResult{}, fmt.Errorf("idempotency: claim: %w", err)
		}
		res, retry, err := claimResult(row.Outcome, row.Fence, row.RetryAfterUs, row.ResponseStatus, row.ResponseHeaders, row.ResponseBody)
		if err == nil && !retry && (res.Outcome == OutcomeClaimed || res.Outcome == OutcomeTookOver) {
			return tx, res, nil
		}
		if rerr := tx.Rollback(context.WithoutCancel(ctx)); rerr != nil && err == nil {
			err = fmt.Errorf("idempotency: rollback: %w", rerr)
		}
		if err != nil || !retry {
			return nil, res, err
		}
	}
	return nil, ClaimResult{Outcome: OutcomeInProgress, RetryAfter: time.Second}, nil
}

// CommitComplete implements TxStore.
func (s *PostgresStore) CommitComplete(ctx context.Context, tx pgx.Tx, key KeyHash, fence int64, resp *Response, retention time.Duration) error {
	if err := complete(ctx, dbsqlc.New(tx), key, fence, resp, retention); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		if errors.Is(err, pgx.ErrTxCommitRollback) {
			return fmt.Errorf("idempotency: commit rolled back: %w", err)
		}
		return fmt.Errorf("idempotency: commit: %w", err)
	}
	return nil
}
