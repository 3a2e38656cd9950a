package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os/user"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testkafka"
	"github.com/idemkit/idem/kafka"
)

func TestDLQCommands(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t)
	kc.CreateTopic(t, "orders.events", 1)
	kc.CreateTopic(t, "orders.events.dlq", 1)
	cl := kc.Client(t)
	for i, e := range []string{"handler: boom", "handler: timeout"} {
		rec := &kgo.Record{Topic: "orders.events.dlq", Key: []byte("o1"), Value: []byte(fmt.Sprintf(`{"i":%d}`, i)), Headers: []kgo.RecordHeader{
			{Key: kafka.HeaderEventID, Value: []byte(fmt.Sprintf("ev-%d", i))},
			{Key: kafka.HeaderDeadLetterError, Value: []byte(e)},
			{Key: kafka.HeaderDeadLetterSource, Value: []byte(fmt.Sprintf("orders.events/0/%d", i))},
			{Key: kafka.HeaderDeadLetterAttempts, Value: []byte("5")},
		}}
		if err := cl.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	db := testdb.New(t)
	env := []string{"KAFKA_BROKERS=" + strings.Join(kc.Addrs, ","), "DATABASE_URL=" + db.URL}

	stdout, stderr, code := runIdem(t, env, "dlq", "list", "orders.events.dlq", "--json")
	if code != 0 {
		t.Fatalf("list: exit %d %s", code, stderr)
	}
	var list []struct {
		ID      string          `json:"id"`
		Error   string          `json:"error"`
		EventID string          `json:"event_id"`
		Value   json.RawMessage `json:"value"`
	}
	if err := json.Unmarshal([]byte(stdout), &list); err != nil {
		t.Fatalf("%v: %s", err, stdout)
	}
	if len(list) != 2 || list[1].ID != "orders.events.dlq/0/1" || list[1].Error != "handler: timeout" || strings.Join(strings.Fields(string(list[1].Value)), "") != `{"i":1}` {
		t.Errorf("list: %s", stdout)
	}
	stdout, _, code = runIdem(t, env, "dlq", "show", "orders.events.dlq", "0", "0")
	if code != 0 || !strings.Contains(stdout, "handler: boom") || !strings.Contains(stdout, `{"i":0}`) {
		t.Errorf("show (exit %d):\n%s", code, stdout)
	}

	testCases := []struct {
		args     []string
		wantCode int
		wantErr  string
	}{
		{[]string{"dlq"}, 2, "missing action"},
		{[]string{"dlq", "list"}, 2, "want one topic"},
		{[]string{"dlq", "show", "orders.events.dlq", "x", "0"}, 2, "partition"},
		{[]string{"dlq", "show", "orders.events.dlq", "0", "1e3"}, 2, "offset"},
		{[]string{"dlq", "show", "orders.events.dlq", "0", "9"}, 1, "record not found"},
		{[]string{"dlq", "list", "nope.dlq"}, 1, "topic not found"},
		{[]string{"dlq", "redrive"}, 2, "--from is required"},
		{[]string{"dlq", "redrive", "--from", "a", "--to", "a"}, 2, "must differ"},
		{[]string{"dlq", "redrive", "--from", "orders.events.dlq"}, 2, "--reason is required"},
		{[]string{"dlq", "redrive", "--from", "orders.events.dlq", "--actor", "ops", "--reason", " "}, 2, "--reason is required"},
		{[]string{"dlq", "list", "orders.events.dlq", "--offset", "-2"}, 2, "--offset must not be negative"},
	}
	for _, tt := range testCases {
		_, stderr, code := runIdem(t, env, tt.args...)
		if code != tt.wantCode || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tt.wantErr) {
			t.Errorf("%v: exit %d (want %d), stderr %q (want one line with %q)", tt.args, code, tt.wantCode, stderr, tt.wantErr)
		}
	}

	stdout, _, code = runIdem(t, env, "dlq", "redrive", "--from", "orders.events.dlq", "--filter-error", "boom", "--dry-run")
	if code != 0 || !strings.Contains(stdout, "would redrive orders.events.dlq/0/0 -> orders.events (event ev-0)") || !strings.Contains(stdout, "1 filtered out") {
		t.Errorf("dry run (exit %d):\n%s", code, stdout)
	}
	for run, want := range []string{"2 redriven, 0 already redriven", "0 redriven, 2 already redriven"} {
		stdout, stderr, code = runIdem(t, env, "dlq", "redrive", "--from", "orders.events.dlq", "--actor", "ops", "--reason", "fixed")
		if code != 0 || !strings.Contains(stdout, want) {
			t.Errorf("run %d (exit %d): %s %s", run, code, stdout, stderr)
		}
	}
	got := kc.ReadAll(t, "orders.events", 2, 20*time.Second)
	if len(got) != 2 {
		t.Fatalf("%d records on orders.events", len(got))
	}
	if recs, err := kafka.NewDLQ(kgo.SeedBrokers(kc.Addrs...)).List(context.Background(), "orders.events", 0); err != nil || len(recs) != 2 {
		t.Errorf("orders.events holds %d records, want 2: %v", len(recs), err)
	}
}

