package natsjs_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem/natsjs"
	"github.com/idemkit/idem/outbox"
)

// BenchmarkPublish publishes calls of 500 events (the relay's default
// batch) over 100 aggregates to one stream on the local server: 5 events
// per aggregate per call, so 5 rounds of 100 asynchronous publishes each.
// Compare with kafkago's BenchmarkPublish on the same machine.
//
//	go test -run '^$' -bench Publish -benchtime 200x ./
func BenchmarkPublish(b *testing.B) {
	s := newServer(b)
	s.createTopic(b, "bench", 0)
	pub, err := natsjs.NewPublisher(s.js, &natsjs.PublisherConfig{Prefix: s.prefix})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const batch = 500
	seq := map[string]int64{}
	for i := 0; b.Loop(); i++ {
		events := make([]outbox.Event, batch)
		for k := range events {
			agg := fmt.Sprintf("agg-%d", k%100)
			seq[agg]++
			events[k] = outbox.Event{Seq: seq[agg], Message: outbox.Message{Topic: "bench", AggregateType: "order",
				AggregateID: agg, EventID: fmt.Sprintf("e-%d-%d", i, k), EventType: "E", Payload: make([]byte, 200)}}
		}
		if err := pub.Publish(ctx, events); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "events/s")
}
