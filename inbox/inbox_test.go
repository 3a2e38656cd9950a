package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/testdb"
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
	}
	for _, tt := range testCases {
		if _, err := inbox.MarkProcessedTx(ctx, db.Pool, tt.consumer, tt.event); !errors.Is(err, tt.want) {
			t.Errorf("%s: err = %v, want %v", tt.name, err, tt.want)
		}
	}
	ib := newInbox(t, inbox.FormDoUpdate)
	if _, err := ib.MarkProcessedBatchTx(ctx, db.Pool, "c", []string{"a", ""}); !errors.Is(err, inbox.ErrEmptyEventID) {
		t.Errorf("batch with empty id: err = %v", err)
	}
	if _, err := inbox.New(&inbox.Config{Form: "sideways"}); !errors.Is(err, inbox.ErrInvalidConfig) {
		t.Errorf("bad form: err = %v", err)
	}
	ib, err := inbox.New(nil)
	if err != nil || ib.Form() != inbox.FormDefault {
		t.Fatalf("New(nil) = %v, %v", ib, err)
	}
	first, err := inbox.MarkProcessedTx(ctx, db.Pool, "c", "e")
	if err != nil || !first {
		t.Fatalf("package MarkProcessedTx = %v, %v", first, err)
	}
	if first, _ = inbox.MarkProcessedTx(ctx, db.Pool, "c", "e"); first {
		t.Fatal("package MarkProcessedTx repeat: first = true")
	}
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
			first, err := ib.MarkProcessedBatchTx(ctx, db.Pool, "c", ids)
			if err != nil {
				t.Fatal(err)
			}
			want := []bool{true, false, true, false, true, false}
			if fmt.Sprint(first) != fmt.Sprint(want) {
				t.Fatalf("first = %v, want %v", first, want)
			}
			again, err := ib.MarkProcessedBatchTx(ctx, db.Pool, "c", ids)
			if err != nil || fmt.Sprint(again) != fmt.Sprint(make([]bool, len(ids))) {
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
	if _, err := inbox.NewPurger(db.Pool, &inbox.PurgerConfig{BatchSize: -1}); !errors.Is(err, inbox.ErrInvalidConfig) || !contains(err, "BatchSize") {
		t.Fatalf("bad config: %v", err)
	}
	p, err := inbox.NewPurger(db.Pool, &inbox.PurgerConfig{Retention: time.Hour, Interval: time.Hour, BatchSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(ctx); err != nil {
		t.Fatalf("Stop before Start: %v", err)
	}
	p, _ = inbox.NewPurger(db.Pool, &inbox.PurgerConfig{Retention: time.Hour, Interval: time.Hour, BatchSize: 2})
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO processed_event (consumer_id, event_id, processed_at)
		SELECT 'c', 'old' || g, now() - interval '2 hours' FROM generate_series(1, 7) g`); err != nil {
		t.Fatal(err)
	}
	passes := make(chan int64)
	p.SetPassHook(passes)
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatalf("second Start: %v", err)
	}
	if n := <-passes; n != 7 {
		t.Fatalf("first pass purged %d, want 7", n)
	}
	for range 2 {
		if err := p.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func contains(err error, s string) bool { return err != nil && strings.Contains(err.Error(), s) }
