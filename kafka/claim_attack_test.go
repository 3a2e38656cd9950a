package kafka_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testkafka"
	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/outbox"
)

// pubGate holds each call until released and then either fails it
// without sending (fail) or hands it to next.
type pubGate struct {
	next    outbox.Publisher
	fail    bool
	entered chan struct{}
	release chan struct{}
}

func (p *pubGate) Publish(ctx context.Context, events []outbox.Event) error {
	select {
	case p.entered <- struct{}{}:
	default:
	}
	<-p.release
	if p.fail {
		return errors.New("gate: refused")
	}
	return p.next.Publish(ctx, events)
}

// A two-phase relay whose lease was reaped during a slow publish that then
// fails must not record the failure against rows it no longer owns. Here
// the slow relay leases a-1 (topic t1) and a-2 (topic t2); the reaper
// returns them and a second relay leases both; the slow relay's publish
// fails; the second relay delivers a-1 and fails a-2 (kfake rejects every
// produce to t2), then t2 recovers. a-2 must still reach Kafka. When the
// slow relay blocked the aggregate anyway, its BlockAggregates held a-2,
// which was PUBLISHING under the second relay's lease: the second relay's
// failure mark returned a-2 to PENDING still held, so no claim could see
// it (a head must not be held), the sweep kept it (a failed event, its
// attempts counted), and a-2 — and every later event of the aggregate —
// waited for ever.
func TestLostLeaseFailureDoesNotStrandNewOwnersEvents(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	c := testkafka.New(t)
	c.CreateTopic(t, "t1", 1)
	c.CreateTopic(t, "t2", 1)
	ctx := context.Background()
	newPub := func() outbox.Publisher {
		p, err := kafka.NewPublisher(c.Client(t, kafka.ProducerOpts()...), nil)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	slow := &pubGate{fail: true, entered: make(chan struct{}, 1), release: make(chan struct{})}
	second := &pubGate{next: newPub(), entered: make(chan struct{}, 1), release: make(chan struct{})}
	cfg := outbox.RelayConfig{Mode: outbox.TwoPhase, DisableNotify: true, BatchTimeout: time.Minute,
		LeaseTTL: 3 * time.Minute, BackoffMin: time.Millisecond, BackoffMax: time.Millisecond, Logger: pubQuiet}
	cfg.Owner = "slow"
	slowRelay, err := outbox.NewRelay(db.Pool, slow, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Owner = "second"
	secondRelay, err := outbox.NewRelay(db.Pool, second, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Owner = "third"
	thirdRelay, err := outbox.NewRelay(db.Pool, newPub(), &cfg)
	if err != nil {
		t.Fatal(err)
	}
	pubEnqueue(t, db, pubMsg("t1", "a", 1), pubMsg("t2", "a", 2))

	slowDone := make(chan error, 1)
	go func() { _, err := slowRelay.RunBatch(ctx); slowDone <- err }()
	<-slow.entered
	if _, err := db.Pool.Exec(ctx, "UPDATE outbox_event SET locked_at = now() - interval '1 hour'"); err != nil {
		t.Fatal(err)
	}
	if n, err := thirdRelay.Reap(ctx); err != nil || n != 2 {
		t.Fatalf("reap: %d, %v", n, err)
	}
	fault := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "t2", Err: kerr.InvalidRecord, Count: -1})
	secondDone := make(chan error, 1)
	go func() { _, err := secondRelay.RunBatch(ctx); secondDone <- err }()
	<-second.entered // a-1 and a-2 are the second relay's
	close(slow.release)
	if err := <-slowDone; !errors.Is(err, outbox.ErrLeaseLost) {
		t.Fatalf("slow relay: %v, want lease lost", err)
	}
	close(second.release)
	if err := <-secondDone; err == nil || !strings.Contains(err.Error(), "1 of 2 events failed") {
		t.Fatalf("second relay: %v, want a-2 failed", err)
	}
	fault.Remove()

	deadline := time.Now().Add(30 * time.Second)
	for pubCount(t, db, "status <> 'PUBLISHED'") > 0 {
		if time.Now().After(deadline) {
			rows, _ := db.Pool.Query(ctx, "SELECT event_id, status, held, attempts FROM outbox_event ORDER BY id")
			var got []string
			for rows.Next() {
				var id, st string
				var held bool
				var att int
				_ = rows.Scan(&id, &st, &held, &att)
				got = append(got, id+" "+st+" held="+map[bool]string{true: "t", false: "f"}[held])
			}
			rows.Close()
			t.Fatalf("a-2 never published: %v", got)
		}
		if _, err := thirdRelay.Reap(ctx); err != nil { // the sweep too
			t.Fatal(err)
		}
		if _, err := thirdRelay.RunBatch(ctx); err != nil {
			t.Logf("batch: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // the backoff of a-2
	}
	recs := c.ReadAll(t, "t1", 1, 10*time.Second)
	recs = append(recs, c.ReadAll(t, "t2", 1, 10*time.Second)...)
	pubCheckOrder(t, recs, map[string]int{"a": 2})
}

// An aggregate can hold two DEAD events: a two-phase batch leased a-1 and
// a-2 and never finished (a relay that crashes on the batch, say), and the
// reaper took both back at the attempt limit. An operator discards a-2 and
// leaves a-1 DEAD, to requeue later. a-3 must still wait for a-1: the
// claim took a DISCARDED predecessor as "every earlier event is done",
// true only of a discarded aggregate head, so a-3 was published while a-1
// was DEAD, and a-1 after it once requeued — first deliveries out of
// order.
func TestDiscardBehindDeadEventKeepsOrder(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	c := testkafka.New(t)
	c.CreateTopic(t, "orders", 1)
	ctx := context.Background()
	pub, err := kafka.NewPublisher(c.Client(t, kafka.ProducerOpts()...), nil)
	if err != nil {
		t.Fatal(err)
	}
	gate := &pubGate{fail: true, entered: make(chan struct{}, 1), release: make(chan struct{})}
	cfg := outbox.RelayConfig{Mode: outbox.TwoPhase, DisableNotify: true, MaxAttempts: 1, Logger: pubQuiet}
	cfg.Owner = "crashing"
	crashing, err := outbox.NewRelay(db.Pool, gate, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Owner = "relay"
	relay, err := outbox.NewRelay(db.Pool, pub, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	pubEnqueue(t, db, pubMsg("orders", "a", 1), pubMsg("orders", "a", 2))
	done := make(chan error, 1)
	go func() { _, err := crashing.RunBatch(ctx); done <- err }()
	<-gate.entered
	if _, err := db.Pool.Exec(ctx, "UPDATE outbox_event SET locked_at = now() - interval '1 hour'"); err != nil {
		t.Fatal(err)
	}
	if n, err := relay.Reap(ctx); err != nil || n != 2 {
		t.Fatalf("reap: %d, %v", n, err)
	}
	close(gate.release)
	if err := <-done; !errors.Is(err, outbox.ErrLeaseLost) {
		t.Fatalf("crashing relay: %v, want lease lost", err)
	}
	if n := pubCount(t, db, "status = 'DEAD'"); n != 2 {
		t.Fatalf("%d DEAD events, want a-1 and a-2", n)
	}
	pubEnqueue(t, db, pubMsg("orders", "a", 3))
	admin := outbox.NewAdmin(db.Pool)
	act := outbox.Action{Actor: "test", Reason: "poison"}
	if err := admin.Discard(ctx, "a-2", act); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := relay.RunBatch(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := admin.Requeue(ctx, "a-1", act); err != nil {
		t.Fatal(err)
	}
	runUntilPublished(t, relay, db, "a-1 and a-3 published", 2)
	if got := eventIDs(t, c, "orders", 2); got != "a-1 a-3" {
		t.Fatalf("Kafka holds %v, want a-1 a-3", got)
	}
}

// runUntilPublished runs relay's batches until n rows are PUBLISHED.
func runUntilPublished(t *testing.T, relay *outbox.Relay, db *testdb.DB, what string, n int) {
	t.Helper()
	pubEventually(t, what, 20*time.Second, func() bool {
		if _, err := relay.RunBatch(context.Background()); err != nil {
			t.Fatal(err)
		}
		return pubCount(t, db, "status = 'PUBLISHED'") == n
	})
}

// eventIDs reads n records of topic and returns their event ids, in
// order, space-separated.
func eventIDs(t *testing.T, c *testkafka.Cluster, topic string, n int) string {
	t.Helper()
	var got []string
	for _, r := range c.ReadAll(t, topic, n, 10*time.Second) {
		got = append(got, pubHeader(r, kafka.HeaderEventID))
	}
	return strings.Join(got, " ")
}

// The sweep releases a blocked aggregate that has no failed event left
// (here: the state a two-phase relay leaves when it dies between marking a
// retried event PUBLISHED and releasing its aggregate) from sequence 0. A
// DISCARDED event of that aggregate must stay held: unheld, it sat in the
// claim's window as its aggregate's first row, never PENDING, so no later
// event of the aggregate was ever a head again.
func TestSweepKeepsDiscardedEventHeld(t *testing.T) {
	t.Parallel()
	for _, mode := range []outbox.Mode{outbox.AtLeastOnce, outbox.TwoPhase} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			c := testkafka.New(t)
			c.CreateTopic(t, "orders", 1)
			ctx := context.Background()
			pub, err := kafka.NewPublisher(c.Client(t, kafka.ProducerOpts()...), nil)
			if err != nil {
				t.Fatal(err)
			}
			relay, err := outbox.NewRelay(db.Pool, pub, &outbox.RelayConfig{Mode: mode, DisableNotify: true,
				MaxAttempts: 1, Logger: pubQuiet})
			if err != nil {
				t.Fatal(err)
			}
			pubEnqueue(t, db, pubMsg("orders", "a", 1))
			c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "orders", Err: kerr.InvalidRecord})
			if _, err := relay.RunBatch(ctx); err == nil {
				t.Fatal("a-1 delivered, want it failed")
			}
			if n := pubCount(t, db, "status = 'DEAD'"); n != 1 {
				t.Fatalf("%d DEAD, want a-1", n)
			}
			if err := outbox.NewAdmin(db.Pool).Discard(ctx, "a-1", outbox.Action{Actor: "test", Reason: "poison"}); err != nil {
				t.Fatal(err)
			}
			pubEnqueue(t, db, pubMsg("orders", "a", 2))
			if _, err := relay.RunBatch(ctx); err != nil {
				t.Fatal(err)
			}
			// a-2 was delivered as a retry and its relay died before the
			// release: the aggregate stays blocked, and a-3 is enqueued
			// held.
			if _, err := db.Pool.Exec(ctx, "UPDATE outbox_aggregate SET blocked = true"); err != nil {
				t.Fatal(err)
			}
			pubEnqueue(t, db, pubMsg("orders", "a", 3))
			if n := pubCount(t, db, "held AND event_id = 'a-3'"); n != 1 {
				t.Fatal("a-3 is not held")
			}
			if _, err := relay.Reap(ctx); err != nil { // the sweep
				t.Fatal(err)
			}
			pubEnqueue(t, db, pubMsg("orders", "a", 4))
			runUntilPublished(t, relay, db, "a-3 and a-4 published", 3)
			if got := eventIDs(t, c, "orders", 3); got != "a-2 a-3 a-4" {
				t.Fatalf("Kafka holds %v, want a-2 a-3 a-4", got)
			}
		})
	}
}

// The publisher's Check refuses a-3 (over the client's batch limit) and
// the produce of a-1 and a-2 fails (kfake): a-1 is the aggregate's first
// failure, so a-2 and a-3 are held behind it, not attempted, not counted
// (the package doc: a failed event ends its aggregate for the batch), and
// the aggregate is blocked at a-1. The refusal was counted and blocked
// first (the Checker runs before the call): a-3 went DEAD beside a-1 at
// MaxAttempts 1, a second DEAD event of one aggregate, and the block
// started at a-3, leaving a-1 (DEAD) and a-2 in the claim's index.
func TestCheckerRefusalBehindFailedEventIsHeld(t *testing.T) {
	t.Parallel()
	for _, mode := range []outbox.Mode{outbox.AtLeastOnce, outbox.TwoPhase} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			c := testkafka.New(t)
			c.CreateTopic(t, "orders", 1)
			db := testdb.New(t)
			pub, err := kafka.NewPublisher(c.Client(t, kgo.ProducerBatchMaxBytes(4096)), nil)
			if err != nil {
				t.Fatal(err)
			}
			big := pubMsg("orders", "a", 3)
			big.Payload = []byte(strings.Repeat("x", 10_000))
			pubEnqueue(t, db, pubMsg("orders", "a", 1), pubMsg("orders", "a", 2), big, pubMsg("orders", "a", 4))
			r, err := outbox.NewRelay(db.Pool, pub, &outbox.RelayConfig{Mode: mode, DisableNotify: true,
				MaxAttempts: 1, Logger: pubQuiet})
			if err != nil {
				t.Fatal(err)
			}
			c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "orders", Err: kerr.InvalidRecord})
			if n, err := r.RunBatch(context.Background()); n != 4 || err == nil {
				t.Fatalf("RunBatch = %d, %v; want 4 and a failure", n, err)
			}
			type st struct {
				status   string
				attempts int
				held     bool
			}
			got := map[string]st{}
			rows, err := db.Pool.Query(context.Background(), "SELECT event_id, status, attempts, held FROM outbox_event")
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var id string
				var s st
				if err := rows.Scan(&id, &s.status, &s.attempts, &s.held); err != nil {
					t.Fatal(err)
				}
				got[id] = s
			}
			rows.Close()
			want := map[string]st{
				"a-1": {"DEAD", 1, true},
				"a-2": {"PENDING", 0, true},
				"a-3": {"PENDING", 0, true},
				"a-4": {"PENDING", 0, true},
			}
			for id, w := range want {
				if got[id] != w {
					t.Errorf("%s: %+v, want %+v", id, got[id], w)
				}
			}
		})
	}
}
