package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/migrate"
	"github.com/idemkit/idem/outbox"
)

// failAll is a publisher that fails every event.
type failAll struct{}

func (failAll) Publish(context.Context, []outbox.Event) error { return errors.New("down on purpose") }

// seedBlocked writes perAgg events on each of aggs aggregates
// ("blk-0"…) and has a relay fail every head once: half of them with one
// attempt allowed (DEAD), half with a day's backoff. Rows are written
// directly, numbered as EnqueueTx numbers them, with their counter rows.
func seedBlocked(t *testing.T, db *testdb.DB, aggs, perAgg int) {
	t.Helper()
	ctx := context.Background()
	for _, q := range []string{
		`INSERT INTO outbox_event (topic, aggregate_type, aggregate_id, aggregate_seq, event_id, event_type, payload)
		 SELECT 't', 'order', 'blk-' || (g % ` + strconv.Itoa(aggs) + `), g / ` + strconv.Itoa(aggs) + ` + 1,
		        'blk-ev-' || g, 'E', '\x00'::bytea
		 FROM generate_series(0, ` + strconv.Itoa(aggs*perAgg-1) + `) g`,
		`INSERT INTO outbox_aggregate (aggregate_type, aggregate_id, last_seq)
		 SELECT aggregate_type, aggregate_id, max(aggregate_seq) FROM outbox_event GROUP BY 1, 2`,
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	// Heads only: a batch of exactly as many events as there are heads
	// claims no run behind them.
	dead := aggs / 2
	for _, cfg := range []outbox.RelayConfig{
		{MaxAttempts: 1, BatchSize: dead},
		{MaxAttempts: 100, BatchSize: aggs - dead, BackoffMin: 24 * time.Hour, BackoffMax: 48 * time.Hour},
	} {
		cfg.DisableNotify = true
		r := newRelay(t, db, failAll{}, cfg)
		n, err := r.RunBatch(ctx)
		if n != cfg.BatchSize || err == nil {
			t.Fatalf("failing the heads: %d claimed, %v", n, err)
		}
	}
	// Full jitter may draw a short backoff: none may come due in the test.
	if _, err := db.Pool.Exec(ctx, `UPDATE outbox_event SET available_at = now() + interval '1 day'
		WHERE status = 'PENDING' AND attempts > 0`); err != nil {
		t.Fatal(err)
	}
	var deadN, failing int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'DEAD'),
		count(*) FILTER (WHERE status = 'PENDING' AND attempts > 0) FROM outbox_event`).Scan(&deadN, &failing); err != nil {
		t.Fatal(err)
	}
	if deadN != dead || failing != aggs-dead {
		t.Fatalf("%d DEAD heads and %d failing, want %d and %d", deadN, failing, dead, aggs-dead)
	}
}

// planNode is the part of EXPLAIN (FORMAT JSON) the test reads.
type planNode struct {
	NodeType         string     `json:"Node Type"`
	IndexName        string     `json:"Index Name"`
	RelationName     string     `json:"Relation Name"`
	ActualRows       float64    `json:"Actual Rows"`
	ActualLoops      float64    `json:"Actual Loops"`
	RowsRemoved      float64    `json:"Rows Removed by Filter"`
	SharedHitBlocks  int64      `json:"Shared Hit Blocks"`
	SharedReadBlocks int64      `json:"Shared Read Blocks"`
	Plans            []planNode `json:"Plans"`
}

// examined is how many outbox_event rows the plan's scans produced or
// filtered out, over all loops.
func (n planNode) examined() float64 {
	var sum float64
	if n.RelationName == "outbox_event" {
		sum += (n.ActualRows + n.RowsRemoved) * max(n.ActualLoops, 1)
	}
	for _, c := range n.Plans {
		sum += c.examined()
	}
	return sum
}

// explainClaim runs the at-least-once claim (cursor at the start) under
// EXPLAIN (ANALYZE, BUFFERS) in a transaction it rolls back, and returns
// the plan.
func explainClaim(t *testing.T, db *testdb.DB, batch int) planNode {
	t.Helper()
	ctx := context.Background()
	var raw []byte
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+outbox.ClaimLockedSQL, "", "", 2*batch, batch).Scan(&raw); err != nil {
			return err
		}
		return errors.New("rollback")
	})
	if err == nil || err.Error() != "rollback" {
		t.Fatal(err)
	}
	var out []struct {
		Plan planNode `json:"Plan"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || len(out) != 1 {
		t.Fatalf("plan: %v\n%s", err, raw)
	}
	return out[0].Plan
}

