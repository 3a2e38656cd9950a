package kafka_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testkafka"
	"github.com/idemkit/idem/outbox"
)

// Three relay processes share a table while writers enqueue; one of them
// is SIGKILLed mid-batch: its publish call has produced (the broker has
// the events) and the batch is not marked. The two survivors take the
// batch over (at-least-once: the killed backend's transaction rolls back;
// two-phase: the reaper returns the lease after its TTL) and finish the
// load: every event reaches Kafka, each aggregate's first deliveries in
// sequence order, and the killed batch's events are there twice (the
// proof that the kill fell between produce and mark).
func TestSIGKILLOneOfThreeRelaysUnderLoad(t *testing.T) {
	t.Parallel()
	bin := pubBuildRelay(t)
	for _, mode := range []string{"at-least-once", "two-phase"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			const writers, txPerWriter, perTx, aggregates = 4, 100, 10, 40
			const events = writers * txPerWriter * perTx
			db := testdb.New(t, testdb.MaxConns(12))
			c := testkafka.New(t)
			c.CreateTopic(t, "orders", 4)
			ctx := context.Background()
			args := []string{"-db", db.URL, "-brokers", strings.Join(c.Addrs, ","), "-mode", mode,
				"-batch-size", "50", "-batch-timeout", "2s", "-lease-ttl", "5s"}
			victim := pubStartRelay(t, bin, append([]string{"-owner", "victim", "-hold-published", "3"}, args...)...)
			var survivors []*pubRelayProc
			for i := range 2 {
				survivors = append(survivors, pubStartRelay(t, bin, append([]string{"-owner", "survivor-" + strconv.Itoa(i)}, args...)...))
			}
			for _, p := range append([]*pubRelayProc{victim}, survivors...) {
				p.waitLine(t, "STARTED")
			}

			// The load: writers enqueue while the relays run, each
			// aggregate's count kept to know what Kafka must hold.
			var mu sync.Mutex
			counter := make([]int, aggregates)
			var wg sync.WaitGroup
			stopWriters := make(chan struct{})
			for w := range writers {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(w), 7))
					for range txPerWriter {
						select {
						case <-stopWriters:
							return
						default:
						}
						msgs := make([]outbox.Message, perTx)
						tx, err := db.Pool.Begin(ctx)
						if err != nil {
							t.Error(err)
							return
						}
						// The counter moves only once the transaction
						// commits: the lock on the aggregate's counter row
						// orders the writers' numbers, not this map.
						for j := range msgs {
							a := rng.IntN(aggregates)
							msgs[j] = pubMsg("orders", fmt.Sprintf("agg-%02d", a), 0)
							msgs[j].EventID = fmt.Sprintf("w%d-%s", w, outbox.NewEventID())
						}
						if _, err := outbox.EnqueueTx(ctx, tx, msgs...); err != nil {
							_ = tx.Rollback(ctx)
							t.Error(err)
							return
						}
						if err := tx.Commit(ctx); err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						for _, m := range msgs {
							a, _ := strconv.Atoi(strings.TrimPrefix(m.AggregateID, "agg-"))
							counter[a]++
						}
						mu.Unlock()
					}
				})
			}
			defer func() {
				close(stopWriters)
				wg.Wait()
			}()

			line := victim.waitLine(t, "PUBLISHED-HELD ")
			held, err := strconv.Atoi(strings.TrimPrefix(line, "PUBLISHED-HELD "))
			if err != nil || held < 1 {
				t.Fatalf("bad line %q", line)
			}
			if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			victim.wait(t)
			if ws, ok := victim.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("victim did not die by SIGKILL: %v", victim.cmd.ProcessState)
			}
			wg.Wait()
			if t.Failed() {
				return
			}
			if n := pubCount(t, db, "true"); n != events {
				t.Fatalf("%d events enqueued, want %d", n, events)
			}
			pubEventually(t, "every event published by the survivors", 120*time.Second, func() bool {
				return pubCount(t, db, "status <> 'PUBLISHED'") == 0
			})
			recs := c.ReadAll(t, "orders", events+held, 60*time.Second)
			want := map[string]int{}
			for a, n := range counter {
				if n > 0 {
					want[fmt.Sprintf("agg-%02d", a)] = n
				}
			}
			dups := pubCheckOrder(t, recs, want)
			if dups < held {
				t.Fatalf("%d duplicates in Kafka, want at least the killed batch's %d", dups, held)
			}
			for _, p := range survivors {
				if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
				if code := p.wait(t); code != 0 {
					t.Fatalf("survivor exit status %d:\n%s", code, p.stderr.String())
				}
			}
		})
	}
}
