package outbox_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/lifecycle"
	"github.com/idemkit/idem/outbox"
)

func TestEnqueueTxValidatesAndGeneratesIDs(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	testCases := []struct {
		name  string
		m     outbox.Message
		field string
	}{
		{"no topic", outbox.Message{AggregateType: "a", AggregateID: "1", EventType: "E"}, "Topic"},
		{"no aggregate type", outbox.Message{Topic: "t", AggregateID: "1", EventType: "E"}, "AggregateType"},
		{"no aggregate id", outbox.Message{Topic: "t", AggregateType: "a", EventType: "E"}, "AggregateID"},
		{"no event type", outbox.Message{Topic: "t", AggregateType: "a", AggregateID: "1"}, "EventType"},
	}
	for _, tt := range testCases {
		_, err := outbox.Enqueue(ctx, db.Pool, tt.m)
		if !errors.Is(err, outbox.ErrInvalidMessage) || !strings.Contains(err.Error(), tt.field) {
			t.Errorf("%s: err = %v, want ErrInvalidMessage naming %s", tt.name, err, tt.field)
		}
	}
	ids, err := outbox.Enqueue(ctx, db.Pool,
		outbox.Message{Topic: "t", AggregateType: "a", AggregateID: "1", EventType: "E", Headers: map[string]string{"k": "v"}},
		outbox.Message{Topic: "t", AggregateType: "a", AggregateID: "1", EventType: "E", EventID: "given"})
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 2 || len(ids[0]) != 32 || ids[1] != "given" {
		t.Fatalf("ids = %q", ids)
	}
	_, err = outbox.Enqueue(ctx, db.Pool, outbox.Message{Topic: "t", AggregateType: "a", AggregateID: "2", EventType: "E", EventID: "given"})
	if !errors.Is(err, outbox.ErrInvalidMessage) {
		t.Fatalf("duplicate event id: err = %v, want ErrInvalidMessage", err)
	}
	var seqs []int64
	rows, _ := db.Pool.Query(ctx, "SELECT aggregate_seq FROM outbox_event ORDER BY id")
	for rows.Next() {
		var s int64
		_ = rows.Scan(&s)
		seqs = append(seqs, s)
	}
	if rows.Err() != nil || !slices.Equal(seqs, []int64{1, 2}) {
		t.Fatalf("seqs = %v (%v)", seqs, rows.Err())
	}
}

// A rolled-back enqueue leaves nothing — no row, no gap in the sequence.
func TestEnqueueRollbackLeavesNoTrace(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.EnqueueTx(ctx, tx, msg("a", 1)); err != nil {
		t.Fatal(err)
	}
	// A concurrent enqueuer of the same aggregate waits for tx.
	got := make(chan int64, 1)
	go func() {
		ctx := context.Background()
		tx2, err := db.Pool.Begin(ctx)
		if err != nil {
			got <- -1
			return
		}
		defer tx2.Rollback(ctx) //nolint:errcheck
		if _, err := outbox.EnqueueTx(ctx, tx2, msg("a", 2)); err != nil {
			got <- -1
			return
		}
		var seq int64
		_ = tx2.QueryRow(ctx, "SELECT aggregate_seq FROM outbox_event WHERE event_id = 'a-2'").Scan(&seq)
		_ = tx2.Commit(ctx)
		got <- seq
	}()
	// The second enqueuer is blocked on the aggregate's counter row.
	eventually(t, "second enqueuer to block", func() bool {
		var n int
		_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%outbox_aggregate%'`).Scan(&n)
		return n > 0
	})
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if seq := <-got; seq != 1 {
		t.Fatalf("after the first enqueue rolled back, the second got seq %d, want 1", seq)
	}
	if st := statuses(t, db); len(st) != 1 || st["a-2"] != "PENDING" {
		t.Fatalf("rows = %v", st)
	}
}

