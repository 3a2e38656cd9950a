package wal_test

import (
	"database/sql"
	"errors"
	"slices"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/wal"
)

// EnqueueSQLTx on each database/sql driver: a committed transaction's
// messages reach Kafka in write order (one and several per statement), a
// rolled-back one's never; invalid messages, a nil and an ended
// transaction are named errors.
func TestEnqueueSQLTx(t *testing.T) {
	t.Parallel()
	for _, driver := range testdb.SQLDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.start(t, nil, nil)
			sdb := b.db.SQL(t, driver, 2)
			ctx := t.Context()
			inTx := func(commit bool, msgs ...outbox.Message) {
				t.Helper()
				tx, err := sdb.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback() //nolint:errcheck
				if _, err := b.enq.EnqueueSQLTx(ctx, tx, msgs...); err != nil {
					t.Fatal(err)
				}
				if commit {
					if err := tx.Commit(); err != nil {
						t.Fatal(err)
					}
				}
			}
			inTx(true, msg("x", "s1"))
			inTx(false, msg("x", "rolled-back"))
			inTx(true, msg("y", "s2"), msg("x", "s3"), msg("y", "s4"))

			tx, err := sdb.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.enq.EnqueueSQLTx(ctx, tx, outbox.Message{Topic: "events"}); !errors.Is(err, outbox.ErrInvalidMessage) {
				t.Fatalf("invalid message: %v, want ErrInvalidMessage", err)
			}
			_ = tx.Rollback()
			if _, err := b.enq.EnqueueSQLTx(ctx, tx, msg("x", "late")); !errors.Is(err, sql.ErrTxDone) {
				t.Fatalf("ended tx: %v, want sql.ErrTxDone", err)
			}
			if _, err := wal.EnqueueSQLTx(ctx, nil, msg("x", "nil")); !errors.Is(err, wal.ErrInvalidConfig) {
				t.Fatalf("nil tx: %v, want ErrInvalidConfig", err)
			}
			inTx(true, msg("x", "s5"))

			want := []string{"s1", "s2", "s3", "s4", "s5"}
			recs := b.kc.ReadAll(t, b.topic, len(want), 60*time.Second)
			if got := ids(recs); !slices.Equal(got, want) {
				t.Fatalf("delivered %v, want %v", got, want)
			}
			if string(recs[2].Value) != "p-s3" || string(recs[2].Key) != "x" {
				t.Fatalf("s3: key %q value %q", recs[2].Key, recs[2].Value)
			}
		})
	}
}
