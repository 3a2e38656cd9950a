package kafka_test

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testkafka"
	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/outbox"
)

// TestPublisherRecordsReadByKcat cross-checks the publisher's records with a
// third-party Kafka client (kcat, librdkafka): what a consumer outside Go
// sees must be the key, value and headers the outbox contract promises.
// kcat is installed by .ci/run; a machine without it fails here rather than
// skip.
func TestPublisherRecordsReadByKcat(t *testing.T) {
	t.Parallel()
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		t.Fatalf("kcat not found (apt-get install kcat): %v", err)
	}
	c := testkafka.New(t)
	c.CreateTopic(t, "orders.events", 1)
	pub, err := kafka.NewPublisher(c.Client(t, kafka.ProducerOpts()...), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	events := []outbox.Event{
		pubEvent("orders.events", "order-7", 1, `{"status":"CONFIRMED"}`),
		pubEvent("orders.events", "order-7", 2, `{"status":"CHARGED"}`),
	}
	if err := pub.Publish(ctx, events); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, kcat, "-C", "-b", c.Addrs[0], "-t", "orders.events",
		"-o", "beginning", "-e", "-q", "-f", "%k|%s|%h\n").CombinedOutput()
	if err != nil {
		t.Fatalf("kcat: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(events) {
		t.Fatalf("kcat read %d records, want %d:\n%s", len(lines), len(events), out)
	}
	for i, line := range lines {
		parts := strings.SplitN(line, "|", 3)
		if len(parts) != 3 {
			t.Fatalf("kcat line %q", line)
		}
		e := events[i]
		if parts[0] != e.AggregateID || parts[1] != string(e.Payload) {
			t.Errorf("record %d: key %q value %q, want %q %q", i, parts[0], parts[1], e.AggregateID, e.Payload)
		}
		for _, want := range []string{
			kafka.HeaderEventID + "=" + e.EventID,
			kafka.HeaderEventType + "=" + e.EventType,
			kafka.HeaderAggregateSeq + "=" + strconv.FormatInt(e.Seq, 10),
			"trace=t1",
		} {
			if !strings.Contains(parts[2], want) {
				t.Errorf("record %d: headers %q lack %q", i, parts[2], want)
			}
		}
	}
}
