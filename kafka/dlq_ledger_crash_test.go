package kafka_test

import (
	"context"
	"fmt"
	"net/url"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/kafka"
)

// The ledger's database connection dies after the broker took the first
// record of an audited redrive: the ledger transaction (its rows and its
// audit row) is lost, the record is not. The next audited redrive finds
// that record's redrive id on the destination and does not publish it
// again; every record ends up there once.
func TestDLQRedriveLedgerLostAfterProduce(t *testing.T) {
	t.Parallel()
	kc := dlqSetup(t)
	db := testdb.New(t)
	ctx := context.Background()

	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", "redrive-cut")
	u.RawQuery = q.Encode()
	cut, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer cut.Close()

	var acked atomic.Int32
	hook := kgo.WithHooks(unbufferedHook(func(r *kgo.Record, err error) {
		if err == nil && r.Topic == "orders.events" && acked.Add(1) == 1 {
			if _, err := db.Pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'redrive-cut'`); err != nil {
				t.Error(err)
			}
		}
	}))
	opts := kafka.RedriveOptions{From: "orders.events.dlq", Actor: "op", Reason: "consumer fixed"}
	first := opts
	first.DB = cut
	if rep, err := kafka.NewDLQ(kgo.SeedBrokers(kc.Addrs...), hook).Redrive(ctx, first); err == nil {
		t.Fatalf("a redrive whose ledger connection died returned no error: %+v", rep)
	}
	if acked.Load() < 1 {
		t.Fatal("the first redrive produced nothing: the cut did not land after a produce")
	}
	var rows int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM idem_dlq_redrive`).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("%d ledger rows survived the lost transaction (%v), want 0", rows, err)
	}

	second := opts
	second.DB = db.Pool
	rep, err := kafka.NewDLQ(kgo.SeedBrokers(kc.Addrs...)).Redrive(ctx, second)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.AlreadyRedriven) < 1 {
		t.Errorf("second redrive saw nothing already redriven: %+v", rep)
	}
	copies := redriveCopies(t, kc)
	for i := range 4 {
		if id := fmt.Sprintf("orders.events.dlq/0/%d", i); copies[id] != 1 {
			t.Errorf("%s published %d times, want once", id, copies[id])
		}
	}
}
