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

// DB is what PostgresStore needs: a *pgxpool.Pool in production, or a
// *pgx.Conn (anything else that runs statements and begins transactions).
// It is the one database interface of this package: the statements need
// Exec, Query and QueryRow, ModeTransactional needs Begin. A
// *pgxpool.Pool, a *pgx.Conn and a *pgxpool.Conn are recognised and used
// better: ModeTransactional then pipelines BEGIN with the claim and COMMIT
// with the record, on a connection it acquires (or on that connection).
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
		o, err := parseOutcome(row.Outcome)
		if err != nil {
			return ClaimResult{}, err
		}
		if o == outcomeRetry {
			continue
		}
		return claimResult(o, row.Fence, row.RetryAfterUs, row.ExpiresInUs, row.ResponseStatus, row.ResponseHeaders, row.ResponseBody)
	}
	return ClaimResult{Outcome: OutcomeInProgress, RetryAfter: time.Second}, nil
}

// outcomeRetry is the claim statement's "run me again" (see queries.sql);
// it never leaves this file.
const outcomeRetry Outcome = -1

// parseOutcome turns the statements' outcome text into the enum, once, at
// the boundary.
func parseOutcome(s string) (Outcome, error) {
	switch s {
	case "claimed":
		return OutcomeClaimed, nil
	case "took_over":
		return OutcomeTookOver, nil
	case "in_progress":
		return OutcomeInProgress, nil
	case "completed":
		return OutcomeCompleted, nil
	case "mismatch":
		return OutcomeMismatch, nil
	case "retry":
		return outcomeRetry, nil
	}
	return 0, fmt.Errorf("idempotency: unknown claim outcome %q", s)
}

func claimResult(o Outcome, fence, retryUs, expiresUs int64, status int32, headers, body []byte) (ClaimResult, error) {
	switch o {
	case OutcomeClaimed, OutcomeTookOver:
		return ClaimResult{Outcome: o, Fence: fence}, nil
	case OutcomeInProgress:
		ra := time.Duration(retryUs) * time.Microsecond
		if ra <= 0 {
			ra = time.Second
		}
		return ClaimResult{Outcome: o, RetryAfter: ra}, nil
	case OutcomeCompleted:
		resp := &Response{Status: int(status), Header: http.Header{}, Body: body}
		if resp.Body == nil {
			resp.Body = []byte{}
		}
		if len(headers) > 0 {
			if err := json.Unmarshal(headers, &resp.Header); err != nil {
				return ClaimResult{}, fmt.Errorf("idempotency: stored headers: %w", err)
			}
		}
		return ClaimResult{Outcome: o, Response: resp, ExpiresIn: time.Duration(expiresUs) * time.Microsecond}, nil
	}
	return ClaimResult{Outcome: o}, nil // OutcomeMismatch
}

// Renew implements Store.
func (s *PostgresStore) Renew(ctx context.Context, key KeyHash, fence int64, lease time.Duration) error {
	n, err := s.q.Renew(ctx, dbsqlc.RenewParams{KeyHash: key[:], Fence: fence, LeaseS: lease.Seconds()})
	if err != nil {
		return fmt.Errorf("idempotency: renew: %w", err)
	}
	if n == 0 {
		return ErrFenced
	}
	return nil
}