// Many transactions enqueue for a few aggregates at once: every aggregate's
// sequence is 1..n with no gap and no duplicate, and agrees with id order.
func TestEnqueueConcurrentSameAggregate(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, testdb.MaxConns(16))
	ctx := context.Background()
	const writers, perWriter = 12, 25
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWriter {
				tx, err := db.Pool.Begin(ctx)
				if err != nil {
					errs <- err
					return
				}
				// Two aggregates per tx, in both orders across writers: the
				// sorted counter upsert must not deadlock.
				a, b := "x", "y"
				if (w+i)%2 == 0 {
					a, b = b, a
				}
				_, err = outbox.EnqueueTx(ctx, tx, msg(a, w*1000+i), msg(b, w*1000+i))
				if err == nil {
					err = tx.Commit(ctx)
				} else {
					_ = tx.Rollback(ctx)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, agg := range []string{"x", "y"} {
		rows, err := db.Pool.Query(ctx, "SELECT aggregate_seq FROM outbox_event WHERE aggregate_id = $1 ORDER BY id", agg)
		if err != nil {
			t.Fatal(err)
		}
		var seqs []int64
		for rows.Next() {
			var s int64
			_ = rows.Scan(&s)
			seqs = append(seqs, s)
		}
		rows.Close()
		if len(seqs) != writers*perWriter {
			t.Fatalf("%s: %d events", agg, len(seqs))
		}
		for i, s := range seqs {
			if s != int64(i+1) {
				t.Fatalf("%s: seq at position %d is %d: gap, duplicate or id/seq disagreement", agg, i, s)
			}
		}
	}
}

// Two writers commit out of id order: the later id commits first. A
// high-water-mark relay would publish id 2, advance its mark past 1 and
// never see id 1. The status-based claim publishes both.
func TestOutOfOrderCommitsNotSkipped(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			ctx := context.Background()
			rec := newRecorder()
			r := newRelay(t, db, rec, outbox.RelayConfig{Mode: mode, DisableNotify: true})

			tx1, err := db.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx1.Rollback(ctx)                                            //nolint:errcheck
			if _, err := outbox.EnqueueTx(ctx, tx1, msg("a", 1)); err != nil { // lower id, commits last
				t.Fatal(err)
			}
			enqueue(t, db.Pool, msg("b", 1)) // higher id, commits first
			var idA, idB int64
			_ = db.Pool.QueryRow(ctx, "SELECT max(id) FROM outbox_event").Scan(&idB)
			_ = tx1.QueryRow(ctx, "SELECT id FROM outbox_event WHERE event_id = 'a-1'").Scan(&idA)
			if idA >= idB {
				t.Fatalf("setup: ids %d, %d not out of commit order", idA, idB)
			}
			drain(t, r)
			if got := rec.deliveredIDs(); !slices.Equal(got, []string{"b-1"}) {
				t.Fatalf("before tx1 commits: delivered %v", got)
			}
			if err := tx1.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			drain(t, r)
			if got := rec.deliveredIDs(); !slices.Equal(got, []string{"b-1", "a-1"}) {
				t.Fatalf("delivered %v, want b-1 then a-1", got)
			}
			if st := statuses(t, db); st["a-1"] != "PUBLISHED" || st["b-1"] != "PUBLISHED" {
				t.Fatalf("statuses %v", st)
			}
		})
	}
}

// A failed publish of an aggregate's first event holds back the rest of
// that aggregate (even though the publisher accepted them in the same
// batch) and only that aggregate; the retry delivers in order.
func TestRetryAfterFailedPublishKeepsOrder(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			rec := newRecorder()
			rec.ignoreOrderContract = true // the relay must hold a-2, a-3 back anyway
			failures := 1
			rec.fail = func(e outbox.Event) error {
				if e.EventID == "a-1" && failures > 0 {
					failures--
					return errors.New("broker said no")
				}
				return nil
			}
			r := newRelay(t, db, rec, outbox.RelayConfig{Mode: mode, DisableNotify: true,
				BackoffMin: time.Hour, BackoffMax: time.Hour})
			enqueue(t, db.Pool, msg("a", 1), msg("a", 2), msg("b", 1), msg("a", 3), msg("b", 2))
			if _, err := r.RunBatch(context.Background()); err == nil {
				t.Fatal("first batch: want the publisher's error")
			}
			st := statuses(t, db)
			if st["b-1"] != "PUBLISHED" || st["b-2"] != "PUBLISHED" || st["a-1"] != "PENDING" || st["a-2"] != "PENDING" {
				t.Fatalf("after failed batch: %v", st)
			}
			var attempts int
			var lastErr string
			_ = db.Pool.QueryRow(context.Background(),
				"SELECT attempts, last_error FROM outbox_event WHERE event_id = 'a-1'").Scan(&attempts, &lastErr)
			if attempts != 1 || !strings.Contains(lastErr, "broker said no") {
				t.Fatalf("a-1 attempts %d, last_error %q", attempts, lastErr)
			}
			// While a-1 backs off, a-2 and a-3 wait behind it.
			drain(t, r)
			if st := statuses(t, db); st["a-2"] != "PENDING" || st["a-3"] != "PENDING" {
				t.Fatalf("during a-1's backoff: %v", st)
			}
			rec.ignoreOrderContract = false
			deliveredBefore := len(rec.snapshot())
			// The backoff ends (without waiting an hour).
			if _, err := db.Pool.Exec(context.Background(), "UPDATE outbox_event SET available_at = now() WHERE event_id = 'a-1'"); err != nil {
				t.Fatal(err)
			}
			eventually(t, "all published", func() bool {
				_, _ = r.RunBatch(context.Background())
				for _, s := range statuses(t, db) {
					if s != "PUBLISHED" {
						return false
					}
				}
				return true
			})
			// Only the relay's *successful* deliveries count; within "a"
			// they are in sequence order, each exactly once from the
			// table's point of view.
			var a []int64
			for _, e := range rec.snapshot() {
				if e.AggregateID == "a" {
					a = append(a, e.Seq)
				}
			}
			// The accepted-but-held a-2 and a-3 of the first batch were
			// delivered then too (a duplicate the consumer drops); what
			// matters is that a-1's first delivery precedes every a-2/a-3
			// delivery after it, and the final pass is 1, 2, 3.
			if len(a) < 3 || !slices.Equal(a[len(a)-3:], []int64{1, 2, 3}) {
				t.Fatalf("deliveries of a: %v", a)
			}
			var after []int64
			for _, e := range rec.snapshot()[deliveredBefore:] {
				if e.AggregateID == "a" {
					after = append(after, e.Seq)
				}
			}
			if !slices.Equal(after, []int64{1, 2, 3}) {
				t.Fatalf("deliveries of a after the backoff: %v, want 1 2 3", after)
			}
		})
	}
}

