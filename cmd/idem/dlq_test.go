package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

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
	env := []string{"KAFKA_BROKERS=" + strings.Join(kc.Addrs, ",")}

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
		stdout, stderr, code = runIdem(t, env, "dlq", "redrive", "--from", "orders.events.dlq")
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
