package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/failpoint"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/lifecycle"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var forms = []inbox.Form{inbox.FormDoNothing, inbox.FormDoUpdate}

func newInbox(t testing.TB, f inbox.Form) *inbox.Inbox {
	t.Helper()
	ib, err := inbox.New(&inbox.Config{Form: f})
	if err != nil {
		t.Fatal(err)
	}
	return ib
}

// markInTx marks one event in its own transaction and commits or rolls back.
func markInTx(t testing.TB, db *testdb.DB, ib *inbox.Inbox, consumer, event string, commit bool) bool {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	first, err := ib.MarkProcessedTx(ctx, tx, consumer, event)
	if err != nil {
		t.Fatal(err)
	}
	if commit {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return first
}

func TestMarkProcessedTx(t *testing.T) {
	t.Parallel()
	for _, f := range forms {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			ib := newInbox(t, f)
			if !markInTx(t, db, ib, "c1", "e1", false) {
				t.Fatal("first delivery: first = false")
			}
			// The rolled-back mark left nothing behind.
			if !markInTx(t, db, ib, "c1", "e1", true) {
				t.Fatal("delivery after a rollback: first = false, want true")
			}
			if markInTx(t, db, ib, "c1", "e1", true) {
				t.Fatal("repeat: first = true")
			}
			// Consumers are independent.
			if !markInTx(t, db, ib, "c2", "e1", true) {
				t.Fatal("other consumer: first = false")
			}
			var n int
			if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM processed_event`).Scan(&n); err != nil || n != 2 {
				t.Fatalf("rows = %d (%v), want 2", n, err)
			}
		})
	}
}

func TestMarkProcessedTxDefaultAndBadInput(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	testCases := []struct {
		name, consumer, event string
		want                  error
	}{
		{"empty consumer", "", "e", inbox.ErrEmptyConsumerID},
		{"empty event", "c", "", inbox.ErrEmptyEventID},
		// PostgreSQL would refuse these on every attempt (22021, 54000).
		{"binary event id", "c", "\xde\xad\xbe\xef", inbox.ErrInvalidEventID},
		{"NUL in event id", "c", "a\x00b", inbox.ErrInvalidEventID},
		{"event id over the bound", "c", strings.Repeat("x", inbox.MaxEventIDBytes+1), inbox.ErrInvalidEventID},
		{"event id at the bound", "c", strings.Repeat("x", inbox.MaxEventIDBytes), nil},
	}
	for _, tt := range testCases {
		if _, err := inTx(t, db, func(tx pgx.Tx) (bool, error) { return inbox.MarkProcessedTx(ctx, tx, tt.consumer, tt.event) }); !errors.Is(err, tt.want) {
			t.Errorf("%s: err = %v, want %v", tt.name, err, tt.want)
		}
	}
	ib := newInbox(t, inbox.FormDoUpdate)
	if _, err := inTx(t, db, func(tx pgx.Tx) (bool, error) {
		_, err := ib.MarkProcessedBatchTx(ctx, tx, "c", []string{"a", ""})
		return false, err
	}); !errors.Is(err, inbox.ErrEmptyEventID) {
		t.Errorf("batch with empty id: err = %v", err)
	}
	if _, err := inTx(t, db, func(tx pgx.Tx) (bool, error) {
		_, err := ib.MarkProcessedBatchTx(ctx, tx, "c", []string{"a", strings.Repeat("y", 3000)})
		return false, err
	}); !errors.Is(err, inbox.ErrInvalidEventID) {
		t.Errorf("batch with a 3 KB id: err = %v", err)
	}
	if _, err := inbox.Seen(ctx, db.Pool, "c", "\xff"); !errors.Is(err, inbox.ErrInvalidEventID) {
		t.Errorf("Seen of a binary id: err = %v", err)
	}
	if _, err := inbox.New(&inbox.Config{Form: "sideways"}); !errors.Is(err, inbox.ErrInvalidConfig) {
		t.Errorf("bad form: err = %v", err)
	}
	ib, err := inbox.New(nil)
	if err != nil || ib.Form() != inbox.FormDefault {
		t.Fatalf("New(nil) = %v, %v", ib, err)
	}
	mark := func(tx pgx.Tx) (bool, error) { return inbox.MarkProcessedTx(ctx, tx, "c", "e") }
	first, err := inTx(t, db, mark)
	if err != nil || !first {
		t.Fatalf("package MarkProcessedTx = %v, %v", first, err)
	}
	if first, _ = inTx(t, db, mark); first {
		t.Fatal("package MarkProcessedTx repeat: first = true")
	}
}

// inTx runs fn in a transaction that commits unless fn fails.
func inTx(t testing.TB, db *testdb.DB, fn func(tx pgx.Tx) (bool, error)) (bool, error) {
	t.Helper()
	var res bool
	err := pgx.BeginFunc(context.Background(), db.Pool, func(tx pgx.Tx) error {
		var err error
		res, err = fn(tx)
		return err
	})
	return res, err
}

func TestMarkProcessedBatchTx(t *testing.T) {
	t.Parallel()
	for _, f := range forms {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			ib := newInbox(t, f)
			ctx := context.Background()
			if !markInTx(t, db, ib, "c", "old", true) {
				t.Fatal("setup")
			}
			ids := []string{"a", "old", "b", "a", "c", "b"}
			var first, again []bool
			batch := func(out *[]bool) func(pgx.Tx) (bool, error) {
				return func(tx pgx.Tx) (bool, error) {
					var err error
					*out, err = ib.MarkProcessedBatchTx(ctx, tx, "c", ids)
					return false, err
				}
			}
			if _, err := inTx(t, db, batch(&first)); err != nil {
				t.Fatal(err)
			}
			want := []bool{true, false, true, false, true, false}
			if fmt.Sprint(first) != fmt.Sprint(want) {
				t.Fatalf("first = %v, want %v", first, want)
			}
			if _, err := inTx(t, db, batch(&again)); err != nil || fmt.Sprint(again) != fmt.Sprint(make([]bool, len(ids))) {
				t.Fatalf("second batch = %v, %v; want all false", again, err)
			}
		})
	}
}

// TestFormsAgreeUnderRace: 20 goroutines, each in its own transactions,
// race on the same event ids (one form, or both mixed), and every fourth
// worker rolls back the transactions in which it saw first == true. Whatever the interleaving, exactly one committed mark per event
// saw first == true, and every rolled-back "first" was taken over by a
// later transaction.
func TestFormsAgreeUnderRace(t *testing.T) {
	t.Parallel()
	const workers, events = 20, 40
	testCases := []struct {
		name  string
		forms func(w int) inbox.Form
	}{
		{"do-nothing", func(int) inbox.Form { return inbox.FormDoNothing }},
		{"do-update", func(int) inbox.Form { return inbox.FormDoUpdate }},
		{"mixed", func(w int) inbox.Form { return forms[w%2] }},
	}
	for _, tt := range testCases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, testdb.MaxConns(workers))
			ctx := context.Background()
			var (
				mu        sync.Mutex
				committed = map[string]int{} // committed first == true per event
				start     = make(chan struct{})
				wg        sync.WaitGroup
				errs      = make(chan error, workers)
			)
			for w := range workers {
				ib := newInbox(t, tt.forms(w))
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					for i := range events {
						// Offset the order per worker so that they collide in
						// different places.
						id := fmt.Sprintf("e%d", (i+w)%events)
						err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
							first, err := ib.MarkProcessedTx(ctx, tx, "race", id)
							if err != nil {
								return err
							}
							if first && w%4 == 0 {
								return errRollback
							}
							if first {
								mu.Lock()
								committed[id]++
								mu.Unlock()
							}
							return nil
						})
						if err != nil && !errors.Is(err, errRollback) {
							errs <- err
							return
						}
					}
				}()
			}
			close(start)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			for i := range events {
				id := fmt.Sprintf("e%d", i)
				if committed[id] != 1 {
					t.Errorf("%s: %d committed first marks, want 1", id, committed[id])
				}
			}
			var n int
			if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM processed_event`).Scan(&n); err != nil || n != events {
				t.Fatalf("rows = %d (%v), want %d", n, err, events)
			}
		})
	}
}