// A poison event retries with backoff, becomes DEAD with its error after
// MaxAttempts, and holds back only its own aggregate; Requeue releases it.
func TestPoisonEventGoesDeadAndIsolated(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			ctx := context.Background()
			rec := newRecorder()
			var mu sync.Mutex
			poisoned := true
			rec.fail = func(e outbox.Event) error {
				mu.Lock()
				defer mu.Unlock()
				if e.EventID == "p-1" && poisoned {
					return fmt.Errorf("cannot encode %s", e.EventID)
				}
				return nil
			}
			r := newRelay(t, db, rec, outbox.RelayConfig{Mode: mode, DisableNotify: true, MaxAttempts: 3,
				BackoffMin: time.Millisecond, BackoffMax: time.Millisecond})
			enqueue(t, db.Pool, msg("p", 1), msg("p", 2), msg("q", 1))
			enqueue(t, db.Pool, msg("q", 2), msg("p", 3), msg("r", 1))
			eventually(t, "p-1 DEAD", func() bool {
				_, _ = r.RunBatch(ctx)
				return statuses(t, db)["p-1"] == "DEAD"
			})
			drain(t, r)
			st := statuses(t, db)
			for _, id := range []string{"q-1", "q-2", "r-1"} {
				if st[id] != "PUBLISHED" {
					t.Errorf("%s is %s: a poison event of another aggregate held it back", id, st[id])
				}
			}
			if st["p-2"] != "PENDING" || st["p-3"] != "PENDING" {
				t.Errorf("p-2 %s, p-3 %s: want PENDING behind the dead p-1", st["p-2"], st["p-3"])
			}
			for _, e := range rec.snapshot() {
				if e.AggregateID == "p" {
					t.Errorf("%s delivered while p-1 is dead", e.EventID)
				}
			}
			status, err := outbox.GetStatus(ctx, db.Pool, time.Minute, 10)
			if err != nil {
				t.Fatal(err)
			}
			if status.Dead != 1 || len(status.DeadEvents) != 1 || status.DeadEvents[0].Attempts != 3 ||
				!strings.Contains(status.DeadEvents[0].LastError, "cannot encode p-1") || status.Pending != 2 {
				t.Fatalf("status %+v", status)
			}
			mu.Lock()
			poisoned = false
			mu.Unlock()
			if n, err := outbox.Requeue(ctx, db.Pool, "p-1"); err != nil || n != 1 {
				t.Fatalf("requeue: %d, %v", n, err)
			}
			drain(t, r)
			var p []string
			for _, e := range rec.snapshot() {
				if e.AggregateID == "p" {
					p = append(p, e.EventID)
				}
			}
			if !slices.Equal(p, []string{"p-1", "p-2", "p-3"}) {
				t.Fatalf("after requeue delivered %v", p)
			}
		})
	}
}

