package consume

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/sqlpgx"
)

// backend is the Consumer's database seam: pgx (New) or database/sql
// (NewSQL). Everything above it (attempts, batches, dead letters, acks) is
// one code path; only the transaction type the handler receives differs.
type backend interface {
	begin(ctx context.Context) (txn, error)
	seen(ctx context.Context, consumerID, eventID string) (bool, error)
	// purgeDB is what the Consumer's processed_event purger deletes through.
	purgeDB() inbox.DBTX
}

// txn is one record's (or batch's) transaction: the inbox mark, the
// handler's writes, the commit.
type txn interface {
	mark(ctx context.Context, ib *inbox.Inbox, consumerID, eventID string) (bool, error)
	markBatch(ctx context.Context, ib *inbox.Inbox, consumerID string, eventIDs []string) ([]bool, error)
	handle(ctx context.Context, m *Message) error
	commit(ctx context.Context) error
	rollback(ctx context.Context)
}

type pgxBackend struct {
	db DB
	h  Handler
}

func (b pgxBackend) begin(ctx context.Context) (txn, error) {
	tx, err := b.db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return pgxTxn{tx: tx, h: b.h}, nil
}

func (b pgxBackend) purgeDB() inbox.DBTX { return b.db }

func (b pgxBackend) seen(ctx context.Context, consumerID, eventID string) (bool, error) {
	return inbox.Seen(ctx, b.db, consumerID, eventID)
}

type pgxTxn struct {
	tx pgx.Tx
	h  Handler
}

func (t pgxTxn) mark(ctx context.Context, ib *inbox.Inbox, consumerID, eventID string) (bool, error) {
	return ib.MarkProcessedTx(ctx, t.tx, consumerID, eventID)
}
func (t pgxTxn) markBatch(ctx context.Context, ib *inbox.Inbox, consumerID string, ids []string) ([]bool, error) {
	return ib.MarkProcessedBatchTx(ctx, t.tx, consumerID, ids)
}
func (t pgxTxn) handle(ctx context.Context, m *Message) error { return t.h(ctx, t.tx, m) }
func (t pgxTxn) commit(ctx context.Context) error             { return t.tx.Commit(ctx) }
func (t pgxTxn) rollback(ctx context.Context)                 { _ = t.tx.Rollback(ctx) }

// SQLHandler is Handler for a Consumer made by NewSQL: tx is the
// database/sql transaction that commits the message's processed_event row
// and the handler's writes, and nothing else. The handler must not commit
// or roll tx back itself (the Consumer does, then acks); an ORM opened on
// tx (see docs/databasesql.md) writes in it.
type SQLHandler func(ctx context.Context, tx *sql.Tx, m *Message) error

type sqlBackend struct {
	db   *sql.DB
	h    SQLHandler
	opts *sql.TxOptions
}

func (b sqlBackend) begin(ctx context.Context) (txn, error) {
	tx, err := b.db.BeginTx(ctx, b.opts)
	if err != nil {
		return nil, err
	}
	return sqlTxn{tx: tx, h: b.h}, nil
}

// purgeDB runs the purger's statements on the *sql.DB itself, each its
// own statement, as on a pgx pool.
func (b sqlBackend) purgeDB() inbox.DBTX { return sqlpgx.DB{Q: b.db} }

func (b sqlBackend) seen(ctx context.Context, consumerID, eventID string) (bool, error) {
	return inbox.SeenSQL(ctx, b.db, consumerID, eventID)
}

type sqlTxn struct {
	tx *sql.Tx
	h  SQLHandler
}

func (t sqlTxn) mark(ctx context.Context, ib *inbox.Inbox, consumerID, eventID string) (bool, error) {
	return ib.MarkProcessedSQLTx(ctx, t.tx, consumerID, eventID)
}
func (t sqlTxn) markBatch(ctx context.Context, ib *inbox.Inbox, consumerID string, ids []string) ([]bool, error) {
	return ib.MarkProcessedBatchSQLTx(ctx, t.tx, consumerID, ids)
}
func (t sqlTxn) handle(ctx context.Context, m *Message) error { return t.h(ctx, t.tx, m) }
func (t sqlTxn) commit(ctx context.Context) error             { return t.tx.Commit() }
func (t sqlTxn) rollback(context.Context)                     { _ = t.tx.Rollback() }

// NewSQL is New for a service on database/sql (lib/pq, pgx's stdlib
// driver, an ORM over either): each message's transaction is a *sql.Tx
// begun on db, in which the Consumer marks the event (package inbox, the
// same statements as New's) and the handler writes; the Consumer commits
// it and only then acks the message to the broker, with the guarantee of
// the package doc. Every driver works with it: kafka.NewDriver (franz-go),
// kafkago.NewDriver, natsjs.NewDriver.
//
// A *sql.Tx is bound to the ctx it began with: database/sql rolls it back
// when that ctx ends. The Consumer begins it on the run's ctx, which ends
// only on a hard stop, so a graceful stop still commits the message in
// hand.
func NewSQL(db *sql.DB, driver Driver, handler SQLHandler, cfg *Config) (*Consumer, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: db is nil", ErrInvalidConfig)
	}
	if handler == nil {
		return nil, fmt.Errorf("%w: handler is nil", ErrInvalidConfig)
	}
	return newConsumer(sqlBackend{db: db, h: handler}, driver, cfg)
}
