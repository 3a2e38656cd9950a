package publishertest_test

import (
	"context"
	"testing"

	"github.com/idemkit/idem/outbox/publishertest"
)

// A publisher's own test runs the suite; each subtest gets a fresh broker
// with the topics it asks for.
func ExampleRun() {
	testMyPublisher := func(t *testing.T) {
		publishertest.Run(t, func(t *testing.T, topics []string) *publishertest.Broker {
			// Start a broker for t, create topics, build the publisher.
			return &publishertest.Broker{
				Publisher: nil, // your outbox.Publisher
				Read: func(ctx context.Context, topic string) ([]publishertest.Message, error) {
					return nil, nil // every message on topic, decoded
				},
				Reject:   func(topic string) {}, // publishes to topic fail at once from now on
				Stall:    func(topic string) {}, // publishes to topic never succeed from now on
				TooLarge: 1 << 20,               // a payload size the publisher or broker refuses
			}
		})
	}
	_ = testMyPublisher
}
