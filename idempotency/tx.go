package idempotency

import (
	"context"

	"github.com/jackc/pgx/v5"
)

type txKey struct{}

type principalKey struct{}

// PrincipalFromContext returns the principal that Config.Scope computed
// for the request the middleware is serving, so that a handler uses the
// very value its Idempotency-Key was scoped by. ok is false outside the
// middleware (and for a request it refused before Scope ran).
func PrincipalFromContext(ctx context.Context) (principal string, ok bool) {
	principal, ok = ctx.Value(principalKey{}).(string)
	return principal, ok
}

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
