package testkafka_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/internal/testkafka"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestProduceAndReadBack(t *testing.T) {
	t.Parallel()
	c := testkafka.New(t)
	c.CreateTopic(t, "events", 3)
	cl := c.Client(t, kgo.DefaultProduceTopic("events"))
	var recs []*kgo.Record
	for i := range 30 {
		recs = append(recs, &kgo.Record{Key: []byte("k" + strconv.Itoa(i%5)), Value: []byte(strconv.Itoa(i))})
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	got := c.ReadAll(t, "events", 30, 10*time.Second)
	if len(got) != 30 {
		t.Fatalf("read %d records, want 30", len(got))
	}
	// Per key, values arrive in produce order.
	last := map[string]int{}
	for _, r := range got {
		v, _ := strconv.Atoi(string(r.Value))
		if prev, ok := last[string(r.Key)]; ok && v < prev {
			t.Fatalf("key %s: %d after %d", r.Key, v, prev)
		}
		last[string(r.Key)] = v
	}
	if _, err := c.Read("events", 31, 300*time.Millisecond); err == nil {
		t.Fatal("Read of more records than exist did not time out")
	}
}