var errRollback = errors.New("roll back on purpose")

func TestPurge(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO processed_event (consumer_id, event_id, processed_at)
		SELECT 'c', 'old' || g, now() - interval '10 days' FROM generate_series(1, 25) g
		UNION ALL
		SELECT 'c', 'new' || g, now() FROM generate_series(1, 5) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := inbox.Purge(ctx, db.Pool, time.Now(), 0); !errors.Is(err, inbox.ErrBadBatch) {
		t.Fatalf("batch 0: err = %v", err)
	}
	n, err := inbox.Purge(ctx, db.Pool, time.Now().Add(-24*time.Hour), 4)
	if err != nil || n != 25 {
		t.Fatalf("purged %d (%v), want 25", n, err)
	}
	var left int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM processed_event WHERE event_id LIKE 'new%'`).Scan(&left); err != nil || left != 5 {
		t.Fatalf("recent rows left = %d (%v), want 5", left, err)
	}
}

func TestPurgerStartStop(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	if _, err := inbox.NewPurger(db.Pool, &inbox.PurgerConfig{PurgeBatchSize: -1}); !errors.Is(err, inbox.ErrInvalidConfig) || !contains(err, "PurgeBatchSize") {
		t.Fatalf("bad config: %v", err)
	}
	if _, err := inbox.NewPurger(nil, nil); !errors.Is(err, inbox.ErrInvalidConfig) {
		t.Fatalf("nil db: %v", err)
	}
	p, err := inbox.NewPurger(db.Pool, &inbox.PurgerConfig{Retention: time.Hour, PurgeInterval: time.Hour, PurgeBatchSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(ctx); err != nil {
		t.Fatalf("Stop before Start: %v", err)
	}
	if err := p.HardStop(ctx); err != nil {
		t.Fatalf("HardStop before Start: %v", err)
	}
	insertOld := func(prefix string) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, `
			INSERT INTO processed_event (consumer_id, event_id, processed_at)
			SELECT 'c', $1 || g, now() - interval '2 hours' FROM generate_series(1, 7) g`, prefix); err != nil {
			t.Fatal(err)
		}
	}
	insertOld("old")
	passes := make(chan inbox.PurgeEvent, 10)
	begun := make(chan struct{}, 10)
	type spanKey struct{}
	p, _ = inbox.NewPurger(db.Pool, &inbox.PurgerConfig{
		Retention: time.Hour, PurgeInterval: time.Hour, PurgeBatchSize: 2,
		Hook: func(ctx context.Context, e inbox.PurgeEvent) context.Context {
			switch e.Kind {
			case inbox.PurgeBegin:
				begun <- struct{}{}
				return context.WithValue(ctx, spanKey{}, "span")
			case inbox.PurgeDone, inbox.PurgeFailed:
				if ctx.Value(spanKey{}) != "span" {
					t.Errorf("%s: the ctx of PurgeBegin's hook did not reach the pass", e.Kind)
				}
				passes <- e
			}
			return ctx
		},
	})
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatalf("second Start: %v", err)
	}
	if e := <-passes; e.Kind != inbox.PurgeDone || e.Deleted != 7 || e.Err != nil {
		t.Fatalf("first pass = %+v, want done, 7 deleted", e)
	}
	for range 2 {
		if err := p.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Start after Stop is a fresh run: it purges again at once.
	insertOld("again")
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if e := <-passes; e.Deleted != 7 {
		t.Fatalf("pass of the second run deleted %d, want 7", e.Deleted)
	}
	if err := p.HardStop(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(begun); n != 2 {
		t.Fatalf("%d passes began, want 2", n)
	}
}

// TestPurgerFailedPass: a pass that fails (the table is gone) is reported
// through the hook as PurgeFailed with the error, and the purger goes on.
func TestPurgerFailedPass(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `DROP TABLE processed_event`); err != nil {
		t.Fatal(err)
	}
	events := make(chan inbox.PurgeEvent, 10)
	p, err := inbox.NewPurger(db.Pool, &inbox.PurgerConfig{
		PurgeInterval: time.Millisecond, Logger: quiet,
		Hook: func(ctx context.Context, e inbox.PurgeEvent) context.Context {
			if e.Kind != inbox.PurgeBegin {
				select {
				case events <- e:
				default:
				}
			}
			return ctx
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop(ctx)
	for range 2 { // the second failure shows the loop went on
		if e := <-events; e.Kind != inbox.PurgeFailed || e.Err == nil || !strings.Contains(e.Err.Error(), "processed_event") {
			t.Fatalf("event %+v, want purge-failed naming processed_event", e)
		}
	}
}

// TestPurgeMidBatchFailpoint runs this test binary again with the
// purge-mid-batch failpoint armed to fail: Purge stops right after its
// first batch committed, with that batch's rows deleted and no others.
func TestPurgeMidBatchFailpoint(t *testing.T) {
	t.Parallel()
	if os.Getenv("INBOX_PURGE_CHILD") != "" {
		return // run by the parent below; see purgeChild
	}
	db := testdb.New(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO processed_event (consumer_id, event_id, processed_at)
		SELECT 'c', 'old' || g, now() - interval '10 days' FROM generate_series(1, 10) g`); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestPurgeMidBatchChild$", "-test.v")
	cmd.Env = append(os.Environ(), "INBOX_PURGE_CHILD="+db.URL, failpoint.EnvVar+"="+failpoint.PurgeMidBatch+"=error")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "idem-failpoint: hit "+failpoint.PurgeMidBatch+" error") || !strings.Contains(string(out), "purged=3 injected=true") {
		t.Fatalf("child output:\n%s", out)
	}
	var left int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM processed_event`).Scan(&left); err != nil || left != 7 {
		t.Fatalf("rows left = %d (%v), want 7: one batch of 3 deleted and committed", left, err)
	}
}

// TestPurgeMidBatchChild is the child of TestPurgeMidBatchFailpoint.
func TestPurgeMidBatchChild(t *testing.T) {
	url := os.Getenv("INBOX_PURGE_CHILD")
	if url == "" {
		return // only as TestPurgeMidBatchFailpoint's child
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	n, err := inbox.Purge(ctx, pool, time.Now(), 3)
	fmt.Printf("purged=%d injected=%v\n", n, errors.Is(err, failpoint.ErrInjected))
}

func TestSeen(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	if ok, err := inbox.Seen(ctx, db.Pool, "c", "e1"); err != nil || ok {
		t.Fatalf("Seen before any mark = %v, %v", ok, err)
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := inbox.MarkProcessedTx(ctx, tx, "c", "e1"); err != nil {
		t.Fatal(err)
	}
	// Inside the marking transaction the row is visible; outside it is not
	// until the commit.
	if ok, err := inbox.SeenTx(ctx, tx, "c", "e1"); err != nil || !ok {
		t.Fatalf("SeenTx in the marking tx = %v, %v", ok, err)
	}
	if ok, err := inbox.Seen(ctx, db.Pool, "c", "e1"); err != nil || ok {
		t.Fatalf("Seen of an uncommitted mark = %v, %v", ok, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := inbox.Seen(ctx, db.Pool, "c", "e1"); err != nil || !ok {
		t.Fatalf("Seen after commit = %v, %v", ok, err)
	}
	if ok, _ := inbox.Seen(ctx, db.Pool, "other", "e1"); ok {
		t.Fatal("Seen for another consumer = true")
	}
	for _, tt := range []struct {
		consumer, event string
		want            error
	}{{"", "e", inbox.ErrEmptyConsumerID}, {"c", "", inbox.ErrEmptyEventID}} {
		if _, err := inbox.Seen(ctx, db.Pool, tt.consumer, tt.event); !errors.Is(err, tt.want) {
			t.Errorf("Seen(%q, %q) err = %v, want %v", tt.consumer, tt.event, err, tt.want)
		}
	}
}

var quiet = slog.New(slog.DiscardHandler)

func contains(err error, s string) bool { return err != nil && strings.Contains(err.Error(), s) }

// The purger is a lifecycle component as it is: no adapter.
var (
	_ lifecycle.Component   = (*inbox.Purger)(nil)
	_ lifecycle.HardStopper = (*inbox.Purger)(nil)
)