// Two-phase: the lease of a slow batch is reaped and the events are
// published by another relay; the slow relay's completion — success or
// failure — is refused by the token guard and leaves the new owner's
// result in place.
func TestReapedLeaseIsTokenGuarded(t *testing.T) {
	t.Parallel()
	for _, slowFails := range []bool{false, true} {
		t.Run(fmt.Sprintf("slow relay fails=%v", slowFails), func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			ctx := context.Background()
			slow := newRecorder()
			slow.entered = make(chan []outbox.Event, 1)
			slow.release = make(chan struct{})
			if slowFails {
				slow.fail = func(outbox.Event) error { return errors.New("slow failure") }
			}
			cfg := outbox.RelayConfig{Mode: outbox.TwoPhase, DisableNotify: true, Owner: "slow",
				BatchTimeout: time.Minute, LeaseTTL: 3 * time.Minute, BackoffMin: time.Hour, BackoffMax: time.Hour}
			slowRelay := newRelay(t, db, slow, cfg)
			fast := newRecorder()
			cfg.Owner = "fast"
			fastRelay := newRelay(t, db, fast, cfg)
			enqueue(t, db.Pool, msg("a", 1), msg("a", 2))

			done := make(chan error, 1)
			go func() { _, err := slowRelay.RunBatch(ctx); done <- err }()
			<-slow.entered
			var owner string
			var attempts int
			_ = db.Pool.QueryRow(ctx, "SELECT lease_owner, attempts FROM outbox_event WHERE event_id = 'a-1'").Scan(&owner, &attempts)
			if owner != "slow" || attempts != 1 {
				t.Fatalf("lease owner %q attempts %d", owner, attempts)
			}
			// Age the lease past its TTL (instead of waiting 3 minutes).
			if _, err := db.Pool.Exec(ctx, "UPDATE outbox_event SET locked_at = now() - interval '1 hour'"); err != nil {
				t.Fatal(err)
			}
			if n, err := fastRelay.Reap(ctx); err != nil || n != 2 {
				t.Fatalf("reap: %d, %v", n, err)
			}
			_ = db.Pool.QueryRow(ctx, "SELECT attempts FROM outbox_event WHERE event_id = 'a-1'").Scan(&attempts)
			if attempts != 1 {
				t.Fatalf("reaper changed attempts to %d", attempts)
			}
			enqueue(t, db.Pool, msg("a", 3))
			drain(t, fastRelay)
			if got := fast.deliveredIDs(); !slices.Equal(got, []string{"a-1", "a-2", "a-3"}) {
				t.Fatalf("new owner delivered %v", got)
			}
			close(slow.release)
			if err := <-done; !errors.Is(err, outbox.ErrLeaseLost) {
				t.Fatalf("slow relay: err = %v, want ErrLeaseLost", err)
			}
			for id, s := range statuses(t, db) {
				if s != "PUBLISHED" {
					t.Errorf("%s is %s after the slow relay finished", id, s)
				}
			}
		})
	}
}

// The reaper returns expired leases to PENDING with attempts preserved and
// to DEAD when they are used up.
func TestReaperDeadAtMaxAttempts(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	r := newRelay(t, db, newRecorder(), outbox.RelayConfig{Mode: outbox.TwoPhase, DisableNotify: true, MaxAttempts: 2})
	enqueue(t, db.Pool, msg("a", 1), msg("b", 1))
	if _, err := db.Pool.Exec(ctx, `UPDATE outbox_event SET status = 'PUBLISHING', lease_owner = 'gone', lease_token = 7,
		locked_at = now() - interval '1 hour', attempts = CASE WHEN event_id = 'a-1' THEN 1 ELSE 2 END`); err != nil {
		t.Fatal(err)
	}
	if n, err := r.Reap(ctx); err != nil || n != 2 {
		t.Fatalf("reap: %d, %v", n, err)
	}
	st := statuses(t, db)
	if st["a-1"] != "PENDING" || st["b-1"] != "DEAD" {
		t.Fatalf("statuses %v", st)
	}
}

// Soft stop lets the batch in hand publish and mark; hard stop cancels it.
func TestStopFinishesBatchInHand(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			rec := newRecorder()
			rec.entered = make(chan []outbox.Event, 1)
			rec.release = make(chan struct{})
			r := newRelay(t, db, rec, outbox.RelayConfig{Mode: mode, DisableNotify: true})
			if err := r.Stop(context.Background()); err != nil { // before Start
				t.Fatal(err)
			}
			enqueue(t, db.Pool, msg("a", 1), msg("a", 2))
			runCtx, cancel := context.WithCancel(context.Background())
			if err := r.Start(runCtx); err != nil {
				t.Fatal(err)
			}
			_ = r.Start(runCtx) // no-op
			<-rec.entered
			cancel() // SIGTERM arrives mid-batch
			stopped := make(chan error, 1)
			go func() { stopped <- r.Stop(context.Background()) }()
			close(rec.release)
			if err := <-stopped; err != nil {
				t.Fatal(err)
			}
			if err := r.Stop(context.Background()); err != nil { // twice
				t.Fatal(err)
			}
			for id, s := range statuses(t, db) {
				if s != "PUBLISHED" {
					t.Errorf("%s is %s after soft stop", id, s)
				}
			}
		})
	}
}

func TestHardStopCancelsBatch(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	rec := newRecorder()
	rec.entered = make(chan []outbox.Event, 1)
	rec.release = make(chan struct{}) // never closed: only ctx ends the publish
	r := newRelay(t, db, rec, outbox.RelayConfig{DisableNotify: true})
	enqueue(t, db.Pool, msg("a", 1))
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-rec.entered
	if err := r.HardStop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := statuses(t, db); st["a-1"] != "PENDING" {
		t.Fatalf("a-1 is %s after hard stop, want PENDING (rolled back)", st["a-1"])
	}
}