// A redrive is audited: the row names the actor (the OS user, with a
// warning, when --actor is not given), the reason and each record moved;
// two redrive processes started at once publish each record once, the
// second saying it is already redriven; --force redrives again.
func TestDLQRedriveAudit(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t)
	kc.CreateTopic(t, "orders.events", 1)
	kc.CreateTopic(t, "orders.events.dlq", 1)
	cl := kc.Client(t)
	for i := range 3 {
		rec := &kgo.Record{Topic: "orders.events.dlq", Key: []byte("o1"), Value: []byte(fmt.Sprintf(`{"i":%d}`, i)), Headers: []kgo.RecordHeader{
			{Key: kafka.HeaderEventID, Value: []byte(fmt.Sprintf("ev-%d", i))},
			{Key: kafka.HeaderDeadLetterError, Value: []byte("handler: boom")},
			{Key: kafka.HeaderDeadLetterSource, Value: []byte(fmt.Sprintf("orders.events/0/%d", i))},
		}}
		if err := cl.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	db := testdb.New(t)
	env := []string{"KAFKA_BROKERS=" + strings.Join(kc.Addrs, ","), "DATABASE_URL=" + db.URL, "USER=ops-user"}

	type result struct {
		stdout, stderr string
		code           int
	}
	var wg sync.WaitGroup
	res := make([]result, 2)
	for i := range res {
		wg.Add(1)
		go func() {
			defer wg.Done()
			args := []string{"dlq", "redrive", "--from", "orders.events.dlq", "--reason", "consumer fixed"}
			if i == 1 {
				args = append(args, "--actor", "alice")
			}
			res[i].stdout, res[i].stderr, res[i].code = runIdem(t, env, args...)
		}()
	}
	wg.Wait()
	for i, r := range res {
		if r.code != 0 || !strings.Contains(r.stderr, "action=dlq.redrive") {
			t.Fatalf("redrive %d: exit %d\n%s\n%s", i, r.code, r.stdout, r.stderr)
		}
	}
	if !strings.Contains(res[0].stderr, `warning: no --actor given: recording the OS user`) || strings.Contains(res[1].stderr, "warning") {
		t.Errorf("actor warnings: %q / %q", res[0].stderr, res[1].stderr)
	}
	both := res[0].stdout + res[1].stdout
	if !strings.Contains(both, "3 redriven, 0 already redriven") || !strings.Contains(both, "0 redriven, 3 already redriven") ||
		!strings.Contains(both, "skipped orders.events.dlq/0/1: already redriven to orders.events by ") {
		t.Errorf("two redrives at once:\n%s", both)
	}
	if recs, err := kafka.NewDLQ(kgo.SeedBrokers(kc.Addrs...)).List(context.Background(), "orders.events", 0); err != nil || len(recs) != 3 {
		t.Errorf("orders.events holds %d records, want 3: %v", len(recs), err)
	}
	var n int
	err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM idem_admin_audit WHERE action = 'dlq.redrive' AND subject = 'orders.events.dlq'
		AND reason = 'consumer fixed' AND actor IN ('alice', $1)`, osUser(t)).Scan(&n)
	if err != nil || n != 2 {
		t.Errorf("audit rows: %d %v", n, err)
	}
	err = db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM idem_admin_audit WHERE action = 'dlq.redrive'
		AND detail @> '{"moved": [{"topic": "orders.events.dlq", "partition": 0, "offset": 1, "to": "orders.events"}]}'`).Scan(&n)
	if err != nil || n != 1 {
		t.Errorf("audit rows naming the record moved: %d %v", n, err)
	}

	stdout, stderr, code := runIdem(t, env, "dlq", "redrive", "--from", "orders.events.dlq", "--filter-error", "boom", "--force", "--actor", "bob", "--reason", "replay", "--json")
	var rep kafka.RedriveReport
	if code != 0 || json.Unmarshal([]byte(stdout), &rep) != nil || len(rep.Moved) != 3 || !rep.Forced || rep.AuditID == 0 {
		t.Fatalf("forced: exit %d %s %s", code, stdout, stderr)
	}
	if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM idem_dlq_redrive WHERE redrives = 2 AND audit_id = $1`, rep.AuditID).Scan(&n); err != nil || n != 3 {
		t.Errorf("ledger after --force: %d %v", n, err)
	}
}

// osUser is the name auditActor records for the test's process user.
func osUser(t *testing.T) string {
	t.Helper()
	u, err := user.Current()
	if err != nil || u.Username == "" {
		return "ops-user"
	}
	return u.Username
}
