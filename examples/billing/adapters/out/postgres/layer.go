package postgres

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/consume"
	"github.com/idemkit/idem/idempotency"
)

// The data layers (DB.Layer, billing's BILLING_DATA_LAYER).
const (
	// LayerPGX: billing's transactions are pgx.Tx on a pgxpool. The
	// default.
	LayerPGX = "pgx"
	// LayerSQL: billing's transactions are *sql.Tx on a *sql.DB (pgx's
	// stdlib driver), through idem's database/sql entry points
	// (docs/databasesql.md).
	LayerSQL = "sql"
)

// DB is billing's database as its inbound adapters (the HTTP API, the
// consumers) use it, on one data layer: PGX or SQL. It is the one place
// that knows the transaction type: everything else gets a *Repo bound to
// a transaction and stays the same on both layers. idem's own loops (the
// relay, the purges, the status poller, the gauges) are not behind it:
// they keep billing's pgxpool on either layer, as docs/databasesql.md
// allows.
type DB interface {
	// Layer is LayerPGX or LayerSQL.
	Layer() string
	// Reader is a Repo outside any transaction, for reads.
	Reader() *Repo
	// InTx runs f with a Repo bound to a new transaction, committed when
	// f returns nil and rolled back otherwise.
	InTx(ctx context.Context, f func(repo *Repo) error) error
	// RequestRepo is the Repo bound to the transaction of the idempotency
	// middleware in ModeTransactional (idempotency.TxFromContext, or
	// SQLTxFromContext); false when ctx carries none.
	RequestRepo(ctx context.Context) (*Repo, bool)
	// IdempotencyStore is the PostgreSQL idempotency store of this layer
	// (idempotency.NewPostgresStore, or NewSQLStore): both run
	// ModeTransactional in the layer's own transaction.
	IdempotencyStore() idempotency.Store
	// Consumer is a consume.Consumer on drv (consume.New, or NewSQL) whose
	// handler gets the Repo bound to the message's transaction, the one
	// that commits the message's inbox mark.
	Consumer(drv consume.Driver, h Handler, cfg *consume.Config) (*consume.Consumer, error)
}

// Handler is a consumer's step on the Repo bound to the message's
// transaction.
type Handler func(ctx context.Context, repo *Repo, m *consume.Message) error

// PGX is the pgx data layer on a pool.
func PGX(pool consume.DB) DB { return pgxDB{pool} }

// SQL is the database/sql data layer on db.
func SQL(db *sql.DB) DB { return sqlDB{db} }

type pgxDB struct{ pool consume.DB }

func (pgxDB) Layer() string   { return LayerPGX }
func (d pgxDB) Reader() *Repo { return New(d.pool) }
func (d pgxDB) InTx(ctx context.Context, f func(*Repo) error) error {
	return pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error { return f(New(tx)) })
}
func (pgxDB) RequestRepo(ctx context.Context) (*Repo, bool) {
	tx, ok := idempotency.TxFromContext(ctx)
	if !ok {
		return nil, false
	}
	return New(tx), true
}
func (d pgxDB) IdempotencyStore() idempotency.Store { return idempotency.NewPostgresStore(d.pool) }
func (d pgxDB) Consumer(drv consume.Driver, h Handler, cfg *consume.Config) (*consume.Consumer, error) {
	return consume.New(d.pool, drv, func(ctx context.Context, tx pgx.Tx, m *consume.Message) error {
		return h(ctx, New(tx), m)
	}, cfg)
}

type sqlDB struct{ db *sql.DB }

func (sqlDB) Layer() string   { return LayerSQL }
func (d sqlDB) Reader() *Repo { return NewSQL(d.db) }
func (d sqlDB) InTx(ctx context.Context, f func(*Repo) error) (err error) {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := f(NewSQL(tx)); err != nil {
		return errors.Join(err, ignoreDone(tx.Rollback()))
	}
	return tx.Commit()
}
func (sqlDB) RequestRepo(ctx context.Context) (*Repo, bool) {
	tx, ok := idempotency.SQLTxFromContext(ctx)
	if !ok {
		return nil, false
	}
	return NewSQL(tx), true
}
func (d sqlDB) IdempotencyStore() idempotency.Store { return idempotency.NewSQLStore(d.db) }
func (d sqlDB) Consumer(drv consume.Driver, h Handler, cfg *consume.Config) (*consume.Consumer, error) {
	return consume.NewSQL(d.db, drv, func(ctx context.Context, tx *sql.Tx, m *consume.Message) error {
		return h(ctx, NewSQL(tx), m)
	}, cfg)
}

// ignoreDone drops the sql.ErrTxDone of a rollback after database/sql
// already rolled the transaction back (its ctx ended), as pgx.BeginFunc
// does for pgx.ErrTxClosed.
func ignoreDone(err error) error {
	if errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	return err
}
