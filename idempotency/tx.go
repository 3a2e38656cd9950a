package idempotency

import (
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5"
)

// txKey's value in a handler's ctx is the request's *ClaimTx.
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
// ModeTransactional, and over a SQLStore (use SQLTxFromContext).
func TxFromContext(ctx context.Context) (tx pgx.Tx, ok bool) {
	ct, ok := ctx.Value(txKey{}).(*ClaimTx)
	if !ok || ct.tx == nil {
		return nil, false
	}
	return ct.Tx(), true
}

// SQLTxFromContext is TxFromContext for a middleware over a SQLStore: the
// request's database/sql transaction, in which the claim was taken and in
// which the stored response will be written, under a savepoint opened for
// the handler. Write through it (or an ORM opened on it); never Commit or
// Roll it back: the middleware does, and a handler that commits it itself
// commits its writes without the record, so that a retry runs it again
// (the middleware then answers 503 and reports ErrTxOwned). ok is false
// outside ModeTransactional, and over a PostgresStore.
func SQLTxFromContext(ctx context.Context) (tx *sql.Tx, ok bool) {
	ct, ok := ctx.Value(txKey{}).(*ClaimTx)
	if !ok || ct.stx == nil {
		return nil, false
	}
	return ct.stx, true
}

// ownedTx is the request's transaction as the handler sees it: everything
// but ending it.
type ownedTx struct{ pgx.Tx }

func (ownedTx) Commit(context.Context) error   { return ErrTxOwned }
func (ownedTx) Rollback(context.Context) error { return ErrTxOwned }