// The claim's cost does not grow with the events that cannot be
// published: with 100,000 events blocked behind DEAD heads and heads in
// backoff on 1,000 aggregates, a claim of 100 ready events examines a
// number of rows and buffers bounded by the batch and the number of
// failing heads, not by the blocked events. The figures come from
// EXPLAIN (ANALYZE, BUFFERS): rows examined by every scan of outbox_event
// and the buffers touched, not a timing. Before the held partial index,
// the same claim examined every blocked event (over 100,000 rows).
func TestClaimCostBoundedByBlockedBacklog(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	const aggs, perAgg, ready = 1000, 100, 100
	seedBlocked(t, db, aggs, perAgg)
	var msgs []outbox.Message
	for i := range ready {
		msgs = append(msgs, msg("ready-"+strconv.Itoa(i), 1))
	}
	enqueue(t, db.Pool, msgs...)
	if _, err := db.Pool.Exec(ctx, "VACUUM ANALYZE outbox_event"); err != nil {
		t.Fatal(err)
	}
	var held int
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM outbox_event WHERE held").Scan(&held); err != nil {
		t.Fatal(err)
	}
	// Every event behind a failed head, and the DEAD heads themselves.
	if want := aggs*(perAgg-1) + aggs/2; held != want {
		t.Fatalf("%d events held, want %d", held, want)
	}
	plan := explainClaim(t, db, ready)
	if plan.ActualRows != ready {
		t.Fatalf("claimed %v rows, want %d", plan.ActualRows, ready)
	}
	// Rows: the failing heads in backoff (aggs/2, still in the index: they
	// come due), met by the window and again by the walk over the
	// aggregates, and the ready events with their checks and run
	// extension, a few times over; far below the 100,000 blocked.
	examined, buffers := plan.examined(), plan.SharedHitBlocks+plan.SharedReadBlocks
	t.Logf("claim of %d with %d blocked: %.0f rows examined, %d buffers", ready, aggs*perAgg, examined, buffers)
	if bound := float64(aggs + 10*ready); examined > bound {
		t.Errorf("claim examined %.0f rows, want at most %.0f (blocked backlog %d)", examined, bound, aggs*perAgg)
	}
	// Buffers: an index descent (a few pages) per aggregate the skip scan
	// passes (the failing heads' and the ready ones), and the ready
	// events' locks, checks and runs. That holds once VACUUM could remove
	// the row versions the seeding's updates left behind: while another
	// session of the shared server (a concurrent test package) holds an
	// older snapshot, their index entries stay, and every scan visits
	// them without returning them. The rows bound above holds either way
	// and is what fails without the held index (over 100,000 rows).
	var dead int64
	if err := db.Pool.QueryRow(ctx, "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'outbox_event'::regclass").Scan(&dead); err != nil {
		t.Fatal(err)
	}
	// The plan varies with the statistics ANALYZE samples (make test once
	// saw 1,300 rows and 5,455 buffers, a quiet server 1,601 and 4,911),
	// and each dead version left may cost a buffer more: the bound is
	// twice the estimate, still far from what a scan of the backlog costs
	// (each of its 100,000 rows visited is a buffer access).
	bound := 2*int64(5*(aggs/2+ready)+20*ready) + dead
	switch {
	case dead > aggs:
		// A few hundred remain on a quiet server (the last updates'
		// versions, still visible to the vacuum's own horizon); tens of
		// thousands mean another snapshot held them all.
		t.Logf("buffer bound %d not checked: VACUUM left %d dead row versions (an older snapshot elsewhere on the server)", bound, dead)
	case buffers > bound:
		t.Errorf("claim touched %d buffers, want at most %d (blocked backlog %d)", buffers, bound, aggs*perAgg)
	}
}

