package outbox_test

import (
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// forEachDriver runs f on each database/sql driver of testdb.SQLDrivers,
// in parallel, each with a fresh schema.
func forEachDriver(t *testing.T, maxConns int, f func(t *testing.T, db *testdb.DB, sdb *sql.DB)) {
	t.Helper()
	for _, driver := range testdb.SQLDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, testdb.MaxConns(2))
			f(t, db, db.SQL(t, driver, maxConns))
		})
	}
}

func sqlTx(t *testing.T, sdb *sql.DB) *sql.Tx {
	t.Helper()
	tx, err := sdb.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback() })
	return tx
}

func seqsOf(t *testing.T, db *testdb.DB) []string {
	t.Helper()
	rows, err := db.Pool.Query(t.Context(), "SELECT aggregate_id || ':' || aggregate_seq || ':' || event_id FROM outbox_event ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

// EnqueueSQLTx is EnqueueTx's statement: the same validation errors, the
// same numbering per aggregate in slice order, the same duplicate-id
// refusal, generated ids, headers and payload bytes stored as given.
func TestEnqueueSQLTxValidatesAndNumbers(t *testing.T) {
	t.Parallel()
	forEachDriver(t, 2, func(t *testing.T, db *testdb.DB, sdb *sql.DB) {
		ctx := t.Context()
		bad := []struct {
			m     outbox.Message
			field string
		}{
			{outbox.Message{AggregateType: "a", AggregateID: "1", EventType: "E"}, "Topic"},
			{outbox.Message{Topic: "t", AggregateID: "1", EventType: "E"}, "AggregateType"},
			{outbox.Message{Topic: "t", AggregateType: "a", EventType: "E"}, "AggregateID"},
			{outbox.Message{Topic: "t", AggregateType: "a", AggregateID: "1"}, "EventType"},
			{outbox.Message{Topic: "t", AggregateType: "a", AggregateID: "1", EventType: "E", EventID: "x\x00"}, "EventID"},
			{outbox.Message{Topic: strings.Repeat("t", outbox.MaxFieldBytes+1), AggregateType: "a", AggregateID: "1", EventType: "E"}, "Topic"},
		}
		for _, tt := range bad {
			tx := sqlTx(t, sdb)
			_, err := outbox.EnqueueSQLTx(ctx, tx, msg("a", 0), tt.m)
			if !errors.Is(err, outbox.ErrInvalidMessage) || !strings.Contains(err.Error(), tt.field) {
				t.Errorf("err = %v, want ErrInvalidMessage naming %s", err, tt.field)
			}
			// Nothing was sent: the transaction is still usable.
			if _, err := tx.ExecContext(ctx, "SELECT 1"); err != nil {
				t.Fatalf("transaction unusable after a refused message: %v", err)
			}
			_ = tx.Rollback()
		}

		tx := sqlTx(t, sdb)
		payload := []byte{0, 1, 2, 0xff, '"', '\\', '{', '}'}
		ids, err := outbox.EnqueueSQLTx(ctx, tx,
			outbox.Message{Topic: "t", AggregateType: "order", AggregateID: "x", EventType: "E", Payload: payload, Headers: map[string]string{"k": `v"\,{}`}},
			outbox.Message{Topic: "t", AggregateType: "order", AggregateID: `y,"z"`, EventType: "E", EventID: "given"},
			outbox.Message{Topic: "t", AggregateType: "order", AggregateID: "x", EventType: "E", EventID: `q"uo\te`},
		)
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) != 3 || len(ids[0]) != 32 || ids[1] != "given" || ids[2] != `q"uo\te` {
			t.Fatalf("ids = %q", ids)
		}
		if _, err := outbox.EnqueueSQLTx(ctx, tx, msg("x", 9)); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		want := []string{"x:1:" + ids[0], `y,"z":1:given`, `x:2:q"uo\te`, "x:3:x-9"}
		if got := seqsOf(t, db); !slices.Equal(got, want) {
			t.Fatalf("rows = %q, want %q", got, want)
		}
		var gotPayload []byte
		var hdr string
		if err := db.Pool.QueryRow(ctx, "SELECT payload, headers->>'k' FROM outbox_event WHERE event_id = $1", ids[0]).Scan(&gotPayload, &hdr); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(gotPayload, payload) || hdr != `v"\,{}` {
			t.Fatalf("payload %x headers %q", gotPayload, hdr)
		}

		// A duplicate event id is the ErrInvalidMessage of EnqueueTx, in
		// both statement shapes.
		for _, msgs := range [][]outbox.Message{
			{{Topic: "t", AggregateType: "a", AggregateID: "2", EventType: "E", EventID: "given"}},
			{msg("w", 1), {Topic: "t", AggregateType: "a", AggregateID: "2", EventType: "E", EventID: "given"}},
		} {
			tx := sqlTx(t, sdb)
			if _, err := outbox.EnqueueSQLTx(ctx, tx, msgs...); !errors.Is(err, outbox.ErrInvalidMessage) {
				t.Fatalf("duplicate event id (%d messages): err = %v, want ErrInvalidMessage", len(msgs), err)
			}
			_ = tx.Rollback()
		}
	})
}

// A rolled-back transaction leaves no event and no gap; an ended or nil
// transaction is a named error and writes nothing anywhere.
func TestEnqueueSQLTxRollbackAndEndedTx(t *testing.T) {
	t.Parallel()
	forEachDriver(t, 2, func(t *testing.T, db *testdb.DB, sdb *sql.DB) {
		ctx := t.Context()
		tx := sqlTx(t, sdb)
		if _, err := outbox.EnqueueSQLTx(ctx, tx, msg("a", 1), msg("a", 2)); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		if _, err := outbox.EnqueueSQLTx(ctx, tx, msg("a", 3)); !errors.Is(err, sql.ErrTxDone) {
			t.Fatalf("EnqueueSQLTx on a rolled-back tx: %v, want sql.ErrTxDone", err)
		}
		tx = sqlTx(t, sdb)
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if _, err := outbox.EnqueueSQLTx(ctx, tx, msg("a", 4)); !errors.Is(err, sql.ErrTxDone) {
			t.Fatalf("EnqueueSQLTx on a committed tx: %v, want sql.ErrTxDone", err)
		}
		if _, err := outbox.EnqueueSQLTx(ctx, nil, msg("a", 5)); !errors.Is(err, outbox.ErrNilTx) {
			t.Fatalf("EnqueueSQLTx(nil): %v, want ErrNilTx", err)
		}
		if _, err := outbox.EnqueueTx(ctx, nil, msg("a", 6)); !errors.Is(err, outbox.ErrNilTx) {
			t.Fatalf("EnqueueTx(nil): %v, want ErrNilTx", err)
		}
		if got := seqsOf(t, db); len(got) != 0 {
			t.Fatalf("rows after rollback and ended transactions: %q", got)
		}
		tx = sqlTx(t, sdb)
		if _, err := outbox.EnqueueSQLTx(ctx, tx, msg("a", 7)); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if got := seqsOf(t, db); !slices.Equal(got, []string{"a:1:a-7"}) {
			t.Fatalf("rows = %q, want a:1:a-7 (no gap left by the rollback)", got)
		}
	})
}

// Concurrent database/sql transactions on two aggregates, in both orders:
// no deadlock, each aggregate numbered 1..n in commit order.
func TestEnqueueSQLTxConcurrentSameAggregate(t *testing.T) {
	t.Parallel()
	forEachDriver(t, 8, func(t *testing.T, db *testdb.DB, sdb *sql.DB) {
		ctx := t.Context()
		const writers, perWriter = 8, 10
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for w := range writers {
			wg.Go(func() {
				for i := range perWriter {
					a, b := "x", "y"
					if (w+i)%2 == 0 {
						a, b = b, a
					}
					tx, err := sdb.BeginTx(ctx, nil)
					if err == nil {
						_, err = outbox.EnqueueSQLTx(ctx, tx, msg(a, w*1000+i), msg(b, w*1000+i))
						if err == nil {
							err = tx.Commit()
						} else {
							_ = tx.Rollback()
						}
					}
					if err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		for _, agg := range []string{"x", "y"} {
			var n, maxSeq, distinct int
			if err := db.Pool.QueryRow(ctx, `SELECT count(*), max(aggregate_seq), count(DISTINCT aggregate_seq) FROM outbox_event WHERE aggregate_id = $1`, agg).Scan(&n, &maxSeq, &distinct); err != nil {
				t.Fatal(err)
			}
			if n != writers*perWriter || maxSeq != n || distinct != n {
				t.Fatalf("%s: %d events, max seq %d, %d distinct", agg, n, maxSeq, distinct)
			}
		}
	})
}

// The doorbell rings for a database/sql enqueue as for a pgx one: a relay
// that polls once an hour delivers the event at its commit.
func TestEnqueueSQLTxRingsDoorbell(t *testing.T) {
	t.Parallel()
	forEachDriver(t, 2, func(t *testing.T, db *testdb.DB, sdb *sql.DB) {
		rec := newRecorder()
		owner := fmt.Sprintf("sqlbell-%d", time.Now().UnixNano()%1e9)
		r := newRelay(t, db, rec, outbox.RelayConfig{PollInterval: time.Hour, Owner: owner})
		if err := r.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		// The relay's first claim finds nothing; then it sleeps, armed.
		eventually(t, "relay listening", func() bool {
			var n int
			_ = db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
				WHERE application_name = $1 AND query LIKE 'LISTEN%'`, outbox.ListenerApplicationName(owner)).Scan(&n)
			return n > 0
		})
		for i := 1; i <= 2; i++ {
			tx := sqlTx(t, sdb)
			if _, err := outbox.EnqueueSQLTx(t.Context(), tx, msg("a", i)); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			id := fmt.Sprintf("a-%d", i)
			eventually(t, id+" delivered by the doorbell", func() bool { return slices.Contains(rec.deliveredIDs(), id) })
		}
	})
}
