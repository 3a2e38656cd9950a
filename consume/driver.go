package consume

import (
	"context"
	"time"
)

// Driver connects a Consumer to one broker client library. A Consumer calls
// Open once per run (each Start after a stop is a fresh run, with a fresh
// session), so a Driver holds configuration, not connections.
type Driver interface {
	// Open connects for one run: builds the client, joins the consumer
	// group or binds the durable consumer. It must not wait for the broker
	// to answer (an unreachable broker shows in Fetch, not in Start). ctx
	// bounds Open only and lends its values to the session.
	Open(ctx context.Context) (Session, error)
}

// DeadLetterChecker is a Driver that can tell, before its first session,
// whether the dead-letter destinations it would publish to exist (Kafka
// topics, JetStream streams). Consumer.Start calls CheckDeadLetter before
// Open and returns its error, so that a missing destination is found at
// start, not when the first poison message arrives. A driver whose
// broker cannot be asked (down, unreachable) logs that and returns nil:
// an unreachable broker shows in Fetch, as Open's contract says. Every
// idem driver implements it, with a config field to turn it off
// (SkipDeadLetterTopicCheck) for brokers that create topics on first use.
type DeadLetterChecker interface {
	CheckDeadLetter(ctx context.Context) error
}

// Session is one run's connection to the broker. The Consumer calls Fetch,
// Ack, Hold and Close from one goroutine, in that order of a run's life;
// DeadLetter may run concurrently with them (a stuck record's retries run
// in the background), so it must be safe for that.
//
// The contract every driver keeps, tested by package consumertest:
//
//   - Redelivery: a message that was fetched and not acknowledged (Ack)
//     is delivered again, in a later session or (after Hold) later in
//     this one. Nothing is lost because the Consumer dropped it.
//   - Order: messages of one Stream are fetched in the broker's order, and
//     a message whose stream is held is not delivered until the hold ends.
//   - Ack only what the Consumer acknowledged: the broker learns that a
//     message is done (an offset commit, a per-message ack) only from Ack.
type Session interface {
	// Fetch waits for the next messages, or until ctx ends (then it
	// returns ctx's error, or a Fetch with what it has). ctx ends on a
	// stop and whenever the Consumer wants its loop back (a stuck record's
	// retry is due), so an ended ctx is routine, not a failure. Any other
	// error is logged and Fetch is called again after a backoff.
	//
	// Fetch is also where an offset-committing driver lets a rebalance
	// happen: between two Fetch calls the Consumer is processing what the
	// previous one returned, and a revocation must wait (franz-go's
	// BlockRebalanceOnPoll) or be reported (Fetch.Revoked).
	Fetch(ctx context.Context) (Fetch, error)

	// Ack makes msgs done on the broker: a per-message acknowledgement
	// (JetStream's Ack) or an offset commit past each stream's last
	// message (Kafka). The Consumer calls it only after the database
	// transaction of each message committed (or the message was
	// dead-lettered), for the messages finished since the last Ack, in
	// stream order and without gaps: every earlier message of the same
	// stream fetched in this session was acked before or is in msgs.
	//
	// Acking a held message (see Hold) ends the hold: its stream is
	// delivered again from the message after it. An Ack error is reported
	// and not retried by the Consumer: an unacked message is redelivered
	// and skipped as a duplicate, so a lost ack costs a re-read, never a
	// second effect. A driver may retry failed commits itself.
	Ack(ctx context.Context, msgs []*Message) error

	// DeadLetter publishes a copy of m with dl's details (a dead-letter
	// topic or subject) and returns once the broker has it. It does not
	// acknowledge m: the Consumer acks m after DeadLetter returned nil.
	// ctx bounds the call (Config.DeadLetterTimeout); give up when it
	// ends. A message too large for the dead-letter destination, a missing
	// or forbidden destination are errors like any other: the Consumer
	// retries a bounded number of times and then holds the message (see
	// Hold), it never drops it.
	DeadLetter(ctx context.Context, m *Message, dl DeadLetter) error

	// Hold tells the driver that m is not done and that no later message of
	// m.Stream may be processed before it: m could be neither processed
	// nor dead-lettered and the Consumer keeps it for a later retry, or m
	// came after such a message. The driver must deliver m (if the
	// Consumer does not ack it meanwhile) and everything after it on its
	// stream again once the hold ends, and should stop delivering the
	// stream until then. An offset driver pauses the partition and rewinds
	// its fetch position to m (franz-go: PauseFetchPartitions and
	// SetOffsets); a per-message driver may let the broker redeliver m
	// later (JetStream: NakWithDelay), or keep it in progress.
	//
	// The hold ends when the Consumer acks the first held message of the
	// stream, or when the stream is revoked (Fetch.Revoked).
	Hold(ctx context.Context, m *Message) error

	// Close ends the session: leave the group, release the client. The
	// messages fetched and not acked are redelivered later (to this
	// consumer's next run or to another member). ctx bounds it
	// (Config.AckTimeout).
	Close(ctx context.Context) error
}

// Fetch is what one Session.Fetch returns.
type Fetch struct {
	// Messages are the fetched messages, in stream order within each
	// stream. The Consumer processes the streams in the order of their
	// first message.
	Messages []*Message
	// Revoked names the streams this session no longer owns since the last
	// Fetch (a rebalance took them, or they were lost). The Consumer drops
	// what it keeps about them (a stuck record): their next owner gets
	// their unacked messages.
	Revoked []string
}

// Message is one broker message as the Consumer sees it. A driver fills
// every field it can; the Consumer reads Stream, EventID and (for its
// hooks and logs) Topic, Partition, Offset and Delivery, and passes the
// rest to the handler untouched.
type Message struct {
	// Stream names the unit of order: a stream's messages are processed
	// one at a time, in order, and a stuck message holds its stream only.
	// Kafka: "topic/partition". A per-message broker may use the subject
	// (order per subject) or a unique value per message (no order).
	Stream string
	// Topic, Partition and Offset say where the message came from
	// (Kafka's own; JetStream: subject, 0, stream sequence).
	Topic     string
	Partition int32
	Offset    int64
	// Key, Value and Headers are the message's content.
	Key     []byte
	Value   []byte
	Headers []Header
	// EventID is the message's dedup key in processed_event: the
	// producer's event id (the outbox's event-id header). Empty means the
	// message cannot be deduplicated: it is dead-lettered.
	EventID string
	// Delivery is the broker's count of this message's deliveries, 1 for
	// the first (JetStream's NumDelivered); 0 when the broker does not
	// count (Kafka). It is reported in events; the Consumer's own retry
	// count is Event.Attempt.
	Delivery int
	// Time is the broker's timestamp of the message, if it has one.
	Time time.Time
	// Raw is the driver's own message (*kgo.Record for package kafka), for
	// adapters that hand their handlers the native type.
	Raw any
}

// Header is one message header.
type Header struct {
	Key   string
	Value []byte
}

// DeadLetter is what the Consumer tells Session.DeadLetter about a message
// it gave up on.
type DeadLetter struct {
	// Error is the last failure's text, cut to DeadLetterErrorMaxBytes so
	// that the copy of a large message stays as close to its size as
	// possible.
	Error string
	// Attempts is how many times the handler (or Prepare) failed.
	Attempts int
	// ConsumerID is the Consumer that gave up.
	ConsumerID string
}

// DeadLetterErrorMaxBytes bounds DeadLetter.Error. Longer error texts are
// cut at a UTF-8 boundary and end in "…".
const DeadLetterErrorMaxBytes = 1024
