package kafka

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"

	"github.com/twmb/franz-go/pkg/kerr"
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
	cl       *kgo.Client
	maxBatch func(topic string) int32
}

var _ outbox.Publisher = (*Publisher)(nil)

// ProducerOpts are the client options the publisher expects, spelled out:
// acks from all in-sync replicas with idempotent writes (franz-go's
// defaults, which NewPublisher verifies). Record retries stay unlimited
// (the default): the relay's batch context bounds a publish instead.
// Pass them to kgo.NewClient with the seed brokers.
func ProducerOpts() []kgo.Opt {
	return []kgo.Opt{kgo.RequiredAcks(kgo.AllISRAcks())}
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
	p := &Publisher{cl: client}
	p.maxBatch, _ = client.OptValue(kgo.ProducerBatchMaxBytesFn).(func(string) int32)
	return p, nil
}

// recordOverhead bounds a record's framing inside a batch plus the batch
// header (61 bytes) with room to spare.
const recordOverhead = 512

// Publish produces events with one ProduceSync call and waits for every
// record's result. ctx (the relay's batch context) bounds the wait. It
// returns nil when all were written, an *outbox.BatchError naming the
// failed ones otherwise.
//
// Order within an aggregate: once a record of an aggregate fails, no later
// record of it may land ahead of its retry. franz-go guarantees that for
// failures inside a partition's idempotent stream, but it fails a record
// that is too large for a batch (or has no topic) on its own, before
// buffering, and produces the records behind it. Publish therefore checks
// those conditions first and does not produce the rest of such an
// aggregate in this batch.
func (p *Publisher) Publish(ctx context.Context, events []outbox.Event) error {
	errs := make([]error, len(events))
	failed := false
	blocked := map[[2]string]string{}
	recs := make([]*kgo.Record, 0, len(events))
	idx := make([]int, 0, len(events))
	for i, e := range events {
		k := [2]string{e.AggregateType, e.AggregateID}
		r := Record(e)
		switch {
		case blocked[k] != "":
			errs[i] = fmt.Errorf("%w: behind failed event %s", ErrHeldBack, blocked[k])
		case r.Topic == "":
			errs[i] = fmt.Errorf("kafka: event %s has no topic", e.EventID)
		case p.maxBatch != nil && recordSize(r)+recordOverhead > int(p.maxBatch(r.Topic)):
			errs[i] = fmt.Errorf("kafka: event %s: %w (%d bytes, batch limit %d)",
				e.EventID, kerr.MessageTooLarge, recordSize(r), p.maxBatch(r.Topic))
		default:
			recs = append(recs, r)
			idx = append(idx, i)
			continue
		}
		failed = true
		if blocked[k] == "" {
			blocked[k] = e.EventID
		}
	}
	if len(recs) == 0 {
		return &outbox.BatchError{Errs: errs}
	}
	for j, res := range p.cl.ProduceSync(ctx, recs...) {
		if res.Err != nil {
			failed = true
			errs[idx[j]] = fmt.Errorf("kafka: produce to %s: %w", res.Record.Topic, res.Err)
		}
	}
	if !failed {
		return nil
	}
	return &outbox.BatchError{Errs: errs}
}

// ErrHeldBack is the error of an event not produced because an earlier
// event of its aggregate failed in the same batch.
var ErrHeldBack = errors.New("kafka: held back behind a failed event of the same aggregate")

func recordSize(r *kgo.Record) int {
	n := len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
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
