package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testkafka"
	"github.com/idemkit/idem/kafka"
)

// redriveCopies counts the records of orders.events by the dead-letter
// record they copy.
func redriveCopies(t *testing.T, kc *testkafka.Cluster) map[string]int {
	t.Helper()
	recs, err := kafka.NewDLQ(kgo.SeedBrokers(kc.Addrs...)).List(context.Background(), "orders.events", 0)
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, r := range recs {
		n[r.HeaderMap()[kafka.HeaderDeadLetterRedriveID]]++
	}
	return n
}

// Several redrives of one dead-letter topic started at once publish each
// record once: the ledger's lock makes each wait for the one before, which
// it then sees in the ledger. A forced redrive publishes again, audited.
func TestDLQRedriveConcurrentOnce(t *testing.T) {
	t.Parallel()
	kc := dlqSetup(t)
	db := testdb.New(t)
	ctx := context.Background()
	d := kafka.NewDLQ(kgo.SeedBrokers(kc.Addrs...))

	const racers = 4
	start := make(chan struct{})
	var wg sync.WaitGroup
	reps := make([]*kafka.RedriveReport, racers)
	errs := make([]error, racers)
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			reps[i], errs[i] = d.Redrive(ctx, kafka.RedriveOptions{From: "orders.events.dlq", DB: db.Pool,
				Actor: fmt.Sprintf("op-%d", i), Reason: "consumer fixed"})
		}()
	}
	close(start)
	wg.Wait()
	moved, already := 0, 0
	for i := range racers {
		if errs[i] != nil {
			t.Fatalf("redrive %d: %v", i, errs[i])
		}
		moved += len(reps[i].Moved)
		already += len(reps[i].AlreadyRedriven)
		for _, m := range reps[i].AlreadyRedriven {
			if m.AuditID == 0 || m.RedrivenBy == "" || m.RedrivenAt == nil {
				t.Errorf("redrive %d: %s already redriven, but by whom? %+v", i, m.ID, m)
			}
		}
	}
	copies := redriveCopies(t, kc)
	for i := range 4 {
		if id := fmt.Sprintf("orders.events.dlq/0/%d", i); copies[id] != 1 {
			t.Errorf("%s published %d times, want once", id, copies[id])
		}
	}
	if moved != 4 || already != 4*(racers-1) {
		t.Errorf("moved %d, already redriven %d; want 4 and %d", moved, already, 4*(racers-1))
	}
	var rows, audits int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM idem_dlq_redrive WHERE dlq_topic = 'orders.events.dlq' AND redrives = 1 AND target = 'orders.events'`).Scan(&rows); err != nil || rows != 4 {
		t.Errorf("ledger rows %d: %v", rows, err)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM idem_admin_audit WHERE action = 'dlq.redrive' AND reason = 'consumer fixed' AND actor LIKE 'op-%'`).Scan(&audits); err != nil || audits != racers {
		t.Errorf("audit rows %d: %v", audits, err)
	}

	// --force: again, recorded as forced with the records moved.
	rep, err := d.Redrive(ctx, kafka.RedriveOptions{From: "orders.events.dlq", FilterError: "other", DB: db.Pool, Actor: "op-x", Reason: "replay", Force: true})
	if err != nil || len(rep.Moved) != 1 || rep.AuditID == 0 {
		t.Fatalf("forced: %+v %v", rep, err)
	}
	if c := redriveCopies(t, kc)["orders.events.dlq/0/2"]; c != 2 {
		t.Errorf("forced redrive: %d copies of 0/2, want 2", c)
	}
	var detail string
	if err := db.Pool.QueryRow(ctx, `SELECT detail::text FROM idem_admin_audit WHERE id = $1 AND actor = 'op-x' AND reason = 'replay'
		AND detail @> '{"forced": true, "moved": [{"topic": "orders.events.dlq", "partition": 0, "offset": 2, "to": "orders.events"}]}'`, rep.AuditID).Scan(&detail); err != nil {
		t.Errorf("forced audit row %d: %v", rep.AuditID, err)
	}

	if _, err := d.Redrive(ctx, kafka.RedriveOptions{From: "orders.events.dlq", DB: db.Pool, Actor: "op"}); !errors.Is(err, kafka.ErrAuditRequired) {
		t.Errorf("no reason: %v", err)
	}
}

type fetchCounter struct{ records atomic.Int64 }

func (f *fetchCounter) OnFetchBatchRead(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.FetchBatchMetrics) {
	f.records.Add(int64(m.NumRecords))
}

// List with a limit reads the newest records from the end of each
// partition, not the whole topic: the client's fetch hook counts what the
// broker sent.
func TestDLQListReadsOnlyLimit(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t)
	kc.CreateTopic(t, "big.dlq", 1)
	cl := kc.Client(t)
	const total, limit = 200, 5
	for i := range total { // one batch per record, as the consumer's dead-letter producer writes
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: "big.dlq", Value: []byte(fmt.Sprintf("%d", i))}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	var fc fetchCounter
	d := kafka.NewDLQ(kgo.SeedBrokers(kc.Addrs...), kgo.WithHooks(&fc))
	recs, err := d.List(context.Background(), "big.dlq", limit)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != limit || recs[0].Offset != total-limit || recs[limit-1].Offset != total-1 {
		t.Fatalf("got %d records from offset %d, want the newest %d", len(recs), recs[0].Offset, limit)
	}
	if n := fc.records.Load(); n > 2*limit {
		t.Errorf("List(limit %d) fetched %d of the topic's %d records", limit, n, total)
	}
	recs, err = d.ListFrom(context.Background(), "big.dlq", kafka.ListOptions{Offset: 100, Limit: 3})
	if err != nil || len(recs) != 3 || recs[0].Offset != 100 || recs[2].Offset != 102 {
		t.Errorf("from offset 100: %d records %v", len(recs), err)
	}
}
