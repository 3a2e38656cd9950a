// Package postgres is billing's persistence adapter: the usecase.Repository
// over one transaction (or the pool, for reads) of either data layer, pgx
// or database/sql (see DB), billing's own embedded migrations, and the
// outbox as the event sink.
package postgres

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemkit/idem/examples/billing/adapters/out/postgres/internal/dbsqlc"
	"github.com/idemkit/idem/examples/billing/domain"
	"github.com/idemkit/idem/examples/billing/usecase"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/sqlpgx"
	"github.com/idemkit/idem/migrate"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/wal"
)

type walPrefixKey struct{}

// ContextWithWALOutbox returns ctx under which Emit writes events into the
// WAL with prefix (package outbox/wal: no outbox row; a WAL relay of that
// prefix publishes them) instead of the outbox table. billing's
// OUTBOX_MODE=wal sets it on every context its handlers run under.
func ContextWithWALOutbox(ctx context.Context, prefix string) context.Context {
	return context.WithValue(ctx, walPrefixKey{}, prefix)
}

func walPrefix(ctx context.Context) (string, bool) {
	p, ok := ctx.Value(walPrefixKey{}).(string)
	return p, ok
}

//go:embed migrations/*.sql
var migrations embed.FS

// MigrationTable records billing's own versions, beside idem's.
const MigrationTable = "billing_migration"

// Migrate applies idem's migrations (idempotency keys, outbox, inbox), then
// billing's (orders, payments). Safe to run from several instances at once.
func Migrate(ctx context.Context, db migrate.DB) error {
	if _, err := migrate.Up(ctx, db); err != nil {
		return fmt.Errorf("billing: idem migrations: %w", err)
	}
	m, err := migrate.Load(migrations, "migrations", &migrate.Config{Table: MigrationTable})
	if err != nil {
		return fmt.Errorf("billing: migrations: %w", err)
	}
	if _, err := m.Up(ctx, db); err != nil {
		return fmt.Errorf("billing: migrations: %w", err)
	}
	return nil
}

// Repo implements usecase.Repository on db: a transaction for writes (so
// that the writes and the emitted events commit together), the pool for
// reads. It is bound to a pgx.Tx (New) or a *sql.Tx (NewSQL), and routes
// its two idem calls, Emit and MarkProcessed, to the entry point of that
// transaction's type (outbox.EnqueueTx or outbox.EnqueueSQLTx, and so on);
// its own statements are the same sqlc queries on both.
type Repo struct {
	db outbox.DBTX
	q  *dbsqlc.Queries
	// At most one is set: the transaction the Repo is bound to.
	pgxTx pgx.Tx
	sqlTx *sql.Tx
}

var _ usecase.Repository = (*Repo)(nil)

// New binds a Repo to db, a pgx.Tx or a pgx pool.
func New(db outbox.DBTX) *Repo {
	tx, _ := db.(pgx.Tx)
	return &Repo{db: db, q: dbsqlc.New(db), pgxTx: tx}
}

// SQLQuerier is what *sql.Tx and *sql.DB have in common.
type SQLQuerier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// NewSQL binds a Repo to db, a *sql.Tx or a *sql.DB (billing's
// BILLING_DATA_LAYER=sql, on pgx's stdlib driver). The sqlc queries, made
// for pgx, reach db through idem's own database/sql adapter: the same
// statements as New's, through database/sql.
func NewSQL(db SQLQuerier) *Repo {
	d := sqlpgx.DB{Q: db}
	tx, _ := db.(*sql.Tx)
	return &Repo{db: d, q: dbsqlc.New(d), sqlTx: tx}
}

func text(s string) pgtype.Text { return pgtype.Text{String: s, Valid: s != ""} }

func order(o dbsqlc.Order) domain.Order {
	return domain.Order{ID: o.ID, Owner: o.Owner, CustomerID: o.CustomerID, TotalKopecks: o.TotalKopecks, Status: o.Status, ChargeID: o.ChargeID.String, Failure: o.Failure.String}
}

