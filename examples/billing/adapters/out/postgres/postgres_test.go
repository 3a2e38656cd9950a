package postgres_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/examples/billing/adapters/out/postgres"
	"github.com/idemkit/idem/examples/billing/domain"
	"github.com/idemkit/idem/examples/billing/usecase"
	"github.com/idemkit/idem/internal/testdb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestMigrateConcurrently proves that instances starting together migrate
// once: idem's tables and billing's, each version recorded once.
func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, testdb.Empty(), testdb.MaxConns(8))
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 6)
	for i := range errs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = postgres.Migrate(ctx, db.Pool) }()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+postgres.MigrationTable).Scan(&n); err != nil || n != 1 {
		t.Fatalf("billing versions %d (%v), want 1", n, err)
	}
	for _, table := range []string{"orders", "payments", "outbox_event", "processed_event", "idempotency_key"} {
		if _, err := db.Pool.Exec(ctx, `SELECT 1 FROM `+table+` LIMIT 0`); err != nil {
			t.Errorf("%s: %v", table, err)
		}
	}
}

func setup(t *testing.T) *testdb.DB {
	t.Helper()
	db := testdb.New(t)
	if err := postgres.Migrate(context.Background(), db.Pool); err != nil {
		t.Fatal(err)
	}
	return db
}

// TestConfirmAndSettle proves the repository's state rules against the
// real schema: confirm only NEW orders of the owner, settle only once, and
// the use case's writes and event commit or roll back together.
func TestConfirmAndSettle(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := context.Background()
	repo := postgres.New(db.Pool)
	o, err := usecase.CreateOrderExec(ctx, repo, "alice", usecase.CreateOrder{CustomerID: "c1", TotalKopecks: 500})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := repo.ConfirmOrder(ctx, o.ID, "bob"); !errors.Is(err, domain.ErrOrderNotFound) {
		t.Fatalf("confirm by another owner: %v", err)
	}

	// A confirm whose transaction rolls back leaves no event and no status.
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := usecase.ConfirmOrderExec(ctx, postgres.New(tx), "alice", o.ID); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)
	if got, _ := repo.GetOrder(ctx, o.ID, "alice"); got.Status != domain.OrderNew {
		t.Fatalf("after rollback: %s", got.Status)
	}

	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := usecase.ConfirmOrderExec(ctx, postgres.New(tx), "alice", o.ID)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := repo.ConfirmOrder(ctx, o.ID, "alice"); !errors.Is(err, domain.ErrOrderState) {
		t.Fatalf("second confirm: %v", err)
	}
	var events int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_event WHERE aggregate_id = $1 AND event_type = 'OrderConfirmed' AND topic = 'orders.events'`, o.ID).Scan(&events); err != nil || events != 1 {
		t.Fatalf("OrderConfirmed events %d (%v), want 1", events, err)
	}

	first, err := repo.SettleOrder(ctx, o.ID, usecase.ChargeOutcome{Charged: true, ChargeID: "ch_1"})
	if err != nil || !first {
		t.Fatalf("settle: %v %v", first, err)
	}
	again, err := repo.SettleOrder(ctx, o.ID, usecase.ChargeOutcome{Failure: "late"})
	if err != nil || again {
		t.Fatalf("second settle: %v %v", again, err)
	}
	got, _ := repo.GetOrder(ctx, o.ID, "alice")
	if got.Status != domain.OrderCharged || got.ChargeID != "ch_1" || got.Failure != "" {
		t.Fatalf("order %+v", got)
	}
}

// TestCreatePayment proves the payment use case on the real schema: the
// order must be the owner's and the customer must match; a valid payment
// writes the PENDING row and a ChargeRequested keyed by the payment id.
func TestCreatePayment(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := context.Background()
	repo := postgres.New(db.Pool)
	o, err := usecase.CreateOrderExec(ctx, repo, "alice", usecase.CreateOrder{CustomerID: "c1", TotalKopecks: 500})
	if err != nil {
		t.Fatal(err)
	}
	testCases := []struct {
		name  string
		owner string
		cmd   usecase.CreatePayment
		want  error
	}{
		{"unknown order", "alice", usecase.CreatePayment{OrderID: "ord_x", CustomerID: "c1", AmountKopecks: 1}, domain.ErrOrderNotFound},
		{"other owner", "bob", usecase.CreatePayment{OrderID: o.ID, CustomerID: "c1", AmountKopecks: 1}, domain.ErrOrderNotFound},
		{"other customer", "alice", usecase.CreatePayment{OrderID: o.ID, CustomerID: "c2", AmountKopecks: 1}, domain.ErrCustomerMismatch},
		{"above the total", "alice", usecase.CreatePayment{OrderID: o.ID, CustomerID: "c1", AmountKopecks: 501}, domain.ErrExceedsOutstanding},
		{"above the bound", "alice", usecase.CreatePayment{OrderID: o.ID, CustomerID: "c1", AmountKopecks: domain.MaxAmountKopecks + 1}, domain.ErrAmountTooLarge},
		{"NUL in the order id", "alice", usecase.CreatePayment{OrderID: o.ID + "\x00", CustomerID: "c1", AmountKopecks: 1}, domain.ErrInvalidText},
		{"zero", "alice", usecase.CreatePayment{OrderID: o.ID, CustomerID: "c1"}, domain.ErrValidation},
		{"negative", "alice", usecase.CreatePayment{OrderID: o.ID, CustomerID: "c1", AmountKopecks: -3}, domain.ErrValidation},
		{"no order", "alice", usecase.CreatePayment{CustomerID: "c1", AmountKopecks: 3}, domain.ErrValidation},
	}
	for _, tt := range testCases {
		if _, err := usecase.CreatePaymentExec(ctx, repo, tt.owner, tt.cmd); !errors.Is(err, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
	}
	p, err := usecase.CreatePaymentExec(ctx, repo, "alice", usecase.CreatePayment{OrderID: o.ID, CustomerID: "c1", AmountKopecks: 250})
	if err != nil {
		t.Fatal(err)
	}
	var payload []byte
	if err := db.Pool.QueryRow(ctx, `SELECT payload FROM outbox_event WHERE event_id = $1 AND topic = 'billing.commands'`, p.ID+":charge").Scan(&payload); err != nil {
		t.Fatal(err)
	}
	c, err := usecase.ParseChargeRequested(payload)
	if err != nil || c.Target != usecase.TargetPayment || c.TargetID != p.ID || c.AmountKopecks != 250 || c.IdempotencyKey != p.ID+":charge" {
		t.Fatalf("command %+v (%v)", c, err)
	}
	var n int
	_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM payments`).Scan(&n)
	if n != 1 {
		t.Fatalf("%d payments, want 1", n)
	}
}

