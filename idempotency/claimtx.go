package idempotency

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/idempotency/internal/dbsqlc"
	"github.com/idemkit/idem/internal/sqlpgx"
)

// savepointSQL opens the savepoint the handler's writes run under, right
// after the claim (in the same round trip over a pool or a connection).
const savepointSQL = "savepoint idem_handler"

// ClaimTx is an open transactional claim, from TxStore.BeginClaim: a
// PostgreSQL transaction that holds the key (with an advisory lock) and
// that the handler writes through. End it with Commit, which stores the
// response with the handler's writes, or Rollback; the transaction's own
// Commit and Rollback return ErrTxOwned. A ClaimTx is not safe for
// concurrent use, as a pgx.Tx is not.
type ClaimTx struct {
	claim Claim
	tx    pgx.Tx    // the transaction: a *pipeTx over a pool or a connection, else pgx's
	pipe  *pipeTx   // tx when it is a *pipeTx
	stx   *sql.Tx   // the transaction of a SQLStore (tx is nil then)
	sconn *sql.Conn // the connection stx is on, closed after it, when the SQLStore took one (see beginClaimPgx)
	done  bool
}

// Tx is the transaction to write through: what TxFromContext gives the
// handler. Nested Begin opens a savepoint as usual. It is nil for a claim
// of a SQLStore: see SQLTx.
func (t *ClaimTx) Tx() pgx.Tx {
	if t.tx == nil {
		return nil
	}
	return ownedTx{t.tx}
}

// SQLTx is the database/sql transaction to write through, for a claim of a
// SQLStore (what SQLTxFromContext gives the handler); nil for a claim of a
// PostgresStore. The ClaimTx ends it: never call its Commit or Rollback.
func (t *ClaimTx) SQLTx() *sql.Tx { return t.stx }

func (t *ClaimTx) conn() *pgx.Conn {
	if t.pipe != nil {
		return t.pipe.conn
	}
	return t.tx.Conn()
}

