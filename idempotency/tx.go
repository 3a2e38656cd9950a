package idempotency

import (
	"context"

	"github.com/jackc/pgx/v5"
)

type txKey struct{}

// TxFromContext returns the transaction that ModeTransactional opened for the
// request: the handler's writes through it commit together with the claim and
// the stored response, or not at all. Its Commit and Rollback return
// ErrTxOwned; nested Begin (a savepoint) works as usual. ok is false outside
// ModeTransactional.
func TxFromContext(ctx context.Context) (tx pgx.Tx, ok bool) {
	tx, ok = ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok
}

// ownedTx is the request's transaction as the handler sees it: everything
// but ending it.
type ownedTx struct{ pgx.Tx }

func (ownedTx) Commit(context.Context) error   { return ErrTxOwned }
func (ownedTx) Rollback(context.Context) error { return ErrTxOwned }
