package consume

import "time"

// Kind says what an Event reports.
//
// Every record the Consumer begins (KindBegin) ends in exactly one of
// KindProcessed, KindDuplicate, KindDeadLettered or KindAbandoned, reported
// with the ctx that KindBegin's hook returned: a tracer starts a span on
// KindBegin and ends it there. KindRetried, KindDeadLetterFailed and
// KindStuck happen in between; KindCommitted is about acks, not records.
type Kind string

const (
	// KindBegin: the Consumer takes a record up. The ctx the hook returns
	// becomes the ctx of the record's Prepare and handler calls and of its
	// later events.
	KindBegin Kind = "begin"
	// KindProcessed: the record's transaction (processed_event and the
	// handler's effects) committed; it is not acked yet. Duration runs from
	// KindBegin to the commit; Attempt is the attempt that committed.
	KindProcessed Kind = "processed"
	// KindDuplicate: the event was processed before (processed_event has
	// it); the handler was not called. Duration as for KindProcessed.
	KindDuplicate Kind = "duplicate"
	// KindRetried: an attempt failed (Err) and the record is tried again
	// after Wait. Attempt is the failed attempt. A database failure (not
	// the handler's) is retried too but does not count towards
	// MaxAttempts: Event.Handler tells the two apart.
	KindRetried Kind = "retried"
	// KindDeadLettered: the record went to the dead-letter destination
	// after Attempt handler failures (Err is the last); it is acked next.
	// Stuck is set when it had been stuck before.
	KindDeadLettered Kind = "dead-lettered"
	// KindDeadLetterFailed: one dead-letter attempt (Attempt) failed (Err).
	KindDeadLetterFailed Kind = "dead-letter-failed"
	// KindStuck: Config.DeadLetterAttempts dead-letter attempts failed
	// (Err is the last): the record can be neither processed nor
	// dead-lettered. It holds its stream, and only its stream, and its
	// dead-letter is retried every BackoffMax in the background until it
	// succeeds or the stream is revoked. Emitted once per stuck record; a
	// metric of stuck records is KindStuck minus the KindDeadLettered and
	// KindAbandoned events that have Stuck set. See the package doc for
	// what an operator does about it.
	KindStuck Kind = "stuck"
	// KindAbandoned: a stop or a revocation interrupted the record before
	// it was done. It is redelivered later (to this consumer or another
	// member), which is harmless. Stuck is set for a stuck record.
	KindAbandoned Kind = "abandoned"
	// KindCommitted: an Ack reached the broker (Err nil) or failed.
	// Records is how many messages it covered, Duration its latency.
	KindCommitted Kind = "committed"
)

// Event is what a Consumer's hook receives. It carries ids and figures,
// never a payload.
type Event struct {
	Kind Kind
	// ConsumerID is the Config.ConsumerID of the Consumer.
	ConsumerID string
	// Message is the record (nil for KindCommitted). Its Raw field holds
	// the driver's native message.
	Message *Message
	// Topic, Partition, Offset, EventID and Delivery are the Message's,
	// copied for hooks that only need them (zero for KindCommitted).
	Topic     string
	Partition int32
	Offset    int64
	EventID   string
	Delivery  int
	// Attempt is the handler attempt (KindProcessed, KindRetried,
	// KindDeadLettered: the failures) or the dead-letter attempt
	// (KindDeadLetterFailed, KindStuck), from 1.
	Attempt int
	// Handler is true when Err came from the handler or Prepare, false
	// when it came from the database or the broker (KindRetried).
	Handler bool
	// Records is how many messages an Ack covered (KindCommitted), or the
	// size of the batch a record was processed in (1 without Batch).
	Records int
	// Duration: see each Kind.
	Duration time.Duration
	// Wait is the pause before the next attempt (KindRetried,
	// KindDeadLetterFailed).
	Wait time.Duration
	// Stuck: see KindDeadLettered, KindAbandoned.
	Stuck bool
	// Err is the failure, if the Kind has one.
	Err error
}

func newEvent(k Kind, consumerID string, m *Message) Event {
	e := Event{Kind: k, ConsumerID: consumerID, Message: m, Records: 1}
	if m != nil {
		e.Topic, e.Partition, e.Offset, e.EventID, e.Delivery = m.Topic, m.Partition, m.Offset, m.EventID, m.Delivery
	}
	return e
}
