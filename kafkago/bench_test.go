package kafkago_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testkafka"
	kfranz "github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/kafkago"
	"github.com/idemkit/idem/outbox"
)

// BenchmarkPublish runs the two Kafka publishers side by side on one kfake
// broker, in the same run: calls of 500 events (the relay's default
// batch) over 100 aggregates, to a 4-partition topic. The figure to read
// is events/s of each against the other; no database is involved (idem
// bench relay measures the relay around a publisher).
//
//	go test -run '^$' -bench Publish -benchtime 200x ./
func BenchmarkPublish(b *testing.B) {
	c := testkafka.New(b)
	c.CreateTopic(b, "bench", 4)
	franzPub, err := kfranz.NewPublisher(c.Client(b, kfranz.ProducerOpts()...), nil)
	if err != nil {
		b.Fatal(err)
	}
	goPub, err := kafkago.NewPublisher(newWriter(b, c.Addrs...))
	if err != nil {
		b.Fatal(err)
	}
	for _, p := range []struct {
		name string
		pub  outbox.Publisher
	}{{"franz-go", franzPub}, {"kafka-go", goPub}} {
		b.Run(p.name, func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			const batch = 500
			seq := map[string]int64{}
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				events := make([]outbox.Event, batch)
				for k := range events {
					agg := fmt.Sprintf("agg-%d", k%100)
					seq[agg]++
					events[k] = outbox.Event{Seq: seq[agg], Message: outbox.Message{Topic: "bench", AggregateType: "order",
						AggregateID: agg, EventID: fmt.Sprintf("%s-%d-%d", p.name, i, k), EventType: "E", Payload: make([]byte, 200)}}
				}
				if err := p.pub.Publish(ctx, events); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
