package consumertest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/consume"
)

// testStuckDeadLetter: a poison message on partition 0 whose dead-letter
// cannot be published, because the dead-letter topic does not exist
// ("missing-topic") or because the copy is too large ("too-large"):
//
//   - it is reported: dead-letter failures, then KindStuck once;
//   - it holds partition 0 only: messages on partition 1 produced after it
//     got stuck are handled, those after it on partition 0 are not;
//   - it is not acked: the broker's acked count stops before it;
//   - a second member can join (the rebalance completes) and both stop;
//   - missing-topic: once the operator creates the topic, a background
//     retry dead-letters it and partition 0 carries on, in order.
func testStuckDeadLetter(t *testing.T, h Harness, which string) {
	if which == "too-large" && h.ReferenceCopy {
		testReferenceCopy(t, h)
		return
	}
	w := newWorld(t, h, 2)
	dlq := w.dlq
	poison := []byte("poison")
	if which == "missing-topic" {
		dlq = "kit.events.missing-dlq" // never created (yet)
	} else {
		poison = append(poison, make([]byte, h.NearLimitValue-len(poison))...)
	}
	hnd := func(ctx context.Context, tx pgx.Tx, m *consume.Message) error {
		if strings.HasPrefix(string(m.Value), "poison") {
			// A long error: the copy's error header is cut, and still the
			// copy is too large in the too-large case.
			return consume.Permanent(errors.New("poison: " + strings.Repeat("x", 4000)))
		}
		return effectHandler(ctx, tx, m)
	}
	var evA, evB events
	newConsumer := func(ev *events) *consume.Consumer {
		// The topic is missing on purpose: no check at Start.
		d := w.broker.Driver(t, DriverConfig{Group: w.group, Topics: []string{w.topic}, DeadLetterTopic: dlq, SkipDeadLetterCheck: which == "missing-topic"})
		c, err := consume.New(w.db.Pool, d, hnd, &consume.Config{
			ConsumerID: w.group, BackoffMin: time.Millisecond, BackoffMax: 200 * time.Millisecond,
			DeadLetterAttempts: 2, DeadLetterTimeout: 3 * time.Second, AckTimeout: 5 * time.Second,
			Hook: ev.hook, Logger: quiet(),
		})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a := newConsumer(&evA)
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	stopA := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := a.Stop(ctx); err != nil {
			t.Fatalf("Stop of the member with the stuck message: %v", err)
		}
	}

	// ev-0 on partition 0 and ev-1 on partition 1 are handled; then the
	// poison on partition 0 gets stuck. ev-2 comes right after it, in the
	// same produce, so that it is most likely fetched with it: the driver
	// must bring it back after the hold.
	w.broker.Produce(t, w.topic, Msg{Partition: 0, EventID: "ev-0", Value: []byte("0")}, Msg{Partition: 1, EventID: "ev-1", Value: []byte("1")})
	w.waitEffects(t, 2, 60*time.Second)
	w.broker.Produce(t, w.topic, Msg{Partition: 0, EventID: "poison", Value: poison}, Msg{Partition: 0, EventID: "ev-2", Value: []byte("2")})
	waitFor(t, 60*time.Second, "the poison reported stuck", func() bool { return evA.count(consume.KindStuck, "poison") == 1 })
	if n := evA.count(consume.KindDeadLetterFailed, "poison"); n < 2 {
		t.Errorf("%d dead-letter failures reported before stuck, want 2", n)
	}

	// Partition 1 flows; partition 0 after the poison does not.
	w.broker.Produce(t, w.topic,
		Msg{Partition: 1, EventID: "ev-3", Value: []byte("3")},
		Msg{Partition: 1, EventID: "ev-4", Value: []byte("4")})
	waitFor(t, 60*time.Second, "partition 1 handled past the stuck partition 0", func() bool {
		return w.count(t, `SELECT count(*) FROM kit_effect WHERE event_id IN ('ev-3', 'ev-4')`) == 2
	})
	// The stuck message is retried in the background, every BackoffMax:
	// let a few retries pass, then look that nothing moved on partition 0.
	retried := evA.count(consume.KindDeadLetterFailed, "poison")
	waitFor(t, 60*time.Second, "background retries of the stuck dead-letter", func() bool {
		return evA.count(consume.KindDeadLetterFailed, "poison") >= retried+2
	})
	if n := w.count(t, `SELECT count(*) FROM kit_effect WHERE event_id = 'ev-2'`); n != 0 {
		t.Fatalf("ev-2, behind the stuck message on partition 0, was handled")
	}
	if n := w.count(t, `SELECT count(*) FROM processed_event WHERE event_id = 'poison'`); n != 0 {
		t.Fatalf("the stuck message has a processed_event row")
	}
	// Acked: ev-0 on partition 0 (the poison is the second message there)
	// and ev-1, ev-3, ev-4 on partition 1.
	waitFor(t, 60*time.Second, "partition 1 acked", func() bool { return w.broker.Acked(t, w.group, w.topic) >= 4 })
	if acked := w.broker.Acked(t, w.group, w.topic); acked != 4 {
		t.Fatalf("acked %d, want 4: the stuck message must not be acked", acked)
	}

	// A second member joins: the rebalance completes (the stuck message
	// does not block it), and B gets work or the stuck partition.
	b := newConsumer(&evB)
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the rebalance to complete", func() bool {
		w.broker.Produce(t, w.topic, Msg{Partition: 1, EventID: "ev-probe-" + time.Now().Format("150405.000000"), Value: []byte("probe")})
		return evB.count(consume.KindBegin, "") > 0
	})

	if which == "missing-topic" {
		// The operator's fix: create the dead-letter topic. A background
		// retry (of whichever member holds partition 0 now) dead-letters
		// the poison, and partition 0 carries on.
		w.broker.CreateTopic(t, dlq, 1)
		dl := w.broker.Read(t, dlq, 1, 60*time.Second)
		if dl[0].EventID != "poison" {
			t.Fatalf("dead letter %s, want poison", dl[0].EventID)
		}
		waitFor(t, 60*time.Second, "ev-2 handled after the fix", func() bool {
			return w.count(t, `SELECT count(*) FROM kit_effect WHERE event_id = 'ev-2'`) == 1
		})
	}
	stopA()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.Stop(ctx); err != nil {
		t.Fatalf("Stop of B: %v", err)
	}
	if which == "too-large" {
		// Still stuck, so still unacked: ev-0, ev-1, ev-3, ev-4 and the
		// probes on partition 1 are, ev-2 and the poison are not.
		probes := w.count(t, `SELECT count(*) FROM kit_effect WHERE value = 'probe'`)
		if acked := w.broker.Acked(t, w.group, w.topic); acked != 4+probes {
			t.Errorf("acked %d after both stopped, want %d: the stuck message was acked", acked, 4+probes)
		}
		stuckEnd := evA.count(consume.KindAbandoned, "poison") + evB.count(consume.KindAbandoned, "poison")
		if stuckEnd == 0 {
			t.Error("no member reported the stuck message abandoned at revoke or stop")
		}
	}
}

