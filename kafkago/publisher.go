package kafkago

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/outbox"
)

// Writer defaults of NewWriter.
const (
	// WriterBatchSize is NewWriter's BatchSize: the relay's default batch
	// (outbox.BatchSizeDefault), so that a relay call goes out in one
	// WriteMessages. kafka-go allocates a batch of this many messages up
	// front.
	WriterBatchSize = 500
	// WriterBatchBytes is NewWriter's BatchBytes: franz-go's
	// ProducerBatchMaxBytes default, below the broker's default
	// max.message.bytes (1048588), with room for the batch framing.
	WriterBatchBytes = 1_000_012
	// WriterBatchTimeout is NewWriter's BatchTimeout: how long a batch
	// waits for more records. Every record of a call is added before it
	// runs out (kafka-go adds them under the partition's lock), so it only
	// delays the call; kafka-go's default, 1s, would delay every publish
	// by a second.
	WriterBatchTimeout = time.Millisecond
)

// Errors of NewPublisher.
var (
	// ErrNilWriter is a nil *kafka.Writer.
	ErrNilWriter = errors.New("kafkago: writer is nil")
	// ErrUnsafeWriter is a Writer whose settings break the publisher's
	// promises (see NewPublisher); the message names the field.
	ErrUnsafeWriter = errors.New("kafkago: writer settings break the outbox publisher's guarantees")
	// ErrInvalidConfig wraps every configuration error of NewPublisher and
	// NewConsumer.
	ErrInvalidConfig = errors.New("kafkago: invalid config")
)

// NewWriter returns a kafka.Writer set up as Publisher needs it, for
// brokers (host:port each): acks from all in-sync replicas, the aggregate
// id as key with the Java client's partitioner (Murmur2Balancer, as
// franz-go's), per-message topics, synchronous writes, WriterBatchSize,
// WriterBatchBytes and WriterBatchTimeout, and a Transport of its own.
// MaxAttempts stays kafka-go's (10): see the package doc on why a retry
// never reorders a partition. Set TLS, SASL or timeouts on the returned
// Writer (its Transport) before the first publish; the caller closes it
// (Close, then Transport.CloseIdleConnections).
func NewWriter(brokers ...string) *kafka.Writer {
	return &kafka.Writer{
		Addr:         kafka.TCP(brokers...),
		Balancer:     &kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll,
		BatchSize:    WriterBatchSize,
		BatchBytes:   WriterBatchBytes,
		BatchTimeout: WriterBatchTimeout,
		Transport:    &kafka.Transport{},
	}
}

// Publisher is an outbox.Publisher (and outbox.Checker) on a kafka-go
// Writer: one WriteMessages per topic of a call in the common case, record
// key = aggregate id, value = payload, headers event-id, event-type,
// aggregate-type, aggregate-seq and the message's own headers, sorted by
// name (the franz-go publisher's records, header for header).
//
// kafka-go has no idempotent producer: a retried produce may leave a
// duplicate on the topic, which consumers drop by event id. See the
// package doc for what keeps a partition's order.
type Publisher struct {
	w        *kafka.Writer
	maxBytes int
	maxCount int

	mu    sync.Mutex
	topic map[string]chan struct{} // one write at a time per topic
}

var (
	_ outbox.Publisher = (*Publisher)(nil)
	_ outbox.Checker   = (*Publisher)(nil)
)

// NewPublisher returns a publisher over w, which the caller owns and
// closes. w must keep what the guarantees rest on, and NewPublisher
// returns ErrUnsafeWriter naming the first field that does not:
//
//   - Topic empty (each record names its topic);
//   - Async false (a write's outcome is what Publish reports);
//   - RequiredAcks kafka.RequireAll (a record is delivered once every
//     in-sync replica has it);
//   - Balancer hashing the key (Murmur2Balancer, Hash, ReferenceHash or
//     CRC32Balancer; kafka-go's nil default is round robin, which scatters
//     an aggregate over partitions).
//
// A call larger than w's BatchSize or BatchBytes is sent as several
// WriteMessages, one after the other (see Publish). NewWriter makes such a
// Writer.
func NewPublisher(w *kafka.Writer) (*Publisher, error) {
	if w == nil {
		return nil, ErrNilWriter
	}
	unsafe := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrUnsafeWriter}, a...)...)
	}
	switch {
	case w.Topic != "":
		return nil, unsafe("Topic is %q: leave it empty, each event names its topic", w.Topic)
	case w.Async:
		return nil, unsafe("Async is set")
	case w.RequiredAcks != kafka.RequireAll:
		return nil, unsafe("RequiredAcks is %v, want kafka.RequireAll", w.RequiredAcks)
	case !keyed(w.Balancer):
		return nil, unsafe("Balancer %T does not hash the key (use kafka.Murmur2Balancer)", w.Balancer)
	}
	p := &Publisher{w: w, maxBytes: int(w.BatchBytes), maxCount: w.BatchSize, topic: map[string]chan struct{}{}}
	// kafka-go's own defaults for zero values.
	if p.maxBytes <= 0 {
		p.maxBytes = 1 << 20
	}
	if p.maxCount <= 0 {
		p.maxCount = 100
	}
	return p, nil
}

