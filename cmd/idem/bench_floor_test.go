package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/wal"
)

// TestBenchFloorCheck: a subject within the run's noise of its floor
// passes, one faster than the floor by more than the noise fails with a
// line naming it and its floor.
func TestBenchFloorCheck(t *testing.T) {
	t.Parallel()
	testCases := []struct {
		name   string
		rounds map[string][]float64
		fails  bool
	}{
		{"below", map[string][]float64{"wal-floor": {100, 110}, "wal": {60, 70}}, false},
		{"within noise", map[string][]float64{"wal-floor": {100, 130}, "wal": {140, 150}}, false},
		{"fake fast subject", map[string][]float64{"wal-floor": {100, 105}, "wal": {300, 310}}, true},
	}
	for _, tt := range testCases {
		var log strings.Builder
		err := benchFloorCheck(&log, "wal-floor", tt.rounds, []string{"wal"})
		if got := err != nil; got != tt.fails {
			t.Errorf("%s: err %v, want failure %v", tt.name, err, tt.fails)
		}
		if tt.fails && (!errors.Is(err, errBeatsFloor) || !strings.Contains(log.String(), "FLOOR BEATEN: ") ||
			!strings.Contains(log.String(), "wal (best round 310/s) beats its floor wal-floor")) {
			t.Errorf("%s: err %v, log %q: want errBeatsFloor and a line naming wal and wal-floor", tt.name, err, log.String())
		}
	}
	if got := benchBatchRounds([]int{10, 10, 10, 10}, []float64{10, 10, 20, 20}, 2); len(got) != 2 || got[0] != 1000 || got[1] != 500 {
		t.Errorf("benchBatchRounds = %v, want [1000 500]", got)
	}
}

// TestBenchWALRawFloorCatchesFastSubject reads a real backlog with the raw
// floor (benchWALRaw, on a real slot) in two rounds interleaved with a
// fake subject that claims to have drained the same backlog in a
// microsecond: the check must fail and name it. It also checks that the
// floor reads its whole backlog, counting its own prefix's events only
// (the other prefix's, as many, in the same transactions, are skipped),
// and confirms it.
func TestBenchWALRawFloorCatchesFastSubject(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, testdb.Empty())
	ctx := t.Context()
	var b [4]byte
	_, _ = rand.Read(b[:])
	slot := "bench_floor_test_" + hex.EncodeToString(b[:])
	if _, err := db.Pool.Exec(ctx, "CREATE PUBLICATION "+slot); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), "DROP PUBLICATION IF EXISTS "+slot) })
	if _, err := db.Pool.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for range 100 {
			if _, err := db.Pool.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", slot); err == nil {
				return
			}
			time.Sleep(50 * time.Millisecond) // the slot stays active for a moment after its reader left
		}
	})
	const per = 300
	rounds := map[string][]float64{}
	for round := range 2 {
		prefix := "idem.bench." + slot + ".r" + strconv.Itoa(round)
		ours, other := wal.Enqueuer{Prefix: prefix}, wal.Enqueuer{Prefix: prefix + ".other"}
		// end: the WAL position just before the backlog's last
		// transaction, which the floor must confirm past (the cluster's
		// current position would include other sessions' later WAL).
		var end string
		for i := 0; i < per; i += 100 {
			if i+100 >= per {
				if err := db.Pool.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&end); err != nil {
					t.Fatal(err)
				}
			}
			var msgs []outbox.Message
			for j := i; j < i+100; j++ {
				msgs = append(msgs, outbox.Message{Topic: "t", AggregateType: "a", AggregateID: "x", EventID: "e" + strconv.Itoa(j), EventType: "E", Payload: []byte("x")})
			}
			err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				if _, err := ours.EnqueueTx(ctx, tx, msgs...); err != nil {
					return err
				}
				_, err := other.EnqueueTx(ctx, tx, msgs...)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		d, err := benchWALRaw(ctx, db.URL, slot, slot, prefix, per)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		// It read the whole backlog and confirmed it: a floor that counted
		// the other prefix too would stop, and confirm, a transaction early.
		var ok bool
		for range 100 { // the confirmation reaches the slot once the server processed it
			if err := db.Pool.QueryRow(ctx, "SELECT confirmed_flush_lsn > $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1", slot, end).Scan(&ok); err != nil {
				t.Fatal(err)
			}
			if ok {
				break
			}
			time.Sleep(20 * time.Millisecond) // polling the slot's position
		}
		if !ok {
			t.Fatalf("round %d: the slot's confirmed position is not past the start of the backlog's last transaction %s", round, end)
		}
		rounds["wal-floor"] = append(rounds["wal-floor"], per/d.Seconds())
		rounds["wal"] = append(rounds["wal"], per/time.Microsecond.Seconds()) // the fake fast subject
	}
	var log strings.Builder
	err := benchFloorCheck(&log, "wal-floor", rounds, []string{"wal"})
	if !errors.Is(err, errBeatsFloor) || !strings.Contains(log.String(), "FLOOR BEATEN: ") || !strings.Contains(log.String(), " wal (best round") {
		t.Fatalf("fake fast subject not caught: err %v, log %q", err, log.String())
	}
}
