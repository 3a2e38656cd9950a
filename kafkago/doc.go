// Package kafkago adapts idem to Kafka through segmentio/kafka-go, the
// client of the source service this toolkit grew from: an outbox publisher
// on kafka.Writer and a consume.Driver on kafka.Reader's FetchMessage and
// CommitMessages. It is a Go module of its own, so that a user of idem's
// core (or of its franz-go adapter, package kafka) never downloads
// kafka-go. Both pass the kits every adapter passes: outbox/publishertest
// and consume/consumertest, against kfake over TCP.
//
// # Publisher: what kafka-go gives and what it does not
//
// kafka-go has no idempotent producer. A produce request whose answer is
// lost (a cut connection, a broker restart, a timeout after the broker
// wrote) is retried by the Writer, and the broker then holds the records
// twice. franz-go's idempotent producer (package kafka) lets the broker
// drop such a retry; with kafka-go the duplicate reaches the topic, and the
// consumer's inbox (processed_event, by event id) absorbs it. Nothing is
// lost and no effect repeats, but a topic read by something other than an
// idem consumer sees the copy (each copy carries the same event-id header).
//
// Order within a partition holds under retries, because of how kafka-go's
// Writer is built, which this package relies on:
//
//   - one goroutine per partition writes that partition's batches one at a
//     time and retries a failed batch in place (MaxAttempts, with backoff)
//     before the next: a retry never overtakes a later batch, whatever
//     MaxAttempts is (there is one batch in flight per partition);
//   - the records a call sends to one partition go into one batch, one
//     produce request, which the broker appends or refuses whole, as long
//     as they fit the Writer's BatchSize and BatchBytes and no other write
//     shares the batch. The Publisher sees to both: it sends a larger call
//     as several WriteMessages, one after the other, holding back the later
//     events of an aggregate whose earlier event failed, and it writes to
//     one topic one call at a time (kafka-go adds concurrent writes to a
//     partition's open batch, and would split them when it overflows);
//   - the key is the aggregate id and the balancer Murmur2Balancer, the
//     Java client's and franz-go's partitioner: an aggregate lands in one
//     partition, the same one whichever of the two clients produced it.
//
// What the broker keeps is then each aggregate's events in order, counting
// the first copy of each event; a duplicate may come later. When a batch
// runs out of MaxAttempts its events fail, the relay records a failed
// attempt and retries them later, after the batches behind them on the
// partition went out: those hold other aggregates' events only (the relay
// never hands over an aggregate's next event before its previous one was
// delivered). A call that returned at its deadline leaves its batch
// retrying in the background; the relay's republish queues behind it on
// the same partition goroutine, so the first copy still comes first.
//
// NewWriter's BatchTimeout is 1ms, not kafka-go's 1s, which would delay
// every publish by a second.
//
// One WriteMessages per topic of a call, side by side: kafka-go fails a
// whole WriteMessages when a topic's metadata fails (a missing topic), so a
// call spanning topics is split by topic, and a missing topic fails only
// its events.
//
// # Consumer
//
// The driver keeps package consume's contract on a group Reader with
// synchronous commits (CommitInterval 0): Ack commits the offsets of the
// acked messages after the database commit. kafka-go's Reader cannot pause
// one partition or rewind it, so a held partition (a message that can be
// neither processed nor dead-lettered) is held in the driver: the
// partition's later messages are kept back, up to
// ConsumerConfig.MaxHeldMessages, and handed over once the hold ends; past
// that bound they are dropped, and when the hold ends the session
// reconnects its Reader, which resumes the partitions at their committed
// offsets. kafka-go's Reader does not report rebalances: a held partition
// that moves to another member stays held in this session until its
// dead-letter succeeds or the session ends; its new owner starts from the
// committed offset.
//
// Nor does the Reader fence its commits: it commits with its current
// generation whatever partitions the messages are from, and Kafka accepts
// from a member of the current generation an offset for any partition. A
// member that fetched a partition's messages before a rebalance and acked
// them after it, when the partition had a new owner, used to set the
// group's offset back below the new owner's; past the partition's end the
// new owner never committed it again, and the group stayed behind for good
// (seen in the chaos matrix as a not-idle stall, "billing-charger 3 behind
// on billing.commands"). Ack therefore commits only the partitions of the
// Reader's current generation (which the Reader tells in its progress log,
// which the driver reads for that), from the offset the generation started
// at; it gives up a commit still waiting when the generation ends. What it
// does not commit, the partition's owner in the next generation delivers
// again from the committed offset, and the inbox finds it processed. The
// log lines it reads are kafka-go v0.4's (the version this module
// requires); with a kafka-go whose lines it cannot read, the check stands
// aside and every ack is committed, as the Reader alone would.
//
// Dead letters go to DeadLetterTopic (else topic + ".dlq"), with the
// headers every driver writes (consume.DeadLetter.CopyHeaders). Start
// checks that each dead-letter topic exists, by a metadata request that
// never creates one, and fails with ErrDeadLetterTopicMissing naming it
// (SkipDeadLetterTopicCheck turns that off, for a broker that creates
// topics on first use). A copy too large for DeadLetterMaxBytes or the
// topic's max.message.bytes is dead-lettered as a reference copy, as
// package kafka does: no value, the event headers, dlq-truncated and
// dlq-size; the partition moves on and the original stays at dlq-source
// (topic/partition/offset) for the source topic's retention, where idem
// dlq show and redrive read it.
package kafkago