// layers are billing's two data layers on one test schema.
func layers(t *testing.T, db *testdb.DB) []postgres.DB {
	return []postgres.DB{postgres.PGX(db.Pool), postgres.SQL(db.SQL(t, "pgx", 4))}
}

// TestLayers proves each data layer's transaction: the use case's writes,
// its event and an inbox mark commit together, or roll back together,
// through the layer's own idem entry points (EnqueueTx or EnqueueSQLTx,
// MarkProcessedTx or MarkProcessedSQLTx).
func TestLayers(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := context.Background()
	for _, layer := range layers(t, db) {
		o, err := usecase.CreateOrderExec(ctx, layer.Reader(), "alice", usecase.CreateOrder{CustomerID: "c1", TotalKopecks: 500})
		if err != nil {
			t.Fatal(layer.Layer(), err)
		}
		events := func() (n int) {
			t.Helper()
			if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_event WHERE aggregate_id = $1`, o.ID).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		marks := func() (n int) {
			t.Helper()
			if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM processed_event WHERE event_id = $1`, o.ID).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		errAbort := errors.New("abort")
		confirm := func(repo *postgres.Repo) error {
			if first, err := repo.MarkProcessed(ctx, "test", o.ID); err != nil || !first {
				return errors.Join(err, errors.New("mark not first"))
			}
			_, err := usecase.ConfirmOrderExec(ctx, repo, "alice", o.ID)
			return err
		}
		err = layer.InTx(ctx, func(repo *postgres.Repo) error {
			if err := confirm(repo); err != nil {
				return err
			}
			return errAbort
		})
		if !errors.Is(err, errAbort) {
			t.Fatalf("%s: rolled-back confirm: %v", layer.Layer(), err)
		}
		if got, _ := layer.Reader().GetOrder(ctx, o.ID, "alice"); got.Status != domain.OrderNew || events() != 0 || marks() != 0 {
			t.Fatalf("%s: after rollback: %s, %d events, %d marks", layer.Layer(), got.Status, events(), marks())
		}
		if err := layer.InTx(ctx, confirm); err != nil {
			t.Fatalf("%s: confirm: %v", layer.Layer(), err)
		}
		if got, _ := layer.Reader().GetOrder(ctx, o.ID, "alice"); got.Status != domain.OrderConfirmed || events() != 1 || marks() != 1 {
			t.Fatalf("%s: after commit: %s, %d events, %d marks", layer.Layer(), got.Status, events(), marks())
		}
		err = layer.InTx(ctx, func(repo *postgres.Repo) error {
			first, err := repo.MarkProcessed(ctx, "test", o.ID)
			if err == nil && first {
				err = errors.New("a second mark is first")
			}
			return err
		})
		if err != nil {
			t.Fatalf("%s: %v", layer.Layer(), err)
		}
		if _, err := layer.Reader().MarkProcessed(ctx, "test", "x"); !errors.Is(err, postgres.ErrNoTx) {
			t.Fatalf("%s: mark outside a transaction: %v", layer.Layer(), err)
		}
		if _, ok := layer.RequestRepo(ctx); ok {
			t.Fatalf("%s: a request transaction outside the middleware", layer.Layer())
		}
	}
}