// held follows the blocked aggregate through its life, in both modes:
// a failure holds the later events (and those enqueued after it); a DEAD
// event is held too; Requeue releases them; a retry that succeeds
// releases them; the sweep releases an aggregate whose failed event was
// removed by other means. Order and delivery stay as before.
func TestHeldEventsFollowBlockedAggregate(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			ctx := context.Background()
			rec := newRecorder()
			var mu sync.Mutex
			failing := map[string]bool{"p-1": true, "q-1": true, "s-1": true}
			rec.fail = func(e outbox.Event) error {
				mu.Lock()
				defer mu.Unlock()
				if failing[e.EventID] {
					return fmt.Errorf("fail %s", e.EventID)
				}
				return nil
			}
			heldOf := func(ids ...string) []bool {
				t.Helper()
				out := make([]bool, len(ids))
				for i, id := range ids {
					if err := db.Pool.QueryRow(ctx, "SELECT held FROM outbox_event WHERE event_id = $1", id).Scan(&out[i]); err != nil {
						t.Fatalf("%s: %v", id, err)
					}
				}
				return out
			}
			blocked := func(agg string) bool {
				t.Helper()
				var b bool
				if err := db.Pool.QueryRow(ctx, "SELECT blocked FROM outbox_aggregate WHERE aggregate_id = $1", agg).Scan(&b); err != nil {
					t.Fatal(err)
				}
				return b
			}
			// p: DEAD at once (MaxAttempts 1), then requeued.
			r := newRelay(t, db, rec, outbox.RelayConfig{Mode: mode, DisableNotify: true, MaxAttempts: 1})
			enqueue(t, db.Pool, msg("p", 1), msg("p", 2), msg("q", 1), msg("q", 2), msg("s", 1), msg("s", 2))
			drain(t, r)
			if got := heldOf("p-1", "p-2", "q-1", "q-2", "s-1", "s-2"); !slices.Equal(got, []bool{true, true, true, true, true, true}) {
				t.Fatalf("held after the DEAD heads: %v", got)
			}
			enqueue(t, db.Pool, msg("p", 3))
			if !heldOf("p-3")[0] || !blocked("p") {
				t.Fatal("an event enqueued behind a DEAD event is not held")
			}
			mu.Lock()
			failing["p-1"], failing["q-1"] = false, false
			mu.Unlock()
			if n, err := outbox.Requeue(ctx, db.Pool, "p-1"); err != nil || n != 1 {
				t.Fatalf("requeue: %d, %v", n, err)
			}
			if got := heldOf("p-1", "p-2", "p-3"); slices.Contains(got, true) || blocked("p") {
				t.Fatalf("held after requeue: %v, blocked %v", got, blocked("p"))
			}
			drain(t, r)

			// q: its DEAD head removed by hand (an operator's discard);
			// the sweep releases the rest.
			if _, err := db.Pool.Exec(ctx, "UPDATE outbox_event SET status = 'PUBLISHED', published_at = now() WHERE event_id = 'q-1'"); err != nil {
				t.Fatal(err)
			}
			if _, err := r.Reap(ctx); err != nil {
				t.Fatal(err)
			}
			if heldOf("q-2")[0] || blocked("q") {
				t.Fatal("the sweep did not release q")
			}
			drain(t, r)

			// s: a failure with backoff, then a retry that succeeds.
			r2 := newRelay(t, db, rec, outbox.RelayConfig{Mode: mode, DisableNotify: true, MaxAttempts: 10,
				BackoffMin: time.Millisecond, BackoffMax: time.Millisecond})
			if _, err := db.Pool.Exec(ctx, "UPDATE outbox_event SET status = 'PENDING', attempts = 1, held = false WHERE event_id = 's-1'"); err != nil {
				t.Fatal(err)
			}
			enqueue(t, db.Pool, msg("s", 3))
			if !heldOf("s-3")[0] {
				t.Fatal("s-3 enqueued into a blocked aggregate is not held")
			}
			mu.Lock()
			failing["s-1"] = false
			mu.Unlock()
			eventually(t, "s published", func() bool {
				_, _ = r2.RunBatch(ctx)
				st := statuses(t, db)
				return st["s-1"] == "PUBLISHED" && st["s-2"] == "PUBLISHED" && st["s-3"] == "PUBLISHED"
			})
			if blocked("s") {
				t.Fatal("s still blocked after its failed event was delivered")
			}
			byAgg := map[string][]string{}
			for _, e := range rec.snapshot() {
				byAgg[e.AggregateID] = append(byAgg[e.AggregateID], e.EventID)
			}
			for agg, want := range map[string][]string{"p": {"p-1", "p-2", "p-3"}, "q": {"q-2"}, "s": {"s-1", "s-2", "s-3"}} {
				if !slices.Equal(byAgg[agg], want) {
					t.Errorf("%s delivered %v, want %v", agg, byAgg[agg], want)
				}
			}
		})
	}
}