// With a one-hour poll interval, only the NOTIFY sent at commit can wake
// the relay; after the listener's backend is killed it reconnects and
// wakes again.
func TestNotifyWakesRelayAndListenerReconnects(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	rec := newRecorder()
	owner := fmt.Sprintf("notify-%d", time.Now().UnixNano()%1e9)
	h := &hookLog{}
	r := newRelay(t, db, rec, outbox.RelayConfig{PollInterval: time.Hour, Owner: owner, Hook: h.hook})
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	listenerPID := func() int {
		var pid int
		_ = db.Pool.QueryRow(ctx, `SELECT coalesce(max(pid), 0) FROM pg_stat_activity
			WHERE application_name = $1 AND query LIKE 'LISTEN%'`, outbox.ListenerApplicationName(owner)).Scan(&pid)
		return pid
	}
	waitDelivered := func(id string) {
		eventually(t, id+" delivered", func() bool { return slices.Contains(rec.deliveredIDs(), id) })
	}
	var pid int
	eventually(t, "listener", func() bool { pid = listenerPID(); return pid != 0 })
	enqueue(t, db.Pool, msg("a", 1))
	waitDelivered("a-1")

	if _, err := db.Pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	eventually(t, "listener back", func() bool { p := listenerPID(); return p != 0 && p != pid })
	enqueue(t, db.Pool, msg("a", 2))
	waitDelivered("a-2")
	if lf := h.of(outbox.RelayListenFailed); len(lf) == 0 || lf[0].Err == nil {
		t.Fatalf("no listen_failed hook event with its error after the listener's backend died: %+v", lf)
	}
}

