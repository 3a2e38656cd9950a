package main

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testkafka"
	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/outbox"
)

// deadSetup has order/a's first event DEAD (as a poison event leaves it)
// and a second one held back behind it, plus an unrelated event.
func deadSetup(t *testing.T) (*testdb.DB, []string) {
	t.Helper()
	db := testdb.New(t)
	ctx := context.Background()
	msgs := []outbox.Message{
		{Topic: "orders.events", AggregateType: "order", AggregateID: "a", EventID: "a-1", EventType: "OrderConfirmed",
			Payload: []byte(`{"order_id":"a","total":1000}`), Headers: map[string]string{"trace": "t1"}},
		{Topic: "orders.events", AggregateType: "order", AggregateID: "a", EventID: "a-2", EventType: "OrderCharged", Payload: []byte("raw")},
		{Topic: "orders.events", AggregateType: "order", AggregateID: "b", EventID: "b-1", EventType: "OrderConfirmed"},
	}
	if _, err := outbox.Enqueue(ctx, db.Pool, msgs...); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`UPDATE outbox_event SET status = 'DEAD', attempts = 10, last_error = 'MESSAGE_TOO_LARGE: record is too big' WHERE event_id = 'a-1'`,
		`UPDATE outbox_event SET status = 'PUBLISHED', published_at = now() WHERE event_id = 'b-1'`,
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	return db, []string{"DATABASE_URL=" + db.URL, "USER=tester"}
}

