package kafka

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/outbox"
)

// Record headers set by Publisher.
const (
	HeaderEventID       = "event-id"
	HeaderEventType     = "event-type"
	HeaderAggregateType = "aggregate-type"
	HeaderAggregateSeq  = "aggregate-seq"
)

// ErrWeakProducer is returned by NewPublisher when the client is not
// configured for acks=all with idempotent writes.
var ErrWeakProducer = errors.New("kafka: producer must use acks=all and idempotent writes")

// ErrNilClient is returned by NewPublisher for a nil client.
var ErrNilClient = errors.New("kafka: client is nil")

// PublisherConfig configures a Publisher. The zero value means all
// defaults.
type PublisherConfig struct {
	// AllowWeakProducer skips the check that the client uses acks=all and
	// idempotent writes. Only for tests of failure modes. Defaults to
	// false.
	AllowWeakProducer bool
}

// Publisher is an outbox.Publisher that produces each relay batch with one
// ProduceSync call. Record key = aggregate id (so one aggregate lands in
// one partition, in order, with the client's default key-hash
// partitioner); value = payload; headers event-id, event-type,
// aggregate-type, aggregate-seq and the message's own headers.
type Publisher struct {
	cl *kgo.Client
}

var _ outbox.Publisher = (*Publisher)(nil)

// ProducerOpts are the client options the publisher expects, spelled out:
// acks from all in-sync replicas, idempotent writes (franz-go's defaults,
// which NewPublisher verifies) and unlimited record retries within the
// batch context. Pass them to kgo.NewClient with the seed brokers.
func ProducerOpts() []kgo.Opt {
	return []kgo.Opt{
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordRetries(-1),
	}
}

// NewPublisher returns a publisher over client, which the caller owns and
// closes. The client must produce with acks=all and idempotent writes
// (franz-go's defaults; see ProducerOpts) and must not allow cancelling
// in-flight idempotent records: NewPublisher checks the client's options
// and returns ErrWeakProducer otherwise. Idempotence is what keeps a
// partition's records in order and free of broker-side duplicates when
// franz-go retries a produce request; a failed record then fails every
// later record of its partition, which is the ordering contract of
// outbox.Publisher.
func NewPublisher(client *kgo.Client, cfg *PublisherConfig) (*Publisher, error) {
	if client == nil {
		return nil, ErrNilClient
	}
	var c PublisherConfig
	if cfg != nil {
		c = *cfg
	}
	if !c.AllowWeakProducer {
		if acks, _ := client.OptValue(kgo.RequiredAcks).(kgo.Acks); acks != kgo.AllISRAcks() {
			return nil, fmt.Errorf("%w: RequiredAcks is not AllISRAcks", ErrWeakProducer)
		}
		if off, _ := client.OptValue(kgo.DisableIdempotentWrite).(bool); off {
			return nil, fmt.Errorf("%w: DisableIdempotentWrite is set", ErrWeakProducer)
		}
		if on, _ := client.OptValue(kgo.AllowIdempotentProduceCancellation).(bool); on {
			return nil, fmt.Errorf("%w: AllowIdempotentProduceCancellation is set", ErrWeakProducer)
		}
	}
	return &Publisher{cl: client}, nil
}

// Publish produces events with one ProduceSync call and waits for every
// record's result. ctx (the relay's batch context) bounds the wait. It
// returns nil when all were written, an *outbox.BatchError naming the
// failed ones otherwise.
func (p *Publisher) Publish(ctx context.Context, events []outbox.Event) error {
	recs := make([]*kgo.Record, len(events))
	for i, e := range events {
		recs[i] = Record(e)
	}
	res := p.cl.ProduceSync(ctx, recs...)
	if res.FirstErr() == nil {
		return nil
	}
	errs := make([]error, len(events))
	for i, r := range res {
		if r.Err != nil {
			errs[i] = fmt.Errorf("kafka: produce to %s: %w", recs[i].Topic, r.Err)
		}
	}
	return &outbox.BatchError{Errs: errs}
}

// Record is the Kafka record Publisher produces for e.
func Record(e outbox.Event) *kgo.Record {
	h := make([]kgo.RecordHeader, 0, 4+len(e.Headers))
	h = append(h,
		kgo.RecordHeader{Key: HeaderEventID, Value: []byte(e.EventID)},
		kgo.RecordHeader{Key: HeaderEventType, Value: []byte(e.EventType)},
		kgo.RecordHeader{Key: HeaderAggregateType, Value: []byte(e.AggregateType)},
		kgo.RecordHeader{Key: HeaderAggregateSeq, Value: strconv.AppendInt(nil, e.Seq, 10)},
	)
	for _, k := range slices.Sorted(maps.Keys(e.Headers)) {
		h = append(h, kgo.RecordHeader{Key: k, Value: []byte(e.Headers[k])})
	}
	return &kgo.Record{Topic: e.Topic, Key: []byte(e.AggregateID), Value: e.Payload, Headers: h}
}