func keyed(b kafka.Balancer) bool {
	switch b.(type) {
	case *kafka.Murmur2Balancer, kafka.Murmur2Balancer, *kafka.Hash,
		*kafka.ReferenceHash, *kafka.CRC32Balancer, kafka.CRC32Balancer:
		return true
	}
	return false
}

// recordOverhead bounds what kafka-go counts for a record beyond its key,
// value and headers' bytes (its totalSize), with room to spare: a chunk
// the Publisher sizes never overflows the Writer's BatchBytes, which would
// make kafka-go split it.
const recordOverhead = 512

// Check refuses, before anything is sent, an event with no topic, and one
// larger than the Writer's BatchBytes: kafka-go would fail the whole
// WriteMessages it is in. The error of a too large event wraps
// kafka.MessageSizeTooLarge.
func (p *Publisher) Check(e outbox.Event) error {
	if e.Topic == "" {
		return fmt.Errorf("kafkago: event %s has no topic", e.EventID)
	}
	if size := eventSize(&e); size > p.maxBytes {
		return fmt.Errorf("kafkago: event %s: %w (%d bytes, Writer.BatchBytes %d)", e.EventID, kafka.MessageSizeTooLarge, size, p.maxBytes)
	}
	return nil
}

func eventSize(e *outbox.Event) int {
	n := recordOverhead + len(e.AggregateID) + len(e.Payload) + len(idem.HeaderEventID) + len(e.EventID) +
		len(idem.HeaderEventType) + len(e.EventType) + len(idem.HeaderAggregateType) + len(e.AggregateType) +
		len(idem.HeaderAggregateSeq) + 20
	for k, v := range e.Headers {
		n += len(k) + len(v) + 8
	}
	return n
}

