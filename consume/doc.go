// Package consume is idem's broker-neutral consumer: the loop that takes
// messages from a broker, applies each in a PostgreSQL transaction that
// also records its event id in processed_event (package inbox), and tells
// the broker a message is done only after that transaction committed.
// Retries, dead-lettering and the stop protocol live here once; a Driver
// adapts one client library (package kafka is the franz-go driver) through
// a small Session interface: Fetch, Ack, DeadLetter, Hold, Close.
//
// Usage:
//
//	drv, err := kafka.NewDriver(&kafka.ConsumerConfig{Brokers: brokers, Group: "billing", Topics: topics})
//	c, err := consume.New(pool, drv, func(ctx context.Context, tx pgx.Tx, m *consume.Message) error {
//		return apply(ctx, tx, m.Value) // commits with the message's processed_event row
//	}, &consume.Config{ConsumerID: "billing"})
//	_ = c.Start(ctx) // lifecycle stops it
//
// # Guarantee
//
// Each event's handler effects commit exactly once per Config.ConsumerID,
// through crashes at any point (SIGKILL included), rebalances,
// redeliveries and duplicate publishes with the same event id. The crash
// windows, step by step:
//
//   - before the DB commit: the transaction rolls back, nothing was acked,
//     the message comes back and is handled then;
//   - after the DB commit, before the ack (failpoint consumer-db-committed):
//     the message comes back, MarkProcessedTx finds its row, the handler
//     is not called (KindDuplicate);
//   - after the ack: the message does not come back.
//
// Order: a stream's messages (a Kafka partition) are processed in order,
// one at a time (or one batch at a time); streams are processed in turn on
// one goroutine. A message the handler keeps failing on is dead-lettered
// after MaxAttempts, so it cannot block its stream; messages are
// dead-lettered in stream order.
//
// # A message that can be neither processed nor dead-lettered
//
// A driver that implements DeadLetterChecker (all of idem's) checks at
// Start that its dead-letter topics exist and fails naming them, so a
// missing one is found before the first poison message. When the
// dead-letter itself fails all the same (the topic was deleted since, the
// consumer may not write to it, or the copy is too large and the driver
// cannot send a reference copy instead: idem's drivers do, see below),
// the message is never dropped and never loops silently. After
// the first failed attempt it holds its stream, and only its stream: the
// other streams keep flowing and rebalances are not blocked, because
// later attempts run in the background (DeadLetterAttempts of them with
// backoff, then one every BackoffMax). The hook reports each failed
// attempt (KindDeadLetterFailed) and, once, KindStuck; the log says so at
// error level. The message's ack is not given, so a restart or the next
// owner of the stream gets it again.
//
// What an operator does about a stuck message (the hook's Err says which
// case it is):
//
//   - missing or forbidden dead-letter topic: create it, or grant the
//     consumer write access; the next background attempt succeeds and the
//     stream resumes by itself;
//   - copy too large (a driver without reference copies; idem's drivers,
//     kafka, kafkago and natsjs, dead-letter a reference instead,
//     DeadLetter.ReferenceHeaders, with no value and dlq-truncated, and
//     the stream moves on: the original stays in the source for its
//     retention, where idem dlq show and redrive read it): raise the
//     dead-letter topic's max.message.bytes (and,
//     for a local MESSAGE_TOO_LARGE, the consumer's producer limit,
//     kgo.ProducerBatchMaxBytes in package kafka's ClientOpts) above the
//     message's size plus about 1.5 KiB of dead-letter headers (the error
//     text is cut to DeadLetterErrorMaxBytes);
//   - or, to skip the message for good: stop the group's members and move
//     the group's committed offset past it (kafka-consumer-groups
//     --reset-offsets --to-offset N+1), after saving its content from the
//     source topic.
//
// # Not guaranteed
//
//   - Effects outside the handler's transaction may repeat: use an outbox
//     row instead, or Config.Prepare for a call that carries its own
//     idempotency key (Prepare is at-least-once).
//   - Dead-lettering is at-least-once: a crash between the dead-letter
//     publish and the ack publishes the copy again on redelivery (its
//     event id lets a reader deduplicate).
//   - Duplicates older than the processed_event retention are handled
//     again: the Consumer purges rows older than Config.Retention while it
//     runs (an inbox.Purger; Config.DisablePurge turns it off).
//   - A failure of the transaction itself (not the handler's error) is
//     taken for a database outage and retried until it passes or the
//     consumer stops, without counting towards MaxAttempts, unless it is
//     a refusal PostgreSQL repeats for this message on every attempt: a
//     data exception (SQLSTATE class 22: 22021, an event id that is not
//     valid UTF-8) or a program limit (class 54: 54000, an index entry
//     over the btree limit), which is dead-lettered at once like a
//     Permanent handler error. An event id that processed_event cannot
//     hold (inbox.ValidateEventID) is refused before the database, the
//     same way. A deterministic failure of another class (a deferred
//     constraint at COMMIT, class 23) is still retried until the
//     consumer stops.
//
// # Writing a driver
//
// A Driver must keep the Session contract (see Session): redeliver what
// was not acked, keep a stream's order, hold a stream when told, and make
// a message done on the broker only in Ack. Package consumertest is the
// kit every driver passes, against a real broker. Two shapes of broker
// fit:
//
//   - offset brokers (Kafka through franz-go or kafka-go): Ack commits,
//     per stream, the offset after the last acked message; Hold pauses
//     the partition and rewinds the fetch position to the held message,
//     or, for a client that cannot pause one partition (kafka-go's
//     Reader), keeps the stream's later messages back in the driver;
//   - per-message brokers (NATS JetStream): Ack acknowledges each message
//     (after the DB commit, never before: AckExplicit); Hold may
//     NakWithDelay the message or keep it in progress; Message.Delivery
//     carries the broker's delivery count. The broker's own redelivery
//     limit (MaxDeliver) must not drop a message the Consumer has not
//     given up on: leave it unlimited and let MaxAttempts and the
//     dead-letter path decide, and keep AckWait above the time a fetch
//     takes to process (Ack comes once per fetch).
//
// # database/sql
//
// NewSQL is New for a *sql.DB: the handler (SQLHandler) receives the
// *sql.Tx that commits its inbox mark and its writes, and nothing else;
// the ack follows the commit as with New. Every driver works with both.
package consume
