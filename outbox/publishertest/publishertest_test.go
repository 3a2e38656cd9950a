package publishertest_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/publishertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// memBroker is the smallest broker the suite accepts: topics are slices,
// each call goes through in order, and a failed event fails the later
// events of its aggregate to the same topic in the same call, as a
// partition would.
type memBroker struct {
	mu       sync.Mutex
	topics   map[string][]publishertest.Message
	rejected map[string]bool
	stalled  map[string]bool
	tooLarge int
}

func (b *memBroker) Check(e outbox.Event) error {
	if len(e.Payload) >= b.tooLarge {
		return fmt.Errorf("mem: event %s: payload of %d bytes is too large", e.EventID, len(e.Payload))
	}
	return nil
}

func (b *memBroker) Publish(ctx context.Context, events []outbox.Event) error {
	errs := make([]error, len(events))
	failed := false
	type stream struct{ topic, aggType, agg string }
	broken := map[stream]bool{}
	for i, e := range events {
		s := stream{e.Topic, e.AggregateType, e.AggregateID}
		b.mu.Lock()
		_, exists := b.topics[e.Topic]
		rejected, stalled := b.rejected[e.Topic], b.stalled[e.Topic]
		b.mu.Unlock()
		switch {
		case broken[s]:
			errs[i] = errors.New("mem: an earlier event of the aggregate failed")
		case !exists:
			errs[i] = fmt.Errorf("mem: no topic %s", e.Topic)
		case rejected:
			errs[i] = fmt.Errorf("mem: topic %s rejects", e.Topic)
		case stalled:
			<-ctx.Done()
			errs[i] = fmt.Errorf("mem: topic %s: %w", e.Topic, ctx.Err())
		default:
			// The fields travel apart from the event's own headers, of
			// which those of idem's names are dropped (ReservedHeaders).
			h := map[string]string{}
			for k, v := range e.Headers {
				if !idem.IsReservedHeader(k) {
					h[k] = v
				}
			}
			b.mu.Lock()
			b.topics[e.Topic] = append(b.topics[e.Topic], publishertest.Message{
				Topic: e.Topic, EventID: e.EventID, EventType: e.EventType, AggregateType: e.AggregateType,
				AggregateID: e.AggregateID, Seq: e.Seq, Payload: e.Payload, Headers: h,
			})
			b.mu.Unlock()
			continue
		}
		broken[s], failed = true, true
	}
	if failed {
		return &outbox.BatchError{Errs: errs}
	}
	return nil
}

// The suite passes against the in-memory broker: it asks nothing a
// publisher without Kafka cannot do.
func TestSuiteOnMemoryBroker(t *testing.T) {
	t.Parallel()
	publishertest.Run(t, func(t *testing.T, topics []string) *publishertest.Broker {
		b := &memBroker{topics: map[string][]publishertest.Message{}, rejected: map[string]bool{},
			stalled: map[string]bool{}, tooLarge: 4096}
		for _, topic := range topics {
			b.topics[topic] = nil
		}
		return &publishertest.Broker{
			Publisher: b,
			Read: func(_ context.Context, topic string) ([]publishertest.Message, error) {
				b.mu.Lock()
				defer b.mu.Unlock()
				return append([]publishertest.Message(nil), b.topics[topic]...), nil
			},
			Reject:   func(topic string) { b.mu.Lock(); b.rejected[topic] = true; b.mu.Unlock() },
			Stall:    func(topic string) { b.mu.Lock(); b.stalled[topic] = true; b.mu.Unlock() },
			TooLarge: 4096,
		}
	})
}