// lock takes topic's turn, or gives up when ctx ends.
func (p *Publisher) lock(ctx context.Context, topic string) (unlock func(), err error) {
	p.mu.Lock()
	turn := p.topic[topic]
	if turn == nil {
		turn = make(chan struct{}, 1)
		p.topic[topic] = turn
	}
	p.mu.Unlock()
	select {
	case turn <- struct{}{}:
		return func() { <-turn }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Publish writes events and waits for every record's result, or for ctx's
// deadline (the relay's publish deadline). It returns nil when all were
// written, and otherwise an *outbox.BatchError with Errs[i] the result of
// events[i]. A write still unanswered when ctx ends is reported failed
// with ctx's error: its outcome is unknown (kafka-go goes on retrying the
// batch in the background, and may deliver it, which the relay's
// republish turns into a duplicate).
func (p *Publisher) Publish(ctx context.Context, events []outbox.Event) error {
	if len(events) == 0 {
		return nil
	}
	errs := make([]error, len(events))
	var topics []string
	byTopic := map[string][]int{}
	for i := range events {
		t := events[i].Topic
		if _, ok := byTopic[t]; !ok {
			topics = append(topics, t)
		}
		byTopic[t] = append(byTopic[t], i)
	}
	if len(topics) == 1 {
		p.publishTopic(ctx, events, byTopic[topics[0]], errs)
	} else {
		// Side by side: a topic whose metadata fails (missing) or whose
		// partitions stall must not hold back the others' results.
		var wg sync.WaitGroup
		for _, t := range topics {
			wg.Go(func() { p.publishTopic(ctx, events, byTopic[t], errs) })
		}
		wg.Wait()
	}
	for _, err := range errs {
		if err != nil {
			return &outbox.BatchError{Errs: errs}
		}
	}
	return nil
}

// publishTopic writes the events at idx (one topic, in call order) in
// chunks within the Writer's BatchSize and BatchBytes, one WriteMessages
// each, one after the other. Why the chunks, step by step:
//
//  1. kafka-go splits a partition's records into several produce requests
//     when they exceed BatchSize or BatchBytes, and a later request may
//     succeed after an earlier one failed for good: an aggregate's later
//     event would be delivered before its failed earlier one;
//  2. a chunk within both limits lands in one batch per partition, written
//     whole or refused whole, provided no other write shares the batch:
//     kafka-go adds concurrent writes to a partition's open batch, so
//     writes to one topic take turns (the topic lock);
//  3. an aggregate whose event failed in a chunk has its later events
//     held back (failed too), so a later chunk cannot deliver them first.
//
// Each goroutine writes only its own indexes of errs.
func (p *Publisher) publishTopic(ctx context.Context, events []outbox.Event, idx []int, errs []error) {
	unlock, err := p.lock(ctx, events[idx[0]].Topic)
	if err != nil {
		for _, i := range idx {
			errs[i] = fmt.Errorf("kafkago: write %s to %s: another write to the topic held it past the deadline, not sent: %w", events[i].EventID, events[i].Topic, err)
		}
		return
	}
	defer unlock()
	type agg struct{ typ, id string }
	failed := map[agg]error{}
	for len(idx) > 0 {
		var chunk []int
		size := 0
		for len(idx) > 0 {
			i := idx[0]
			e := &events[i]
			if err, ok := failed[agg{e.AggregateType, e.AggregateID}]; ok {
				errs[i] = fmt.Errorf("kafkago: %s held back: an earlier event of its aggregate failed: %w", e.EventID, err)
				idx = idx[1:]
				continue
			}
			n := eventSize(e)
			if len(chunk) > 0 && (size+n > p.maxBytes || len(chunk) == p.maxCount) {
				break
			}
			chunk, size, idx = append(chunk, i), size+n, idx[1:]
		}
		if len(chunk) == 0 {
			continue
		}
		msgs := make([]kafka.Message, len(chunk))
		for k, i := range chunk {
			msgs[k] = message(&events[i])
		}
		err := p.w.WriteMessages(ctx, msgs...)
		var werrs kafka.WriteErrors
		for k, i := range chunk {
			e := &events[i]
			var ei error
			switch {
			case err == nil:
				continue
			case errors.As(err, &werrs) && len(werrs) == len(chunk):
				if ei = werrs[k]; ei == nil {
					continue
				}
			case ctx.Err() != nil && errors.Is(err, ctx.Err()):
				ei = fmt.Errorf("no answer by the deadline, outcome unknown: %w", err)
			default:
				ei = err
			}
			errs[i] = fmt.Errorf("kafkago: write %s to %s: %w", e.EventID, e.Topic, ei)
			failed[agg{e.AggregateType, e.AggregateID}] = ei
		}
		if ctx.Err() != nil {
			for _, i := range idx {
				errs[i] = fmt.Errorf("kafkago: write %s to %s: not sent by the deadline: %w", events[i].EventID, events[i].Topic, ctx.Err())
			}
			return
		}
	}
}

// message is the Kafka record Publisher writes for e: the franz-go
// publisher's record, the event's own headers without any name idem
// reserves (idem.IsReservedHeader), then idem's, so that idem's is the
// only value of its name whichever one a consumer reads.
func message(e *outbox.Event) kafka.Message {
	h := make([]kafka.Header, 0, 4+len(e.Headers))
	for _, k := range slices.Sorted(maps.Keys(e.Headers)) {
		if !idem.IsReservedHeader(k) {
			h = append(h, kafka.Header{Key: k, Value: []byte(e.Headers[k])})
		}
	}
	h = append(h,
		kafka.Header{Key: idem.HeaderEventID, Value: []byte(e.EventID)},
		kafka.Header{Key: idem.HeaderEventType, Value: []byte(e.EventType)},
		kafka.Header{Key: idem.HeaderAggregateType, Value: []byte(e.AggregateType)},
		kafka.Header{Key: idem.HeaderAggregateSeq, Value: strconv.AppendInt(nil, e.Seq, 10)},
	)
	return kafka.Message{Topic: e.Topic, Key: []byte(e.AggregateID), Value: e.Payload, Headers: h}
}
