package inbox_test

import (
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/testdb"
)

// The database/sql twins on both drivers and both forms: first and repeat,
// a rollback leaves no mark, the batch's in-batch repeat, Seen, and a nil
// or ended transaction is a named error that writes nothing.
func TestMarkProcessedSQLTx(t *testing.T) {
	t.Parallel()
	for _, driver := range testdb.SQLDrivers {
		for _, f := range forms {
			t.Run(fmt.Sprintf("%s/%s", driver, f), func(t *testing.T) {
				t.Parallel()
				db := testdb.New(t, testdb.MaxConns(2))
				sdb := db.SQL(t, driver, 4)
				ib := newInbox(t, f)
				ctx := t.Context()
				mark := func(event string, commit bool) bool {
					t.Helper()
					tx, err := sdb.BeginTx(ctx, nil)
					if err != nil {
						t.Fatal(err)
					}
					defer tx.Rollback() //nolint:errcheck
					first, err := ib.MarkProcessedSQLTx(ctx, tx, "c", event)
					if err != nil {
						t.Fatal(err)
					}
					if seen, err := inbox.SeenSQLTx(ctx, tx, "c", event); err != nil || !seen {
						t.Fatalf("SeenSQLTx in the marking tx: %v, %v", seen, err)
					}
					if commit {
						if err := tx.Commit(); err != nil {
							t.Fatal(err)
						}
					}
					return first
				}
				if !mark("e1", false) {
					t.Fatal("first mark not first")
				}
				if seen, err := inbox.SeenSQL(ctx, sdb, "c", "e1"); err != nil || seen {
					t.Fatalf("rolled-back mark seen: %v, %v", seen, err)
				}
				if !mark("e1", true) {
					t.Fatal("mark after a rollback not first")
				}
				if mark("e1", true) {
					t.Fatal("repeat mark first")
				}
				if seen, err := inbox.SeenSQL(ctx, sdb, "c", "e1"); err != nil || !seen {
					t.Fatalf("committed mark not seen: %v, %v", seen, err)
				}

				tx, err := sdb.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				first, err := ib.MarkProcessedBatchSQLTx(ctx, tx, "c", []string{"e2", "e1", `e"3\`, "e2"})
				if err != nil {
					t.Fatal(err)
				}
				if want := []bool{true, false, true, false}; !slices.Equal(first, want) {
					t.Fatalf("batch first = %v, want %v", first, want)
				}
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
				if seen, err := inbox.SeenSQL(ctx, sdb, "c", `e"3\`); err != nil || !seen {
					t.Fatalf("batch id with quote and backslash not stored as given: %v, %v", seen, err)
				}

				if _, err := ib.MarkProcessedSQLTx(ctx, tx, "c", "e9"); !errors.Is(err, sql.ErrTxDone) {
					t.Fatalf("mark on a committed tx: %v, want sql.ErrTxDone", err)
				}
				if _, err := ib.MarkProcessedSQLTx(ctx, nil, "c", "e9"); !errors.Is(err, inbox.ErrNilTx) {
					t.Fatalf("mark on nil: %v, want ErrNilTx", err)
				}
				if _, err := inbox.MarkProcessedSQLTx(ctx, nil, "c", "e9"); !errors.Is(err, inbox.ErrNilTx) {
					t.Fatalf("package mark on nil: %v, want ErrNilTx", err)
				}
				if _, err := ib.MarkProcessedTx(ctx, nil, "c", "e9"); !errors.Is(err, inbox.ErrNilTx) {
					t.Fatalf("pgx mark on nil: %v, want ErrNilTx", err)
				}
				if seen, _ := inbox.SeenSQL(ctx, sdb, "c", "e9"); seen {
					t.Fatal("a mark on an ended or nil tx was written")
				}
			})
		}
	}
}

// Racing database/sql transactions marking one event: exactly one first.
func TestMarkProcessedSQLTxRace(t *testing.T) {
	t.Parallel()
	for _, driver := range testdb.SQLDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, testdb.MaxConns(2))
			sdb := db.SQL(t, driver, 10)
			ctx := t.Context()
			var (
				wg     sync.WaitGroup
				mu     sync.Mutex
				firsts int
				errs   []error
			)
			for range 20 {
				wg.Go(func() {
					tx, err := sdb.BeginTx(ctx, nil)
					if err == nil {
						var first bool
						if first, err = inbox.MarkProcessedSQLTx(ctx, tx, "c", "e"); err == nil {
							err = tx.Commit()
						}
						_ = tx.Rollback()
						mu.Lock()
						if err == nil && first {
							firsts++
						}
						mu.Unlock()
					}
					if err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			if len(errs) > 0 || firsts != 1 {
				t.Fatalf("%d firsts, errors %v; want exactly one first", firsts, errs)
			}
		})
	}
}