// The relay is a lifecycle component with the one start/stop behaviour:
// stops before Start and twice are no-ops, Start's ctx lends values and
// nothing else (cancelling it stops nothing), and Start after a stop is a
// fresh run.
func TestRelayLifecycle(t *testing.T) {
	t.Parallel()
	var _ lifecycle.Component = (*outbox.Relay)(nil)
	var _ lifecycle.HardStopper = (*outbox.Relay)(nil)
	db := testdb.New(t)
	rec := newRecorder()
	r := newRelay(t, db, rec, outbox.RelayConfig{DisableNotify: true, PollInterval: 10 * time.Millisecond})
	ctx := context.Background()
	if err := r.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.HardStop(ctx); err != nil {
		t.Fatal(err)
	}
	startCtx, cancel := context.WithCancel(ctx)
	if err := r.Start(startCtx); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(startCtx); err != nil {
		t.Fatal(err)
	}
	cancel() // changes nothing: the run goes on
	enqueue(t, db.Pool, msg("a", 1))
	eventually(t, "a-1 delivered by a run whose Start ctx was cancelled", func() bool {
		return slices.Contains(rec.deliveredIDs(), "a-1")
	})
	for range 2 {
		if err := r.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Start(ctx); err != nil { // a fresh run
		t.Fatal(err)
	}
	enqueue(t, db.Pool, msg("a", 2))
	eventually(t, "a-2 delivered by the second run", func() bool {
		return slices.Contains(rec.deliveredIDs(), "a-2")
	})
	for range 2 {
		if err := r.HardStop(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Published rows older than Retention are purged in batches by the
// scheduled purger; younger and unpublished rows stay.
func TestRetentionPurge(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	rec := newRecorder()
	r := newRelay(t, db, rec, outbox.RelayConfig{DisableNotify: true, Retention: time.Hour,
		PurgeInterval: 10 * time.Millisecond, PurgeBatchSize: 3})
	var msgs []outbox.Message
	for i := range 10 {
		msgs = append(msgs, msg(fmt.Sprint("old", i), 1))
	}
	enqueue(t, db.Pool, msgs...)
	drain(t, r)
	if _, err := db.Pool.Exec(ctx, "UPDATE outbox_event SET published_at = now() - interval '2 hours'"); err != nil {
		t.Fatal(err)
	}
	enqueue(t, db.Pool, msg("young", 1))
	drain(t, r)
	enqueue(t, db.Pool, msg("pending", 1))
	if err := r.Start(ctx); err != nil { // the loop publishes "pending" right away; it is young
		t.Fatal(err)
	}
	eventually(t, "purge", func() bool { return len(statuses(t, db)) == 2 })
	st := statuses(t, db)
	if st["young-1"] != "PUBLISHED" || st["pending-1"] == "" {
		t.Fatalf("left %v", st)
	}
}

func TestNewRelayValidates(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	testCases := []struct {
		cfg   outbox.RelayConfig
		field string
	}{
		{outbox.RelayConfig{Mode: 7}, "Mode"},
		{outbox.RelayConfig{BatchSize: -1}, "BatchSize"},
		{outbox.RelayConfig{BatchTimeout: time.Minute, LeaseTTL: time.Minute}, "LeaseTTL"},
		{outbox.RelayConfig{MaxAttempts: -1}, "MaxAttempts"},
		{outbox.RelayConfig{BackoffMin: time.Hour, BackoffMax: time.Second}, "BackoffMin"},
		{outbox.RelayConfig{PurgeBatchSize: -3}, "PurgeBatchSize"},
		// Checked after the defaults are filled in: each is wrong only
		// against a default.
		{outbox.RelayConfig{BatchTimeout: 40 * time.Second}, "LeaseTTL"},
		{outbox.RelayConfig{BackoffMin: 10 * time.Minute}, "BackoffMax"},
		{outbox.RelayConfig{Owner: strings.Repeat("o", outbox.OwnerMaxLen+1)}, "Owner"},
		{outbox.RelayConfig{BatchSize: outbox.BatchSizeMax + 1}, "BatchSize"},
	}
	for _, tt := range testCases {
		_, err := outbox.NewRelay(db.Pool, newRecorder(), &tt.cfg)
		if !errors.Is(err, outbox.ErrInvalidConfig) || !strings.Contains(err.Error(), tt.field) {
			t.Errorf("%+v: err = %v, want ErrInvalidConfig naming %s", tt.cfg, err, tt.field)
		}
	}
	if _, err := outbox.NewRelay(db.Pool, nil, nil); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Errorf("nil publisher: %v", err)
	}
	if r, err := outbox.NewRelay(db.Pool, newRecorder(), nil); err != nil || r == nil {
		t.Errorf("nil config: %v", err)
	}
}

// A publish that outlives the batch (a broker that does not answer) is cut
// off early enough for the batch to record the failure: the attempt is
// counted, the error kept and the event is PENDING again with a backoff, in
// both modes. Without the reserve the mark ran on the expired context: in
// two-phase mode the event stayed PUBLISHING until the reaper's LeaseTTL.
func TestPublishTimeoutIsRecorded(t *testing.T) {
	t.Parallel()
	for _, mode := range []outbox.Mode{outbox.AtLeastOnce, outbox.TwoPhase} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			rec := newRecorder()
			rec.release = make(chan struct{}) // never closed: only ctx ends the publish
			// A long backoff: full jitter draws the delay in [0, BackoffMin] for
			// a first failure, and the check below needs one that has not passed.
			r := newRelay(t, db, rec, outbox.RelayConfig{Mode: mode, DisableNotify: true, BatchTimeout: 2 * time.Second,
				BackoffMin: time.Hour, BackoffMax: time.Hour})
			enqueue(t, db.Pool, msg("a", 1))
			if n, err := r.RunBatch(context.Background()); n != 1 || err == nil {
				t.Fatalf("RunBatch = %d, %v; want 1 event and the publish error", n, err)
			}
			var status, lastErr string
			var attempts int
			var backoff bool
			if err := db.Pool.QueryRow(context.Background(),
				`SELECT status, attempts, coalesce(last_error, ''), available_at > now() FROM outbox_event`).
				Scan(&status, &attempts, &lastErr, &backoff); err != nil {
				t.Fatal(err)
			}
			if status != "PENDING" || attempts != 1 || !strings.Contains(lastErr, "deadline") || !backoff {
				t.Fatalf("after a timed-out publish: status %s, attempts %d, last_error %q, backoff %v; want PENDING, 1, a deadline error, true",
					status, attempts, lastErr, backoff)
			}
		})
	}
}

// One aggregate's events go to two topics: seq 1 to a topic whose publish
// fails, seq 2 to a healthy one. seq 2 must not reach the broker (nor be
// marked) before seq 1 has: a relay that hands both to one Publish call
// gets seq 2 delivered on the healthy topic while seq 1 fails, whatever it
// records afterwards. Other aggregates flow; once the topic heals, the
// aggregate is delivered in order.
func TestAggregateOrderAcrossTopics(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			rec := newRecorder()
			var mu sync.Mutex
			down := true
			rec.fail = func(e outbox.Event) error {
				mu.Lock()
				defer mu.Unlock()
				if e.Topic == "bad" && down {
					return errors.New("topic bad is down")
				}
				return nil
			}
			r := newRelay(t, db, rec, outbox.RelayConfig{Mode: mode, DisableNotify: true,
				BackoffMin: time.Hour, BackoffMax: time.Hour})
			enqueue(t, db.Pool, msgTo("bad", "a", 1), msgTo("good", "a", 2), msgTo("good", "b", 1), msgTo("good", "a", 3))
			if _, err := r.RunBatch(context.Background()); err == nil {
				t.Fatal("want the failure of a-1")
			}
			if got := rec.deliveredIDs(); !slices.Equal(got, []string{"b-1"}) {
				t.Fatalf("delivered %v, want only b-1: a-2 and a-3 must wait for a-1", got)
			}
			st := statuses(t, db)
			if st["a-1"] != "PENDING" || st["a-2"] != "PENDING" || st["a-3"] != "PENDING" || st["b-1"] != "PUBLISHED" {
				t.Fatalf("statuses %v", st)
			}
			var attempts []int
			rows, err := db.Pool.Query(context.Background(), "SELECT attempts FROM outbox_event WHERE aggregate_id = 'a' ORDER BY aggregate_seq")
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var n int
				_ = rows.Scan(&n)
				attempts = append(attempts, n)
			}
			rows.Close()
			if !slices.Equal(attempts, []int{1, 0, 0}) {
				t.Fatalf("attempts of a: %v, want [1 0 0] (only a-1 was tried)", attempts)
			}
			mu.Lock()
			down = false
			mu.Unlock()
			if _, err := db.Pool.Exec(context.Background(), "UPDATE outbox_event SET available_at = now()"); err != nil {
				t.Fatal(err)
			}
			drain(t, r)
			if got := rec.deliveredIDs(); !slices.Equal(got, []string{"b-1", "a-1", "a-2", "a-3"}) {
				t.Fatalf("delivered %v, want b-1 a-1 a-2 a-3", got)
			}
		})
	}
}

