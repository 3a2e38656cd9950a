package kafka_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testkafka"
	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/outbox"
)

// readToEnd reads every record of topic up to its end offsets.
func readToEnd(t *testing.T, c *testkafka.Cluster, topic string) []*kgo.Record {
	t.Helper()
	cl := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	ends.Each(func(o kadm.ListedOffset) { n += int(o.Offset) })
	if n == 0 {
		return nil
	}
	return c.ReadAll(t, topic, n, 30*time.Second)
}

// Randomized: three relays of one mode (or of both) on one table, small batches of
// different sizes (so that hot aggregates' backlogs straddle the window
// and the window grows and shrinks), events of one aggregate spread over
// three topics (waves), writers enqueueing interleaved aggregates (some
// with ids of 600 bytes) in multi-event transactions, kfake failing the
// produce to random partitions now and then (partial batches, retries in
// backoff with ready events behind them, DEAD events at MaxAttempts 2),
// and an operator requeueing the DEAD ones while the relays run. From
// what Kafka holds: every enqueued event is there; per partition, an
// aggregate's first copies come in sequence order; across topics, no
// first copy of an event was produced before (by its record timestamp,
// taken at produce time, after the earlier wave was acknowledged) the
// first copy of an earlier event of its aggregate; and every PUBLISHED
// row is in Kafka.
func TestRandomizedClaimKeepsOrderAndLosesNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		modes [3]outbox.Mode
	}{
		{"at-least-once", [3]outbox.Mode{outbox.AtLeastOnce, outbox.AtLeastOnce, outbox.AtLeastOnce}},
		{"two-phase", [3]outbox.Mode{outbox.TwoPhase, outbox.TwoPhase, outbox.TwoPhase}},
		// The reaper runs in both modes because relays of both may share a
		// table (Relay.reapLoop).
		{"mixed", [3]outbox.Mode{outbox.AtLeastOnce, outbox.TwoPhase, outbox.AtLeastOnce}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			seed := uint64(time.Now().UnixNano())
			t.Logf("seed %d", seed)
			db := testdb.New(t, testdb.MaxConns(20))
			c := testkafka.New(t)
			topics := []string{"r0", "r1", "r2"}
			for _, tp := range topics {
				c.CreateTopic(t, tp, 2)
			}
			ctx := context.Background()
			var relays []*outbox.Relay
			for i, bs := range []int{5, 16, 50} {
				pub, err := kafka.NewPublisher(c.Client(t, kafka.ProducerOpts()...), nil)
				if err != nil {
					t.Fatal(err)
				}
				r, err := outbox.NewRelay(db.Pool, pub, &outbox.RelayConfig{Mode: tc.modes[i], BatchSize: bs,
					PollInterval: 20 * time.Millisecond, ReapInterval: 100 * time.Millisecond, MaxAttempts: 2,
					BackoffMin: time.Millisecond, BackoffMax: 30 * time.Millisecond,
					Owner: fmt.Sprintf("relay-%d", i), Logger: pubQuiet})
				if err != nil {
					t.Fatal(err)
				}
				if err := r.Start(ctx); err != nil {
					t.Fatal(err)
				}
				relays = append(relays, r)
			}
			t.Cleanup(func() {
				for _, r := range relays {
					_ = r.Stop(context.Background())
				}
			})
			const aggregates, writers, txs = 30, 4, 60
			aggID := func(a int) string {
				id := fmt.Sprintf("agg-%02d", a)
				if a%7 == 0 {
					id += "-" + strings.Repeat("x", 600)
				}
				return id
			}
			stop := make(chan struct{})
			var bg sync.WaitGroup
			// The broker: now and then fail a few produce requests of one
			// partition of one topic.
			bg.Add(1)
			go func() {
				defer bg.Done()
				frng := rand.New(rand.NewPCG(seed, 8))
				for {
					select {
					case <-stop:
						return
					case <-time.After(time.Duration(10+frng.IntN(40)) * time.Millisecond):
					}
					c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topics[frng.IntN(len(topics))],
						Partitions: []int32{int32(frng.IntN(2))}, Err: kerr.InvalidRecord, Count: 1 + frng.IntN(3)})
				}
			}()
			// The operator: requeue what went DEAD.
			admin := outbox.NewAdmin(db.Pool)
			bg.Add(1)
			go func() {
				defer bg.Done()
				for {
					select {
					case <-stop:
						return
					case <-time.After(50 * time.Millisecond):
					}
					_, _ = admin.RequeueDead(ctx, outbox.ListFilter{}, outbox.Action{Actor: "test", Reason: "retry"})
				}
			}()
			var mu sync.Mutex
			want := map[string]int{} // aggregate id → events
			var wg sync.WaitGroup
			for w := range writers {
				wrng := rand.New(rand.NewPCG(seed, uint64(100+w)))
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range txs {
						msgs := make([]outbox.Message, 1+wrng.IntN(12))
						for j := range msgs {
							a := wrng.IntN(aggregates)
							if wrng.IntN(3) == 0 {
								a = wrng.IntN(3) // hot aggregates
							}
							msgs[j] = outbox.Message{Topic: topics[wrng.IntN(len(topics))], AggregateType: "order",
								AggregateID: aggID(a), EventID: outbox.NewEventID(), EventType: "E", Payload: []byte("p")}
						}
						tx, err := db.Pool.Begin(ctx)
						if err != nil {
							t.Error(err)
							return
						}
						_, err = outbox.EnqueueTx(ctx, tx, msgs...)
						if err == nil {
							err = tx.Commit(ctx)
						}
						_ = tx.Rollback(ctx)
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						for _, m := range msgs {
							want[m.AggregateID]++
						}
						mu.Unlock()
						time.Sleep(time.Duration(wrng.IntN(3)) * time.Millisecond) // spread the load
					}
				}()
			}
			wg.Wait()
			close(stop)
			bg.Wait()
			pubEventually(t, "all published", 120*time.Second, func() bool {
				_, _ = admin.RequeueDead(ctx, outbox.ListFilter{}, outbox.Action{Actor: "test", Reason: "retry"})
				return pubCount(t, db, "status <> 'PUBLISHED'") == 0
			})
			for _, r := range relays {
				if err := r.Stop(ctx); err != nil {
					t.Fatal(err)
				}
			}
			type first struct {
				seq int
				ts  time.Time
			}
			firsts := map[string]first{} // event id → its first copy
			perPart := map[string]int{}  // topic/partition/aggregate → last first-copy seq
			byAgg := map[string][]first{}
			for _, tp := range topics {
				for _, r := range readToEnd(t, c, tp) { // per-partition offset order
					id := pubHeader(r, kafka.HeaderEventID)
					if _, ok := firsts[id]; ok {
						continue
					}
					seq, _ := strconv.Atoi(pubHeader(r, kafka.HeaderAggregateSeq))
					f := first{seq, r.Timestamp}
					firsts[id] = f
					k := fmt.Sprintf("%s/%d/%s", r.Topic, r.Partition, r.Key)
					if seq <= perPart[k] {
						t.Fatalf("%.60s: seq %d after seq %d on %s/%d", r.Key, seq, perPart[k], r.Topic, r.Partition)
					}
					perPart[k] = seq
					byAgg[string(r.Key)] = append(byAgg[string(r.Key)], f)
				}
			}
			total := 0
			for agg, n := range want {
				total += n
				fs := byAgg[agg]
				if len(fs) != n {
					t.Fatalf("%.60s: %d distinct events in Kafka, want %d", agg, len(fs), n)
				}
				bySeq := make([]time.Time, n+1)
				for _, f := range fs {
					bySeq[f.seq] = f.ts
				}
				for s := 2; s <= n; s++ {
					if bySeq[s].Before(bySeq[s-1]) {
						t.Fatalf("%.60s: seq %d produced at %v, before seq %d at %v", agg, s, bySeq[s], s-1, bySeq[s-1])
					}
				}
			}
			var retried, requeued int
			if err := db.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE attempts > 1 OR audit IS NOT NULL),
				count(*) FILTER (WHERE audit IS NOT NULL) FROM outbox_event`).Scan(&retried, &requeued); err != nil {
				t.Fatal(err)
			}
			t.Logf("%d events retried, %d of them requeued from DEAD", retried, requeued)
			rows, err := db.Pool.Query(ctx, "SELECT event_id FROM outbox_event WHERE status = 'PUBLISHED'")
			if err != nil {
				t.Fatal(err)
			}
			published := 0
			for rows.Next() {
				var id string
				if err := rows.Scan(&id); err != nil {
					t.Fatal(err)
				}
				published++
				if _, ok := firsts[id]; !ok {
					t.Errorf("event %s is PUBLISHED and not in Kafka", id)
				}
			}
			rows.Close()
			if published != total || len(firsts) != total {
				t.Fatalf("%d published rows, %d distinct events in Kafka, %d enqueued", published, len(firsts), total)
			}
		})
	}
}
