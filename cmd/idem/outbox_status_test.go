package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// The report counts each status, expired leases and lists DEAD events,
// in text and JSON.
func TestOutboxStatus(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	var msgs []outbox.Message
	for _, id := range []string{"p1", "p2", "l1", "l2", "d1", "x1"} {
		msgs = append(msgs, outbox.Message{Topic: "t", AggregateType: "order", AggregateID: id, EventID: id, EventType: "E"})
	}
	if _, err := outbox.Enqueue(ctx, db.Pool, msgs...); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`UPDATE outbox_event SET created_at = now() - interval '90 seconds' WHERE event_id = 'p1'`,
		`UPDATE outbox_event SET status = 'PUBLISHING', lease_owner = 'r', lease_token = 1, locked_at = now() - interval '2 hours' WHERE event_id = 'l1'`,
		`UPDATE outbox_event SET status = 'PUBLISHING', lease_owner = 'r', lease_token = 1, locked_at = now() WHERE event_id = 'l2'`,
		`UPDATE outbox_event SET status = 'DEAD', attempts = 10, last_error = 'broker said no' WHERE event_id = 'd1'`,
		`UPDATE outbox_event SET status = 'PUBLISHED', published_at = now() WHERE event_id = 'x1'`,
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{"DATABASE_URL=" + db.URL}
	stdout, stderr, code := runIdem(t, env, "outbox", "status", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var st struct {
		Pending, Publishing, Published, Dead, ExpiredLeases int
		OldestPendingSeconds                                float64 `json:"oldest_pending_seconds"`
		DeadEvents                                          []struct {
			EventID   string `json:"event_id"`
			LastError string `json:"last_error"`
			Attempts  int
		} `json:"dead_events"`
	}
	if err := json.Unmarshal([]byte(stdout), &st); err != nil {
		t.Fatalf("%v: %s", err, stdout)
	}
	if st.Pending != 2 || st.Publishing != 2 || st.Published != 1 || st.Dead != 1 {
		t.Errorf("counts %+v", st)
	}
	if st.OldestPendingSeconds < 90 || st.OldestPendingSeconds > 3600 {
		t.Errorf("oldest pending %v s, want about 90", st.OldestPendingSeconds)
	}
	if len(st.DeadEvents) != 1 || st.DeadEvents[0].EventID != "d1" || st.DeadEvents[0].LastError != "broker said no" || st.DeadEvents[0].Attempts != 10 {
		t.Errorf("dead events %+v", st.DeadEvents)
	}
	// expired_leases is snake_case in JSON: decode it explicitly.
	var raw map[string]any
	_ = json.Unmarshal([]byte(stdout), &raw)
	if raw["expired_leases"] != float64(1) {
		t.Errorf("expired_leases = %v, want 1 (the 2-hour-old lease)", raw["expired_leases"])
	}

	stdout, _, code = runIdem(t, env, "outbox", "status")
	if code != 0 || !strings.Contains(stdout, "expired leases  1") || !strings.Contains(stdout, "broker said no") {
		t.Errorf("text report (exit %d):\n%s", code, stdout)
	}
	for _, args := range [][]string{{"outbox"}, {"outbox", "sideways"}, {"outbox", "status", "--lease-ttl", "0s"}, {"outbox", "status", "extra"}} {
		if _, stderr, code := runIdem(t, env, args...); code != 2 || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q", args, code, stderr)
		}
	}
}

// With --slot the report adds each WAL outbox slot: a slot that no relay
// reads lags by the WAL written since it was created, and past
// --lag-warn-bytes it gets a warning line.
func TestOutboxStatusSlot(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	slot := "t_status_" + strings.TrimPrefix(db.Schema, "t_")
	if _, err := db.Pool.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := db.Pool.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", slot); err != nil {
			t.Errorf("drop slot: %v", err)
		}
	})
	// WAL written after the slot's position: its lag.
	if _, err := db.Pool.Exec(ctx, "SELECT pg_logical_emit_message(true, 'idem.test', repeat('x', 10000))"); err != nil {
		t.Fatal(err)
	}
	env := []string{"DATABASE_URL=" + db.URL}
	stdout, stderr, code := runIdem(t, env, "outbox", "status", "--json", "--slot", slot, "--lag-warn-bytes", "1000")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var st struct {
		Pending int
		Slots   []struct {
			Slot      string
			Active    bool
			LagBytes  int64  `json:"lag_bytes"`
			Retained  int64  `json:"retained_bytes"`
			WALStatus string `json:"wal_status"`
			Warning   string
		}
	}
	if err := json.Unmarshal([]byte(stdout), &st); err != nil {
		t.Fatalf("%v: %s", err, stdout)
	}
	if len(st.Slots) != 1 || st.Slots[0].Slot != slot || st.Slots[0].Active || st.Slots[0].LagBytes < 10000 ||
		st.Slots[0].Retained < st.Slots[0].LagBytes || st.Slots[0].WALStatus == "" || !strings.Contains(st.Slots[0].Warning, "lags") {
		t.Fatalf("slots %+v", st.Slots)
	}
	if !strings.Contains(stderr, "warning: slot "+slot) || strings.Count(stderr, "\n") != 1 {
		t.Fatalf("stderr %q, want one warning line", stderr)
	}
	stdout, stderr, code = runIdem(t, env, "outbox", "status", "--slot", slot)
	if code != 0 || stderr != "" || !strings.Contains(stdout, "slot "+slot) || !strings.Contains(stdout, "active false") {
		t.Fatalf("text report below the default threshold (exit %d, stderr %q):\n%s", code, stderr, stdout)
	}
	if _, stderr, code := runIdem(t, env, "outbox", "status", "--slot", "no_such_slot_"+strings.TrimPrefix(db.Schema, "t_")); code != 1 || !strings.Contains(stderr, "slot not found") {
		t.Fatalf("unknown slot: exit %d, stderr %q", code, stderr)
	}
	for _, args := range [][]string{{"outbox", "status", "--slot", "Bad-Name"}, {"outbox", "status", "--slot", "a,"}, {"outbox", "status", "--lag-warn-bytes", "-1"}} {
		if _, stderr, code := runIdem(t, env, args...); code != 2 || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q", args, code, stderr)
		}
	}
}