// relayToKafka runs a relay publishing to a kfake broker until every
// event is published, and returns what arrived on orders.events.
func relayToKafka(t *testing.T, db *testdb.DB, n int) []string {
	t.Helper()
	kc := testkafka.New(t)
	kc.CreateTopic(t, "orders.events", 1)
	pub, err := kafka.NewPublisher(kc.Client(t, kafka.ProducerOpts()...), nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := outbox.NewRelay(db.Pool, pub, &outbox.RelayConfig{DisableNotify: true})
	if err != nil {
		t.Fatal(err)
	}
	for {
		got, err := r.RunBatch(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if got == 0 {
			break
		}
	}
	var ids []string
	for _, rec := range kc.ReadAll(t, "orders.events", n, 20*time.Second) {
		for _, h := range rec.Headers {
			if h.Key == "event-id" {
				ids = append(ids, string(h.Value))
			}
		}
	}
	return ids
}

func TestOutboxListShow(t *testing.T) {
	t.Parallel()
	_, env := deadSetup(t)
	stdout, stderr, code := runIdem(t, env, "outbox", "list", "--status", "DEAD", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var list []struct {
		EventID   string `json:"event_id"`
		Status    string `json:"status"`
		LastError string `json:"last_error"`
	}
	if err := json.Unmarshal([]byte(stdout), &list); err != nil {
		t.Fatalf("%v: %s", err, stdout)
	}
	if len(list) != 1 || list[0].EventID != "a-1" || !strings.Contains(list[0].LastError, "MESSAGE_TOO_LARGE") {
		t.Errorf("list: %+v", list)
	}
	stdout, _, code = runIdem(t, env, "outbox", "list", "--aggregate", "order/a")
	if code != 0 || !strings.Contains(stdout, "a-1") || !strings.Contains(stdout, "a-2") || strings.Contains(stdout, "b-1") {
		t.Errorf("list --aggregate (exit %d):\n%s", code, stdout)
	}

	stdout, stderr, code = runIdem(t, env, "outbox", "show", "a-1", "--json")
	if code != 0 {
		t.Fatalf("show: exit %d: %s", code, stderr)
	}
	var ev struct {
		Status   string            `json:"status"`
		Attempts int               `json:"attempts"`
		Payload  map[string]any    `json:"payload"`
		Headers  map[string]string `json:"headers"`
	}
	if err := json.Unmarshal([]byte(stdout), &ev); err != nil {
		t.Fatalf("%v: %s", err, stdout)
	}
	if ev.Status != "DEAD" || ev.Attempts != 10 || ev.Payload["order_id"] != "a" || ev.Headers["trace"] != "t1" {
		t.Errorf("show --json: %s", stdout)
	}
	stdout, _, code = runIdem(t, env, "outbox", "show", "a-1")
	if code != 0 || !strings.Contains(stdout, `"order_id": "a"`) || !strings.Contains(stdout, "MESSAGE_TOO_LARGE") {
		t.Errorf("show (exit %d):\n%s", code, stdout)
	}
	stdout, _, _ = runIdem(t, env, "outbox", "show", "a-2", "--json")
	if !strings.Contains(stdout, `"payload_base64": "cmF3"`) {
		t.Errorf("non-JSON payload: %s", stdout)
	}
}

// Bad input is a one-line error: exit 2 for usage, 1 for an event that
// is unknown or in the wrong state; nothing changes.
func TestOutboxAdminBadInput(t *testing.T) {
	t.Parallel()
	db, env := deadSetup(t)
	testCases := []struct {
		args     []string
		wantCode int
		wantErr  string
	}{
		{[]string{"outbox", "list", "--status", "GONE"}, 2, "--status"},
		{[]string{"outbox", "list", "--limit", "0"}, 2, "--limit"},
		{[]string{"outbox", "list", "--limit", "x"}, 2, "invalid value"},
		{[]string{"outbox", "list", "--aggregate", "noslash"}, 2, "TYPE/ID"},
		{[]string{"outbox", "list", "extra"}, 2, "unexpected argument"},
		{[]string{"outbox", "show"}, 2, "exactly one event id"},
		{[]string{"outbox", "show", "a", "b"}, 2, "exactly one event id"},
		{[]string{"outbox", "show", "nope"}, 1, "event not found"},
		{[]string{"outbox", "requeue"}, 2, "missing event id"},
		{[]string{"outbox", "requeue", "a-1", "--dead"}, 2, "not both"},
		{[]string{"outbox", "requeue", "a-1", "--aggregate", "order/a"}, 2, "only with --dead"},
		{[]string{"outbox", "requeue", "--bogus"}, 2, "flag provided but not defined"},
		{[]string{"outbox", "requeue", "nope"}, 1, "event not found"},
		{[]string{"outbox", "requeue", "b-1"}, 1, "it is PUBLISHED, not DEAD"},
		{[]string{"outbox", "requeue", "a-2"}, 1, "it is PENDING, not DEAD"},
		{[]string{"outbox", "discard", "a-1"}, 2, "--reason is required"},
		{[]string{"outbox", "discard", "--reason", "x"}, 2, "exactly one event id"},
		{[]string{"outbox", "discard", "b-1", "--reason", "x"}, 1, "it is PUBLISHED, not DEAD"},
		{[]string{"outbox", "discard", "nope", "--reason", "x"}, 1, "event not found"},
		{[]string{"outbox", "sideways"}, 2, "unknown action"},
	}
	for _, tt := range testCases {
		_, stderr, code := runIdem(t, env, tt.args...)
		if code != tt.wantCode || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tt.wantErr) {
			t.Errorf("%v: exit %d (want %d), stderr %q (want one line with %q)", tt.args, code, tt.wantCode, stderr, tt.wantErr)
		}
	}
	e, err := outbox.NewAdmin(db.Pool).Show(context.Background(), "a-1")
	if err != nil || e.Status != "DEAD" || len(e.Audit) != 0 {
		t.Errorf("a-1 changed by refused commands: %+v, %v", e, err)
	}
	for _, args := range [][]string{{"outbox", "--help"}, {"outbox", "list", "--help"}, {"outbox", "show", "--help"}, {"outbox", "requeue", "--help"}, {"outbox", "discard", "--help"}} {
		stdout, stderr, code := runIdem(t, env, args...)
		if code != 0 || stderr != "" || !strings.Contains(stdout, "Usage: idem outbox") {
			t.Errorf("%v: exit %d, %q %q", args, code, stdout, stderr)
		}
	}
}

// Two operators requeue one DEAD event at once from two processes: one
// succeeds, the other is told it is no longer DEAD; the relay then
// publishes the event and the one it held back, once each, in order.
func TestOutboxRequeueConcurrentThenPublished(t *testing.T) {
	t.Parallel()
	db, env := deadSetup(t)
	type result struct {
		stdout, stderr string
		code           int
	}
	res := make([]result, 2)
	var wg sync.WaitGroup
	for i := range res {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o, e, c := runIdem(t, env, "outbox", "requeue", "a-1", "--reason", "topic limit raised", "--json")
			res[i] = result{o, e, c}
		}()
	}
	wg.Wait()
	codes := []int{res[0].code, res[1].code}
	slices.Sort(codes)
	if !slices.Equal(codes, []int{0, 1}) {
		t.Fatalf("exit codes %v, want one 0 and one 1: %+v", codes, res)
	}
	for _, r := range res {
		var out struct {
			Done    []string
			Refused []struct {
				EventID string `json:"event_id"`
				Status  string
			}
		}
		if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
			t.Fatalf("%v: %q", err, r.stdout)
		}
		if r.code == 0 && !slices.Equal(out.Done, []string{"a-1"}) {
			t.Errorf("winner: %+v", out)
		}
		if r.code == 1 && (len(out.Refused) != 1 || out.Refused[0].Status != "PENDING" || !strings.Contains(r.stderr, "not DEAD")) {
			t.Errorf("loser: %+v %q", out, r.stderr)
		}
	}
	e, err := outbox.NewAdmin(db.Pool).Show(context.Background(), "a-1")
	if err != nil || e.Status != "PENDING" || e.Attempts != 0 || len(e.Audit) != 1 ||
		e.Audit[0].Actor != "tester" || e.Audit[0].Reason != "topic limit raised" {
		t.Fatalf("after requeue: %+v, %v", e, err)
	}
	if got := relayToKafka(t, db, 2); !slices.Equal(got, []string{"a-1", "a-2"}) {
		t.Fatalf("published %v, want a-1 a-2", got)
	}
	stdout, _, code := runIdem(t, env, "outbox", "requeue", "--dead")
	if code != 0 || !strings.Contains(stdout, "nothing to requeue") {
		t.Errorf("requeue --dead with none: exit %d %q", code, stdout)
	}
}

