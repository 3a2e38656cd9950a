package kafka_test

import (
	"context"
	"database/sql"
	"log/slog"
	"testing"
	"time"

	"github.com/idemkit/idem/consume"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/kafka"
)

// A consumer on database/sql (consume.NewSQL) purges processed_event rows
// past its Retention by default, through its *sql.DB (no pgxpool of its
// own), on lib/pq and on pgx's stdlib driver alike.
func TestSQLConsumerPurgesProcessedEvents(t *testing.T) {
	t.Parallel()
	for _, drv := range testdb.SQLDrivers {
		t.Run(drv, func(t *testing.T) {
			t.Parallel()
			b := consSetup(t, 1)
			ctx := context.Background()
			if _, err := b.db.Pool.Exec(ctx, `INSERT INTO processed_event (consumer_id, event_id, processed_at)
				VALUES ('billing', 'old', now() - interval '2 hours'), ('billing', 'recent', now())`); err != nil {
				t.Fatal(err)
			}
			d, err := kafka.NewDriver(&kafka.ConsumerConfig{Brokers: b.kc.Addrs, Group: b.group, Topics: []string{b.topic}})
			if err != nil {
				t.Fatal(err)
			}
			h := func(ctx context.Context, tx *sql.Tx, m *consume.Message) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO cons_effect (event_id, member, value) VALUES ($1, 'A', $2)`, m.EventID, string(m.Value))
				return err
			}
			// Retention and PurgeInterval set, the purge itself left at its
			// default (on).
			c, err := consume.NewSQL(b.db.SQL(t, drv, 4), d, h, &consume.Config{ConsumerID: b.group,
				Retention: time.Hour, PurgeInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Start(ctx); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				if err := c.Stop(sctx); err != nil {
					t.Errorf("Stop: %v", err)
				}
			})
			b.consProduce(t, 0, 1)
			b.consWaitEffects(t, 1, 30*time.Second)
			count := func(id string) int {
				var n int
				if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM processed_event WHERE event_id = $1`, id).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			deadline := time.Now().Add(30 * time.Second)
			for count("old") != 0 {
				if time.Now().After(deadline) {
					t.Fatal("the row older than Retention is still there after 30s")
				}
				time.Sleep(10 * time.Millisecond) // polling interval
			}
			if count("recent") != 1 || count("ev-0") != 1 {
				t.Fatal("a row within Retention was purged")
			}
		})
	}
}
