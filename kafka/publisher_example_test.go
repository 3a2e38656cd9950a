package kafka_test

import (
	"log"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/kafka"
)

// The client is built with ProducerOpts (acks=all, idempotent writes);
// NewPublisher refuses a client configured for less.
func ExampleNewPublisher() {
	client, err := kgo.NewClient(append(kafka.ProducerOpts(), kgo.SeedBrokers("127.0.0.1:9092"))...)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	pub, err := kafka.NewPublisher(client, nil)
	if err != nil {
		log.Fatal(err)
	}
	_ = pub // outbox.NewRelay(pool, pub, nil)
}
