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