// Discard unblocks the aggregate: the held-back event is published and
// the discarded one never is.
func TestOutboxDiscardThenPublished(t *testing.T) {
	t.Parallel()
	db, env := deadSetup(t)
	stdout, stderr, code := runIdem(t, env, "outbox", "discard", "a-1", "--reason", "order cancelled by hand")
	if code != 0 || !strings.Contains(stdout, "discarded a-1") {
		t.Fatalf("discard: exit %d %q %q", code, stdout, stderr)
	}
	if _, stderr, code := runIdem(t, env, "outbox", "discard", "a-1", "--reason", "again"); code != 1 || !strings.Contains(stderr, "it is DISCARDED") {
		t.Errorf("second discard: exit %d %q", code, stderr)
	}
	if _, stderr, code := runIdem(t, env, "outbox", "requeue", "a-1"); code != 1 || !strings.Contains(stderr, "it is DISCARDED") {
		t.Errorf("requeue of a discarded event: exit %d %q", code, stderr)
	}
	if got := relayToKafka(t, db, 1); !slices.Equal(got, []string{"a-2"}) {
		t.Fatalf("published %v, want a-2 only", got)
	}
	stdout, _, _ = runIdem(t, env, "outbox", "show", "a-1")
	if !strings.Contains(stdout, "DISCARDED") || !strings.Contains(stdout, "discard by tester (was DEAD): order cancelled by hand") {
		t.Errorf("show after discard:\n%s", stdout)
	}
	stdout, _, _ = runIdem(t, env, "outbox", "status", "--json")
	if !strings.Contains(stdout, `"discarded":1`) {
		t.Errorf("status: %s", stdout)
	}
}