// Migration 004 on a table with history: reverted to version 3, rows in
// every state are written, and the up migration blocks the aggregates
// with a failed event and holds what is behind it (and DEAD events);
// down restores version 3's index and columns.
func TestMigrationHeldBackfillAndDown(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, testdb.Empty())
	ctx := context.Background()
	if _, err := migrate.Up(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	for v, err := migrate.Down(ctx, db.Pool); v != 4; v, err = migrate.Down(ctx, db.Pool) {
		if err != nil {
			t.Fatal(err)
		}
	}
	exists := func(name string) bool {
		var ok bool
		if err := db.Pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", name).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !exists("outbox_event_unpublished_idx") || exists("outbox_event_claim_idx") {
		t.Fatal("down did not restore version 3's index")
	}
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO outbox_aggregate (aggregate_type, aggregate_id, last_seq) VALUES ('o', 'd', 3), ('o', 'f', 2), ('o', 'ok', 2);
		INSERT INTO outbox_event (topic, aggregate_type, aggregate_id, aggregate_seq, event_id, event_type, payload, status, attempts, published_at) VALUES
		  ('t', 'o', 'd', 1, 'd-1', 'E', '', 'PUBLISHED', 1, now()),
		  ('t', 'o', 'd', 2, 'd-2', 'E', '', 'DEAD', 10, NULL),
		  ('t', 'o', 'd', 3, 'd-3', 'E', '', 'PENDING', 0, NULL),
		  ('t', 'o', 'f', 1, 'f-1', 'E', '', 'PENDING', 2, NULL),
		  ('t', 'o', 'f', 2, 'f-2', 'E', '', 'PENDING', 0, NULL),
		  ('t', 'o', 'ok', 1, 'ok-1', 'E', '', 'PUBLISHED', 1, now()),
		  ('t', 'o', 'ok', 2, 'ok-2', 'E', '', 'PENDING', 0, NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := migrate.Up(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	if exists("outbox_event_unpublished_idx") || !exists("outbox_event_claim_idx") {
		t.Fatal("up did not replace the unpublished index by the claim index")
	}
	held := map[string]bool{}
	rows, err := db.Pool.Query(ctx, "SELECT event_id, held FROM outbox_event")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var h bool
		if err := rows.Scan(&id, &h); err != nil {
			t.Fatal(err)
		}
		held[id] = h
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"d-1": false, "d-2": true, "d-3": true, "f-1": false, "f-2": true, "ok-1": false, "ok-2": false}
	if !maps.Equal(held, want) {
		t.Errorf("held %v, want %v", held, want)
	}
	var blocked []string
	if err := db.Pool.QueryRow(ctx, "SELECT array_agg(aggregate_id ORDER BY aggregate_id) FROM outbox_aggregate WHERE blocked").Scan(&blocked); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(blocked, []string{"d", "f"}) {
		t.Errorf("blocked %v, want [d f]", blocked)
	}
	// Down to version 3: the later versions first, then 004.
	for v, err := migrate.Down(ctx, db.Pool); v != 4; v, err = migrate.Down(ctx, db.Pool) {
		if err != nil || v < 4 {
			t.Fatalf("down: %d, %v", v, err)
		}
	}
	var cols int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.columns
		WHERE table_schema = current_schema() AND column_name IN ('held', 'blocked')`).Scan(&cols); err != nil {
		t.Fatal(err)
	}
	if cols != 0 || !exists("outbox_event_unpublished_idx") {
		t.Errorf("down left %d of the new columns, unpublished index %v", cols, exists("outbox_event_unpublished_idx"))
	}
}

// The claim's cost does not grow with the events behind a head either:
// with 100,000 events of one aggregate, a claim of 100 reads the head (one
// index descent) and its run, not the rest of the aggregate.
func TestClaimCostBoundedByHotAggregate(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	const events, batch = 100_000, 100
	for _, q := range []string{
		`INSERT INTO outbox_event (topic, aggregate_type, aggregate_id, aggregate_seq, event_id, event_type, payload)
		 SELECT 't', 'order', 'hot', g, 'hot-' || g, 'E', '\x00'::bytea FROM generate_series(1, ` + strconv.Itoa(events) + `) g`,
		`INSERT INTO outbox_aggregate (aggregate_type, aggregate_id, last_seq) VALUES ('order', 'hot', ` + strconv.Itoa(events) + `)`,
		"VACUUM ANALYZE outbox_event",
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	plan := explainClaim(t, db, batch)
	if plan.ActualRows != batch {
		t.Fatalf("claimed %v rows, want %d", plan.ActualRows, batch)
	}
	examined, buffers := plan.examined(), plan.SharedHitBlocks+plan.SharedReadBlocks
	t.Logf("claim of %d from one aggregate of %d events: %.0f rows examined, %d buffers", batch, events, examined, buffers)
	if bound := float64(10 * batch); examined > bound {
		t.Errorf("claim examined %.0f rows, want at most %.0f (aggregate of %d)", examined, bound, events)
	}
	// Buffers count each access: reading the whole aggregate would be
	// over 100,000. The bound leaves room for heap visits an index-only
	// scan makes when VACUUM could not mark the pages all-visible (other
	// tests' transactions on the server hold its horizon back: 1,759
	// buffers alone, 2,006 in a full CI run).
	if bound := int64(40 * batch); buffers > bound {
		t.Errorf("claim touched %d buffers, want at most %d (aggregate of %d)", buffers, bound, events)
	}
}

// Fairness: the oldest events are one aggregate's 1,000 (a hot
// aggregate), and 20 small aggregates of 3 events each wait behind them.
// A claim takes the hot head from the oldest events and the other heads
// by aggregate, from its cursor on: within three batches of 10 every
// small aggregate has been served, rather than the first nine three times
// over (or none of them until the hot one drained).
func TestClaimsTakeTurnsOverAggregates(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			ctx := context.Background()
			const small, perSmall, batch = 20, 3, 10
			var hot []outbox.Message
			for n := 1; n <= 1000; n++ {
				hot = append(hot, msg("hot", n))
			}
			enqueue(t, db.Pool, hot...)
			var msgs []outbox.Message
			for n := 1; n <= perSmall; n++ {
				for a := range small {
					msgs = append(msgs, msg(fmt.Sprintf("s%02d", a), n))
				}
			}
			enqueue(t, db.Pool, msgs...)
			rec := newRecorder()
			r := newRelay(t, db, rec, outbox.RelayConfig{Mode: mode, DisableNotify: true, BatchSize: batch})
			for range 3 {
				if n, err := r.RunBatch(ctx); err != nil || n != batch {
					t.Fatalf("batch: %d, %v", n, err)
				}
			}
			seen := map[string]bool{}
			for _, e := range rec.snapshot() {
				seen[e.AggregateID] = true
			}
			if !seen["hot"] || len(seen) != small+1 {
				t.Fatalf("three batches of %d served %d aggregates (hot: %v), want the hot one and all %d small ones",
					batch, len(seen), seen["hot"], small)
			}
			drain(t, r)
			byAgg := map[string][]int64{}
			for _, e := range rec.snapshot() {
				byAgg[e.AggregateID] = append(byAgg[e.AggregateID], e.Seq)
			}
			for a, seqs := range byAgg {
				want := perSmall
				if a == "hot" {
					want = 1000
				}
				if len(seqs) != want {
					t.Errorf("%s: %d events delivered, want %d", a, len(seqs), want)
				}
				for i, s := range seqs {
					if s != int64(i+1) {
						t.Fatalf("%s delivered out of order: %v", a, seqs)
					}
				}
			}
		})
	}
}