func payment(p dbsqlc.Payment) domain.Payment {
	return domain.Payment{ID: p.ID, Owner: p.Owner, OrderID: p.OrderID, CustomerID: p.CustomerID, AmountKopecks: p.AmountKopecks, Status: p.Status, ChargeID: p.ChargeID.String, Failure: p.Failure.String}
}

// InsertOrder implements usecase.Repository.
func (r *Repo) InsertOrder(ctx context.Context, o domain.Order) error {
	err := r.q.InsertOrder(ctx, dbsqlc.InsertOrderParams{ID: o.ID, Owner: o.Owner, CustomerID: o.CustomerID, TotalKopecks: o.TotalKopecks})
	if err != nil {
		return fmt.Errorf("billing: insert order: %w", err)
	}
	return nil
}

// GetOrder implements usecase.Repository.
func (r *Repo) GetOrder(ctx context.Context, id, owner string) (domain.Order, error) {
	o, err := r.q.GetOrder(ctx, dbsqlc.GetOrderParams{ID: id, Owner: owner})
	if errors.Is(err, pgx.ErrNoRows) {
		return domain.Order{}, domain.ErrOrderNotFound
	}
	if err != nil {
		return domain.Order{}, fmt.Errorf("billing: get order: %w", err)
	}
	return order(o), nil
}

// LockOrder implements usecase.Repository: SELECT ... FOR UPDATE.
func (r *Repo) LockOrder(ctx context.Context, id, owner string) (domain.Order, error) {
	o, err := r.q.LockOrder(ctx, dbsqlc.LockOrderParams{ID: id, Owner: owner})
	if errors.Is(err, pgx.ErrNoRows) {
		return domain.Order{}, domain.ErrOrderNotFound
	}
	if err != nil {
		return domain.Order{}, fmt.Errorf("billing: lock order: %w", err)
	}
	return order(o), nil
}

// PaidKopecks implements usecase.Repository.
func (r *Repo) PaidKopecks(ctx context.Context, orderID string) (int64, error) {
	n, err := r.q.PaidKopecks(ctx, orderID)
	if err != nil {
		return 0, fmt.Errorf("billing: sum payments: %w", err)
	}
	return n, nil
}

// ConfirmOrder implements usecase.Repository.
func (r *Repo) ConfirmOrder(ctx context.Context, id, owner string) (domain.Order, error) {
	o, err := r.q.ConfirmOrder(ctx, dbsqlc.ConfirmOrderParams{ID: id, Owner: owner})
	if errors.Is(err, pgx.ErrNoRows) {
		// Not NEW, or not there: tell which.
		cur, gerr := r.GetOrder(ctx, id, owner)
		if gerr != nil {
			return domain.Order{}, gerr
		}
		return domain.Order{}, fmt.Errorf("%w: order %s is %s, not NEW", domain.ErrOrderState, id, cur.Status)
	}
	if err != nil {
		return domain.Order{}, fmt.Errorf("billing: confirm order: %w", err)
	}
	return order(o), nil
}

// InsertPayment implements usecase.Repository.
func (r *Repo) InsertPayment(ctx context.Context, p domain.Payment) error {
	err := r.q.InsertPayment(ctx, dbsqlc.InsertPaymentParams{ID: p.ID, Owner: p.Owner, OrderID: p.OrderID, CustomerID: p.CustomerID, AmountKopecks: p.AmountKopecks})
	if err != nil {
		return fmt.Errorf("billing: insert payment: %w", err)
	}
	return nil
}

// GetPayment implements usecase.Repository.
func (r *Repo) GetPayment(ctx context.Context, id, owner string) (domain.Payment, error) {
	p, err := r.q.GetPayment(ctx, dbsqlc.GetPaymentParams{ID: id, Owner: owner})
	if errors.Is(err, pgx.ErrNoRows) {
		return domain.Payment{}, domain.ErrPaymentNotFound
	}
	if err != nil {
		return domain.Payment{}, fmt.Errorf("billing: get payment: %w", err)
	}
	return payment(p), nil
}