// Commit writes the complete record (resp, kept for retention from now)
// and commits: the claim, everything written through Tx and the response
// commit together, or nothing does. Over a pool or a connection the
// record and the COMMIT travel in one round trip. On any error the transaction is rolled back.
// ErrFenced means a two-step claim took the key meanwhile.
//
// The handler's writes run under a savepoint. If one of its statements
// failed (PostgreSQL then refuses every later statement of the
// transaction), a definitive 4xx is still stored: Commit rolls back to the
// savepoint, dropping the handler's writes, and stores the response, so
// that the retry is a replay of that 4xx and not a failure forever. Any
// other status over a failed statement is ErrTxAborted: nothing commits.
func (t *ClaimTx) Commit(ctx context.Context, resp *Response, retention time.Duration) error {
	if t.done {
		return pgx.ErrTxClosed
	}
	t.done = true
	if t.stx != nil {
		return t.commitSQL(ctx, resp, retention)
	}
	aborted := t.conn().PgConn().TxStatus() == 'E'
	if aborted && (resp.Status < 400 || resp.Status >= 500) {
		_ = t.rollback(context.WithoutCancel(ctx))
		return ErrTxAborted
	}
	hdr, body, err := encodeResponse(resp)
	if err != nil {
		_ = t.rollback(context.WithoutCancel(ctx))
		return err
	}
	params := dbsqlc.TxCompleteParams{
		KeyHash: t.claim.Key[:], Fingerprint: t.claim.Fingerprint[:], Status: int32(resp.Status), Headers: hdr, Body: body,
		RetentionS: retention.Seconds(),
	}
	if t.pipe == nil {
		if aborted {
			if _, err := t.tx.Exec(ctx, "rollback to savepoint idem_handler"); err != nil {
				_ = t.tx.Rollback(context.WithoutCancel(ctx))
				return fmt.Errorf("idempotency: rollback to savepoint: %w", err)
			}
		}
		if _, err := dbsqlc.New(t.tx).TxComplete(ctx, params); err != nil {
			_ = t.tx.Rollback(context.WithoutCancel(ctx))
			if isDivisionByZero(err) {
				return ErrFenced
			}
			return fmt.Errorf("idempotency: complete: %w", err)
		}
		if err := t.tx.Commit(ctx); err != nil {
			return fmt.Errorf("idempotency: commit: %w", err)
		}
		return nil
	}
	pt := t.pipe
	if aborted {
		// Its own round trip, on the failure path only: pgx may prepare a
		// batch's statements before it runs any, and an aborted
		// transaction refuses even the prepare.
		if _, err := pt.conn.Exec(ctx, "rollback to savepoint idem_handler"); err != nil {
			_ = pt.end(context.WithoutCancel(ctx), "rollback")
			return fmt.Errorf("idempotency: rollback to savepoint: %w", err)
		}
	}
	var commitTag pgconn.CommandTag
	b := &pgx.Batch{}
	// If the record finds the key taken (see TxComplete in queries.sql),
	// it aborts the transaction, so the COMMIT behind it rolls back.
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

// Rollback ends the claim without a trace: the key is free again, the
// handler's writes are gone. After Commit it returns pgx.ErrTxClosed.
func (t *ClaimTx) Rollback(ctx context.Context) error {
	if t.done {
		return pgx.ErrTxClosed
	}
	t.done = true
	return t.rollback(ctx)
}

func (t *ClaimTx) rollback(ctx context.Context) error {
	if t.stx != nil {
		defer t.closeConn()
		return t.stx.Rollback()
	}
	if t.pipe != nil {
		return t.pipe.Rollback(ctx)
	}
	return t.tx.Rollback(ctx)
}

// commitSQL is Commit over database/sql, which does not tell whether the
// transaction is aborted: the record's statement finds out. In an aborted
// transaction PostgreSQL refuses it (SQLSTATE 25P02) without running it,
// so for a definitive 4xx the savepoint is rolled back and the record
// written again, and for anything else nothing commits (ErrTxAborted).
// The happy path is the pgx one: the record, then COMMIT.
func (t *ClaimTx) commitSQL(ctx context.Context, resp *Response, retention time.Duration) error {
	defer t.closeConn() // after stx's end, on every path below
	hdr, body, err := encodeResponse(resp)
	if err != nil {
		_ = t.stx.Rollback()
		return err
	}
	params := dbsqlc.TxCompleteParams{
		KeyHash: t.claim.Key[:], Fingerprint: t.claim.Fingerprint[:], Status: int32(resp.Status), Headers: hdr, Body: body,
		RetentionS: retention.Seconds(),
	}
	q := dbsqlc.New(sqlpgx.DB{Q: t.stx})
	_, err = q.TxComplete(ctx, params)
	if err != nil && sqlpgx.SQLState(err) == "25P02" {
		if resp.Status < 400 || resp.Status >= 500 {
			_ = t.stx.Rollback()
			return ErrTxAborted
		}
		if _, err := t.stx.ExecContext(ctx, "rollback to savepoint idem_handler"); err != nil {
			_ = t.stx.Rollback()
			return fmt.Errorf("idempotency: rollback to savepoint: %w", err)
		}
		_, err = q.TxComplete(ctx, params)
	}
	if err != nil {
		_ = t.stx.Rollback()
		switch {
		case isDivisionByZero(err):
			return ErrFenced
		case errors.Is(err, sql.ErrTxDone):
			// The handler committed or rolled back the request's
			// transaction itself: its writes (if committed) went
			// without the record.
			return fmt.Errorf("%w: the handler ended the request's *sql.Tx: %w", ErrTxOwned, err)
		}
		return fmt.Errorf("idempotency: complete: %w", err)
	}
	if err := t.stx.Commit(); err != nil {
		return fmt.Errorf("idempotency: commit: %w", err)
	}
	return nil
}

// closeConn hands a SQLStore's dedicated connection back to its pool,
// once stx has ended (Close would wait for an open transaction).
func (t *ClaimTx) closeConn() {
	if t.sconn != nil {
		_ = t.sconn.Close()
		t.sconn = nil
	}
}
