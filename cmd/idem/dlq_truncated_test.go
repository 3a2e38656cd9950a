package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testkafka"
	"github.com/idemkit/idem/kafka"
)

// TestDLQTruncatedCopy: a reference copy (the consumer's dead-letter of a
// record too large to copy whole: no value, dlq-truncated) is shown with
// the original's value read from its source and redriven from it; once
// the source record is deleted (retention), show says the value is gone
// and redrive refuses the copy, saying why, with a non-zero exit.
func TestDLQTruncatedCopy(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t)
	for _, topic := range []string{"orders.events", "orders.events.dlq", "orders.redriven"} {
		kc.CreateTopic(t, topic, 1)
	}
	ctx := context.Background()
	cl := kc.Client(t)
	orig := &kgo.Record{Topic: "orders.events", Key: []byte("o1"), Value: []byte(`{"big":"original value"}`), Headers: []kgo.RecordHeader{
		{Key: kafka.HeaderEventID, Value: []byte("ev-big")}, {Key: "trace", Value: []byte("t-1")},
	}}
	ref := &kgo.Record{Topic: "orders.events.dlq", Key: []byte("o1"), Headers: []kgo.RecordHeader{
		{Key: kafka.HeaderEventID, Value: []byte("ev-big")},
		{Key: kafka.HeaderDeadLetterError, Value: []byte("handler: boom")},
		{Key: kafka.HeaderDeadLetterSource, Value: []byte("orders.events/0/0")},
		{Key: kafka.HeaderDeadLetterAttempts, Value: []byte("5")},
		{Key: kafka.HeaderDeadLetterTruncated, Value: []byte("true")},
		{Key: kafka.HeaderDeadLetterSize, Value: []byte("2000000")},
	}}
	for _, r := range []*kgo.Record{orig, ref} {
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{"KAFKA_BROKERS=" + strings.Join(kc.Addrs, ","), "DATABASE_URL=" + testdb.New(t).URL}
	stdout, stderr, code := runIdem(t, env, "dlq", "show", "orders.events.dlq", "0", "0")
	if code != 0 || !strings.Contains(stdout, "read from its source orders.events/0/0") || !strings.Contains(stdout, `"original value"`) {
		t.Errorf("show (exit %d):\n%s%s", code, stdout, stderr)
	}
	stdout, stderr, code = runIdem(t, env, "dlq", "redrive", "--from", "orders.events.dlq", "--to", "orders.redriven", "--actor", "ops", "--reason", "fixed")
	if code != 0 || !strings.Contains(stdout, "1 redriven") {
		t.Errorf("redrive (exit %d):\n%s%s", code, stdout, stderr)
	}
	if got := kc.ReadAll(t, "orders.redriven", 1, 20*time.Second)[0]; string(got.Value) != string(orig.Value) {
		t.Errorf("redriven value %q, want the original's", got.Value)
	}

	del, err := kadm.NewClient(cl).DeleteRecords(ctx, kadm.Offsets{"orders.events": {0: {Topic: "orders.events", Partition: 0, At: 1}}})
	if err != nil || del.Error() != nil {
		t.Fatalf("delete records: %v %v", err, del.Error())
	}
	stdout, stderr, code = runIdem(t, env, "dlq", "show", "orders.events.dlq", "0", "0")
	if code != 0 || !strings.Contains(stdout, "is gone (retention)") {
		t.Errorf("show after retention (exit %d):\n%s%s", code, stdout, stderr)
	}
	kc.CreateTopic(t, "orders.redriven-again", 1)
	stdout, stderr, code = runIdem(t, env, "dlq", "redrive", "--from", "orders.events.dlq", "--to", "orders.redriven-again", "--actor", "ops", "--reason", "fixed")
	if code != 1 || !strings.Contains(stdout, "refused orders.events.dlq/0/0: truncated dead-letter copy whose source record is gone") ||
		!strings.Contains(stderr, "source record of a truncated dead-letter copy is gone") || !strings.Contains(stdout, "0 redriven") {
		t.Errorf("redrive after retention (exit %d):\n%s%s", code, stdout, stderr)
	}
}