// SettleOrder implements usecase.Repository.
func (r *Repo) SettleOrder(ctx context.Context, id string, o usecase.ChargeOutcome) (bool, error) {
	n, err := r.q.SettleOrder(ctx, dbsqlc.SettleOrderParams{ID: id, Status: o.Status(), ChargeID: text(o.ChargeID), Failure: text(o.Failure)})
	if err != nil {
		return false, fmt.Errorf("billing: settle order: %w", err)
	}
	return n == 1, nil
}

// SettlePayment implements usecase.Repository.
func (r *Repo) SettlePayment(ctx context.Context, id string, o usecase.ChargeOutcome) (bool, error) {
	n, err := r.q.SettlePayment(ctx, dbsqlc.SettlePaymentParams{ID: id, Status: o.Status(), ChargeID: text(o.ChargeID), Failure: text(o.Failure)})
	if err != nil {
		return false, fmt.Errorf("billing: settle payment: %w", err)
	}
	return n == 1, nil
}

// Emit implements usecase.Repository through outbox.EnqueueTx (or
// EnqueueSQLTx in a *sql.Tx), or wal.Enqueuer's under ContextWithWALOutbox.
func (r *Repo) Emit(ctx context.Context, e usecase.Event) (string, error) {
	payload, err := json.Marshal(e.Payload)
	if err != nil {
		return "", fmt.Errorf("billing: encode %s: %w", e.Type, err)
	}
	m := outbox.Message{
		Topic: e.Topic, AggregateType: e.AggregateType, AggregateID: e.AggregateID,
		EventID: e.EventID, EventType: e.Type, Payload: payload,
	}
	var ids []string
	tx, inTx := r.pgxTx, r.pgxTx != nil
	prefix, toWAL := walPrefix(ctx)
	switch {
	case toWAL && r.sqlTx != nil:
		ids, err = wal.Enqueuer{Prefix: prefix}.EnqueueSQLTx(ctx, r.sqlTx, m) // commits with the use case's writes
	case r.sqlTx != nil:
		ids, err = outbox.EnqueueSQLTx(ctx, r.sqlTx, m) // commits with the use case's writes
	case toWAL && inTx:
		ids, err = wal.Enqueuer{Prefix: prefix}.EnqueueTx(ctx, tx, m) // commits with the use case's writes
	case toWAL:
		ids, err = wal.Enqueuer{Prefix: prefix}.Enqueue(ctx, r.db, m)
	case inTx:
		ids, err = outbox.EnqueueTx(ctx, tx, m) // commits with the use case's writes
	default:
		ids, err = outbox.Enqueue(ctx, r.db, m)
	}
	if err != nil {
		return "", fmt.Errorf("billing: emit %s: %w", e.Type, err)
	}
	return ids[0], nil
}

// ErrNoTx is MarkProcessed on a Repo bound to a pool, not a transaction.
var ErrNoTx = errors.New("billing: the repository is not bound to a transaction")

// MarkProcessed records eventID as processed by consumerID in the Repo's
// transaction (inbox.MarkProcessedTx, or MarkProcessedSQLTx in a *sql.Tx):
// first is false when it was already, and then the caller must not repeat
// the work. ErrNoTx outside a transaction.
func (r *Repo) MarkProcessed(ctx context.Context, consumerID, eventID string) (first bool, err error) {
	switch {
	case r.sqlTx != nil:
		return inbox.MarkProcessedSQLTx(ctx, r.sqlTx, consumerID, eventID)
	case r.pgxTx != nil:
		return inbox.MarkProcessedTx(ctx, r.pgxTx, consumerID, eventID)
	}
	return false, ErrNoTx
}