// Complete implements Store.
func (s *PostgresStore) Complete(ctx context.Context, key KeyHash, fence int64, resp *Response, retention time.Duration) error {
	hdr, body, err := encodeResponse(resp)
	if err != nil {
		return err
	}
	n, err := s.q.Complete(ctx, dbsqlc.CompleteParams{
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

func encodeResponse(resp *Response) (headers, body []byte, err error) {
	headers, err = json.Marshal(resp.Header)
	if err != nil {
		return nil, nil, fmt.Errorf("idempotency: encode headers: %w", err)
	}
	body = resp.Body
	if body == nil {
		body = []byte{}
	}
	return headers, body, nil
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

// BeginClaim implements TxStore: BEGIN, a try-lock on the key and a read of
// its record (see TxLock and TxRead in queries.sql), then a savepoint that
// the handler's writes run under (see ClaimTx.Commit). Nothing is written
// until the commit. Over a pool (*pgxpool.Pool) or one connection
// (*pgx.Conn, *pgxpool.Conn) the four statements travel in one pgx.Batch:
// one round trip, and so do the record and the COMMIT. ClaimResult.Fence is 0: the
// transaction itself is the fence.
func (s *PostgresStore) BeginClaim(ctx context.Context, c Claim) (*ClaimTx, ClaimResult, error) {
	var (
		ct  *ClaimTx
		got bool
		row dbsqlc.TxReadRow
	)
	readArgs := dbsqlc.TxReadParams{KeyHash: c.Key[:], Fingerprint: c.Fingerprint[:]}
	var pt *pipeTx
	if a, ok := s.db.(acquirer); ok {
		pc, err := a.Acquire(ctx)
		if err != nil {
			return nil, ClaimResult{}, fmt.Errorf("idempotency: acquire: %w", err)
		}
		pt = &pipeTx{pc: pc, conn: pc.Conn()}
	} else if conn, ok := dedicated(s.db); ok {
		pt = &pipeTx{conn: conn}
	}
	if pt != nil {
		b := &pgx.Batch{}
		b.Queue("begin")
		b.Queue(dbsqlc.TxLockSQL, lockID(c.Key)).QueryRow(func(r pgx.Row) error { return r.Scan(&got) })
		b.Queue(dbsqlc.TxReadSQL, dbsqlc.TxReadArgs(readArgs)...).QueryRow(func(r pgx.Row) error {
			return r.Scan(&row.Outcome, &row.RetryAfterUs, &row.ExpiresInUs, &row.ResponseStatus, &row.ResponseHeaders, &row.ResponseBody)
		})
		b.Queue(savepointSQL)
		if err := pt.conn.SendBatch(ctx, b).Close(); err != nil {
			// A failed batch leaves the transaction aborted (or never
			// begun): it is rolled back (the pool would destroy a
			// connection released inside one anyway).
			_ = pt.Rollback(context.WithoutCancel(ctx))
			return nil, ClaimResult{}, fmt.Errorf("idempotency: claim: %w", err)
		}
		ct = &ClaimTx{claim: c, tx: pt, pipe: pt}
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
		if err == nil {
			_, err = btx.Exec(ctx, savepointSQL)
		}
		if err != nil {
			_ = btx.Rollback(context.WithoutCancel(ctx))
			return nil, ClaimResult{}, fmt.Errorf("idempotency: claim: %w", err)
		}
		ct = &ClaimTx{claim: c, tx: btx}
	}
	return endUnowned(ctx, ct, got, row)
}

// endUnowned turns the lock and the read of BeginClaim into its result,
// and ends ct unless the key is ours.
func endUnowned(ctx context.Context, ct *ClaimTx, got bool, row dbsqlc.TxReadRow) (*ClaimTx, ClaimResult, error) {
	o, err := parseOutcome(row.Outcome)
	var res ClaimResult
	if err == nil {
		if !got && (o == OutcomeClaimed || o == OutcomeTookOver) {
			// Another transaction holds the key: its record is not
			// committed yet, so we cannot see it (nor compare fingerprints).
			o = OutcomeInProgress
		}
		res, err = claimResult(o, 0, row.RetryAfterUs, row.ExpiresInUs, row.ResponseStatus, row.ResponseHeaders, row.ResponseBody)
	}
	if err == nil && (res.Outcome == OutcomeClaimed || res.Outcome == OutcomeTookOver) {
		return ct, res, nil
	}
	// Not ours: end the transaction (and its advisory lock) now.
	if rerr := ct.Rollback(context.WithoutCancel(ctx)); rerr != nil && err == nil {
		err = fmt.Errorf("idempotency: rollback: %w", rerr)
	}
	return nil, res, err
}