// The common case stays one Publish call per batch: several aggregates,
// each with several events to one topic. An aggregate that changes topic
// splits the batch into ordered waves, one per change, and only its later
// events wait for the next wave.
func TestPublishCallsPerBatch(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	rec := newRecorder()
	r := newRelay(t, db, rec, outbox.RelayConfig{DisableNotify: true})
	var msgs []outbox.Message
	for _, agg := range []string{"a", "b", "c"} {
		for n := 1; n <= 3; n++ {
			msgs = append(msgs, msg(agg, n))
		}
	}
	enqueue(t, db.Pool, msgs...)
	if n, err := r.RunBatch(context.Background()); n != 9 || err != nil {
		t.Fatalf("RunBatch = %d, %v", n, err)
	}
	if rec.callSizes[0] != 9 || len(rec.callSizes) != 1 {
		t.Fatalf("calls %v, want one call of 9", rec.callSizes)
	}
	// d: t, t, u, t → three waves for d (t t | u | t); e: all t, in the first.
	enqueue(t, db.Pool, msgTo("t", "d", 1), msgTo("t", "d", 2), msgTo("u", "d", 3), msgTo("t", "d", 4),
		msgTo("t", "e", 1), msgTo("t", "e", 2))
	if n, err := r.RunBatch(context.Background()); n != 6 || err != nil {
		t.Fatalf("RunBatch = %d, %v", n, err)
	}
	if got := rec.callSizes[1:]; !slices.Equal(got, []int{4, 1, 1}) {
		t.Fatalf("calls %v, want waves of 4 (d-1 d-2 e-1 e-2), 1 (d-3), 1 (d-4)", got)
	}
	want := []string{"d-1", "d-2", "e-1", "e-2", "d-3", "d-4"}
	if got := rec.deliveredIDs()[9:]; !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v", got, want)
	}
}

// A publisher's error is stored as the event's last_error. It may hold any
// bytes — invalid UTF-8, a NUL, a multi-byte character across the length
// cut — and the mark must still succeed: a mark that PostgreSQL refuses
// rolls the batch back (at-least-once) or leaves its lease (two-phase), so
// the attempt is never counted and the event is retried without backoff,
// forever.
func TestHostileErrorTextIsRecorded(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			rec := newRecorder()
			hostile := "broker said \xff\xfe\x00 no: " + strings.Repeat("ж", 1500)
			rec.fail = func(outbox.Event) error { return errors.New(hostile) }
			r := newRelay(t, db, rec, outbox.RelayConfig{Mode: mode, DisableNotify: true,
				BackoffMin: time.Hour, BackoffMax: time.Hour})
			enqueue(t, db.Pool, msg("a", 1))
			if _, err := r.RunBatch(context.Background()); err == nil || strings.Contains(err.Error(), "mark failed") {
				t.Fatalf("RunBatch: %v; want the publish failure, recorded", err)
			}
			var status, lastErr string
			var attempts int
			if err := db.Pool.QueryRow(context.Background(), "SELECT status, attempts, last_error FROM outbox_event").
				Scan(&status, &attempts, &lastErr); err != nil {
				t.Fatal(err)
			}
			if status != "PENDING" || attempts != 1 || !strings.HasPrefix(lastErr, "broker said") || len(lastErr) > 2000 {
				t.Fatalf("status %s attempts %d last_error %q (%d bytes)", status, attempts, lastErr[:min(len(lastErr), 40)], len(lastErr))
			}
		})
	}
}