// testReferenceCopy is StuckDeadLetter's too-large case for a driver with
// Harness.ReferenceCopy: the poison's full copy does not fit, so a
// reference copy (no value, dlq-truncated, dlq-source) is dead-lettered,
// nothing is reported stuck, and the message behind it is handled.
func testReferenceCopy(t *testing.T, h Harness) {
	w := newWorld(t, h, 1)
	poison := append([]byte("poison"), make([]byte, h.NearLimitValue-len("poison"))...)
	hnd := func(ctx context.Context, tx pgx.Tx, m *consume.Message) error {
		if strings.HasPrefix(string(m.Value), "poison") {
			return consume.Permanent(errors.New("poison: " + strings.Repeat("x", 4000)))
		}
		return effectHandler(ctx, tx, m)
	}
	var ev events
	c := w.consumer(t, hnd, func(cfg *consume.Config) { cfg.Hook, cfg.DeadLetterAttempts = ev.hook, 2 })
	start(t, c)
	w.broker.Produce(t, w.topic,
		Msg{Partition: 0, EventID: "ev-0", Value: []byte("0")},
		Msg{Partition: 0, EventID: "poison", Value: poison},
		Msg{Partition: 0, EventID: "ev-2", Value: []byte("2")})
	dl := w.broker.Read(t, w.dlq, 1, 60*time.Second)
	if dl[0].EventID != "poison" || len(dl[0].Value) != 0 || dl[0].Headers["dlq-truncated"] != "true" || dl[0].Headers["dlq-source"] == "" {
		t.Fatalf("dead letter: event id %q, value %d bytes, headers %.300v; want a reference copy of poison", dl[0].EventID, len(dl[0].Value), dl[0].Headers)
	}
	w.waitEffects(t, 2, 60*time.Second)
	waitFor(t, 60*time.Second, "3 messages acked", func() bool { return w.broker.Acked(t, w.group, w.topic) == 3 })
	if n := ev.count(consume.KindStuck, ""); n != 0 {
		t.Errorf("%d stuck events, want 0", n)
	}
}

// testDeadLetterCheck: a consumer whose dead-letter topic does not exist
// fails at Start with an error naming it, before it takes any message;
// with the driver's check off it starts (and stops).
func testDeadLetterCheck(t *testing.T, h Harness) {
	w := newWorld(t, h, 1)
	const missing = "kit.events.nodlq"
	newConsumer := func(skip bool) *consume.Consumer {
		d := w.broker.Driver(t, DriverConfig{Group: w.group, Topics: []string{w.topic}, DeadLetterTopic: missing, SkipDeadLetterCheck: skip})
		c, err := consume.New(w.db.Pool, d, effectHandler, &consume.Config{ConsumerID: w.group, AckTimeout: 5 * time.Second, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := newConsumer(false)
	err := c.Start(ctx)
	if err == nil || !strings.Contains(err.Error(), missing) {
		_ = c.Stop(ctx)
		t.Fatalf("Start without the dead-letter topic %s: %v, want an error naming it", missing, err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatalf("Stop after a failed Start: %v", err)
	}
	start(t, newConsumer(true))
	// The existing dead-letter topic passes the check.
	d := w.broker.Driver(t, DriverConfig{Group: w.group, Topics: []string{w.topic}, DeadLetterTopic: w.dlq})
	ok, err := consume.New(w.db.Pool, d, effectHandler, &consume.Config{ConsumerID: w.group + "-ok", AckTimeout: 5 * time.Second, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	start(t, ok)
}
