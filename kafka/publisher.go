package kafka

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/outbox"
)

// Record headers set by Publisher: package idem's spelling, which every
// adapter shares.
const (
	HeaderEventID       = idem.HeaderEventID
	HeaderEventType     = idem.HeaderEventType
	HeaderAggregateType = idem.HeaderAggregateType
	HeaderAggregateSeq  = idem.HeaderAggregateSeq
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

// Publisher is an outbox.Publisher (and outbox.Checker) that produces
// each relay call with one batch of Produce calls on a franz-go client.
// Record key = aggregate id (so one aggregate lands in one partition, in
// order, with the client's default key-hash partitioner); value = payload;
// headers event-id, event-type, aggregate-type, aggregate-seq and the
// message's own headers, sorted by name.
//
// It keeps no ordering logic of its own: the relay decides what goes in a
// call, and the order inside a partition is franz-go's idempotent
// producer's, which fails every later record of a partition after a
// failed one.
type Publisher struct {
	cl       *kgo.Client
	maxBatch func(topic string) int32
	flush    bool // records may wait for a linger or a manual flush
}

var (
	_ outbox.Publisher = (*Publisher)(nil)
	_ outbox.Checker   = (*Publisher)(nil)
)

// ProducerOpts are the client options the publisher expects, spelled out:
// acks from all in-sync replicas with idempotent writes (franz-go's
// defaults, which NewPublisher verifies). Record retries stay unlimited
// (the default) and no RecordDeliveryTimeout is needed: every record
// carries the relay's publish context, and Publish returns by its
// deadline. Pass them to kgo.NewClient with the seed brokers.
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
// later record of its partition, which is what outbox.Publisher asks of a
// publisher's order.
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
	linger, _ := client.OptValue(kgo.ProducerLinger).(time.Duration)
	manual, _ := client.OptValue(kgo.ManualFlushing).(bool)
	p.flush = linger > 0 || manual
	return p, nil
}

// recordOverhead bounds a record's framing inside a batch plus the batch
// header (61 bytes) with room to spare.
const recordOverhead = 512

// Check refuses, before anything is sent, an event that franz-go would
// fail on its own while producing the records behind it: one with no
// topic, or one too large for a produce batch of the client
// (kgo.ProducerBatchMaxBytes, 1 MB by default). The error of a too large
// event wraps kerr.MessageTooLarge. A record within the client's limit
// but over the broker's (max.message.bytes) is refused by the broker,
// which fails the rest of its partition in order: Publish reports that.
func (p *Publisher) Check(e outbox.Event) error {
	if e.Topic == "" {
		return fmt.Errorf("kafka: event %s has no topic", e.EventID)
	}
	if p.maxBatch != nil {
		size := eventSize(&e)
		if limit := int(p.maxBatch(e.Topic)); size+recordOverhead > limit {
			return fmt.Errorf("kafka: event %s: %w (%d bytes, batch limit %d)", e.EventID, kerr.MessageTooLarge, size, limit)
		}
	}
	return nil
}

func eventSize(e *outbox.Event) int {
	n := len(e.AggregateID) + len(e.Payload) + len(HeaderEventID) + len(e.EventID) +
		len(HeaderEventType) + len(e.EventType) + len(HeaderAggregateType) + len(e.AggregateType) +
		len(HeaderAggregateSeq) + 20
	for k, v := range e.Headers {
		n += len(k) + len(v)
	}
	return n
}

// Publish produces events and waits for every record's result, or for
// ctx's deadline (the relay's publish deadline), whichever comes first. It
// returns nil when all were written, and otherwise an *outbox.BatchError
// whose Errs[i] is events[i]'s result: each record has its own promise,
// so the mapping does not depend on the order in which partitions answer.
// A record still unanswered when ctx ends is reported failed with ctx's
// error (its outcome is unknown; franz-go fails it at its next retry, or
// delivers it, which the relay's republish turns into a duplicate).
func (p *Publisher) Publish(ctx context.Context, events []outbox.Event) error {
	c := &produceCall{errs: make([]error, len(events)), answered: make([]bool, len(events)),
		left: len(events), done: make(chan struct{})}
	if len(events) == 0 {
		return nil
	}
	for i := range events {
		p.cl.Produce(ctx, record(&events[i]), func(_ *kgo.Record, err error) { c.answer(i, err) })
	}
	if p.flush {
		// A lingering (or manually flushed) client holds the records until
		// something flushes them; ProduceSync would, and so does Flush, for
		// as long as this call waits.
		fctx, cancel := context.WithCancel(ctx)
		flushed := make(chan struct{})
		go func() { defer close(flushed); _ = p.cl.Flush(fctx) }()
		defer func() { cancel(); <-flushed }()
	}
	select {
	case <-c.done:
	case <-ctx.Done():
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true // late answers change nothing from here
	failed := false
	for i, e := range events {
		switch {
		case !c.answered[i]:
			c.errs[i] = fmt.Errorf("kafka: produce %s to %s: no answer by the deadline, outcome unknown: %w", e.EventID, e.Topic, ctx.Err())
		case c.errs[i] != nil:
			c.errs[i] = fmt.Errorf("kafka: produce %s to %s: %w", e.EventID, e.Topic, c.errs[i])
		default:
			continue
		}
		failed = true
	}
	if !failed {
		return nil
	}
	return &outbox.BatchError{Errs: c.errs}
}

// produceCall collects one Publish call's answers by input index.
type produceCall struct {
	mu       sync.Mutex
	errs     []error
	answered []bool
	left     int
	closed   bool
	done     chan struct{}
}

func (c *produceCall) answer(i int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.answered[i] {
		return
	}
	c.answered[i], c.errs[i] = true, err
	if c.left--; c.left == 0 {
		close(c.done)
	}
}

// record is the Kafka record Publisher produces for e: the event's own
// headers, then idem's. A Kafka record may carry a name twice, and
// consumers differ in which one they read (idem's the first, many the
// last), so an event header of a name idem reserves (idem.IsReservedHeader:
// refused at enqueue since, but an older row may hold one) is dropped, and
// idem's come last: whichever a consumer reads, it is idem's.
func record(e *outbox.Event) *kgo.Record {
	h := make([]kgo.RecordHeader, 0, 4+len(e.Headers))
	for _, k := range slices.Sorted(maps.Keys(e.Headers)) {
		if !idem.IsReservedHeader(k) {
			h = append(h, kgo.RecordHeader{Key: k, Value: []byte(e.Headers[k])})
		}
	}
	h = append(h,
		kgo.RecordHeader{Key: HeaderEventID, Value: []byte(e.EventID)},
		kgo.RecordHeader{Key: HeaderEventType, Value: []byte(e.EventType)},
		kgo.RecordHeader{Key: HeaderAggregateType, Value: []byte(e.AggregateType)},
		kgo.RecordHeader{Key: HeaderAggregateSeq, Value: strconv.AppendInt(nil, e.Seq, 10)},
	)
	return &kgo.Record{Topic: e.Topic, Key: []byte(e.AggregateID), Value: e.Payload, Headers: h}
}