// Text fields that PostgreSQL cannot store (a NUL, invalid UTF-8) are a
// clear ErrInvalidMessage naming the field, not a driver error.
func TestEnqueueRejectsUnstorableText(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	base := outbox.Message{Topic: "t", AggregateType: "a", AggregateID: "1", EventType: "E"}
	testCases := []struct {
		field string
		edit  func(m *outbox.Message)
	}{
		{"Topic", func(m *outbox.Message) { m.Topic = "t\x00" }},
		{"AggregateType", func(m *outbox.Message) { m.AggregateType = "\xff" }},
		{"AggregateID", func(m *outbox.Message) { m.AggregateID = "1\x00" }},
		{"EventID", func(m *outbox.Message) { m.EventID = "e\xc3" }},
		{"EventType", func(m *outbox.Message) { m.EventType = "E\x00" }},
		{"Headers", func(m *outbox.Message) { m.Headers = map[string]string{"k": "v\x00"} }},
		{"Headers", func(m *outbox.Message) { m.Headers = map[string]string{"k\xff": "v"} }},
	}
	for _, tt := range testCases {
		m := base
		tt.edit(&m)
		_, err := outbox.Enqueue(ctx, db.Pool, m)
		if !errors.Is(err, outbox.ErrInvalidMessage) || !strings.Contains(err.Error(), tt.field) {
			t.Errorf("%s: err = %v, want ErrInvalidMessage naming %s", tt.field, err, tt.field)
		}
	}
	if st := statuses(t, db); len(st) != 0 {
		t.Fatalf("rows written: %v", st)
	}
}

// Fields over MaxFieldBytes are an ErrInvalidMessage naming the field, not
// PostgreSQL's index-row error aborting the caller's transaction; fields at
// the limit, incompressible, fit the indexes (type and id together in one).
func TestEnqueueBoundsFieldLength(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	long := func(n int) string {
		b := make([]byte, n)
		_, _ = rand.Read(b)
		return base64.RawStdEncoding.EncodeToString(b)[:n]
	}
	atLimit := outbox.Message{Topic: long(outbox.MaxFieldBytes), AggregateType: long(outbox.MaxFieldBytes),
		AggregateID: long(outbox.MaxFieldBytes), EventID: long(outbox.MaxFieldBytes), EventType: long(outbox.MaxFieldBytes)}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
	for _, field := range []string{"Topic", "AggregateType", "AggregateID", "EventID", "EventType"} {
		m := atLimit
		over := long(outbox.MaxFieldBytes + 1)
		switch field {
		case "Topic":
			m.Topic = over
		case "AggregateType":
			m.AggregateType = over
		case "AggregateID":
			m.AggregateID = over
		case "EventID":
			m.EventID = over
		case "EventType":
			m.EventType = over
		}
		if _, err := outbox.EnqueueTx(ctx, tx, m); !errors.Is(err, outbox.ErrInvalidMessage) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s over the limit: err = %v, want ErrInvalidMessage naming it", field, err)
		}
	}
	// The transaction is still usable, and the fields at the limit fit.
	if _, err := outbox.EnqueueTx(ctx, tx, atLimit); err != nil {
		t.Fatalf("fields at the limit: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if st := statuses(t, db); len(st) != 1 {
		t.Fatalf("rows written: %v, want the one at the limit", st)
	}
}

// stubborn is a Publisher that ignores ctx: it returns only when released.
type stubborn struct{ release chan struct{} }

func (p stubborn) Publish(context.Context, []outbox.Event) error { <-p.release; return nil }

// A publisher that ignores its deadline does not hold the batch: the relay
// gives the call up after the deadline and a grace, counts a failed
// attempt for its events (ErrPublishTimeout) and records it, in both modes.
func TestRelayAbandonsPublishPastDeadline(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			pub := stubborn{release: make(chan struct{})}
			defer close(pub.release) // the abandoned call ends before the leak check
			r := newRelay(t, db, pub, outbox.RelayConfig{Mode: mode, DisableNotify: true, BatchTimeout: 2 * time.Second,
				BackoffMin: time.Hour, BackoffMax: time.Hour})
			enqueue(t, db.Pool, msg("a", 1), msg("b", 1))
			n, err := r.RunBatch(context.Background())
			if n != 2 || !errors.Is(err, outbox.ErrPublishTimeout) {
				t.Fatalf("RunBatch = %d, %v; want 2 and ErrPublishTimeout", n, err)
			}
			rows, err := db.Pool.Query(context.Background(), "SELECT status, attempts, last_error FROM outbox_event")
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			for rows.Next() {
				var status, lastErr string
				var attempts int
				if err := rows.Scan(&status, &attempts, &lastErr); err != nil {
					t.Fatal(err)
				}
				if status != "PENDING" || attempts != 1 || !strings.Contains(lastErr, outbox.ErrPublishTimeout.Error()) {
					t.Fatalf("status %s attempts %d last_error %q", status, attempts, lastErr)
				}
			}
		})
	}
}
