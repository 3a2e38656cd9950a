// Package natsjs adapts idem to NATS JetStream (nats.go's jetstream
// package): an outbox publisher and a consume.Driver on a durable pull
// consumer. It is a Go module of its own, so that a user of idem's core
// never downloads nats.go. Both pass the kits every adapter passes,
// outbox/publishertest and consume/consumertest, against a real
// nats-server -js.
//
// # Subjects and streams
//
// An event goes to the subject topic.<aggregate type>.<aggregate id>
// (Subject; the last two are subject tokens, base64url-encoded behind a
// '~' when they hold anything but letters, digits, '-' and '_'). Each
// topic is one stream, StreamName(topic), capturing topic.*.* — every
// aggregate of the topic and nothing of a longer one: the dead-letter
// topic orders.events.dlq has its own stream, with subjects of one token
// more. StreamConfig returns that stream; create it (billing does on
// start) before publishing or consuming.
//
// # Publisher
//
// Every message carries Nats-Msg-Id = event id, so JetStream's duplicate
// window (StreamConfig.Duplicates, 2 minutes by default) drops a relay's
// re-send of an event it already stored: the broker-side dedup that
// franz-go's idempotent producer gives Kafka for a retried produce, and
// wider (any re-send with the same id within the window, from any relay,
// is dropped). A re-send after the window is stored again and the
// consumers' inbox drops it. Order: a subject (an aggregate) is stored in
// the order its messages were acknowledged, and the Publisher sends an
// aggregate's next event only once the previous one was acknowledged, so
// a failure never lets a later event of its aggregate through.
//
// # Consumer
//
// The driver pulls from a durable consumer per topic (ConsumerConfig.Group
// is its name) with explicit acks, given after the database commit:
//
//   - AckWait (30s) is how long a message in hand stays with this member;
//     the driver renews it every third of AckWait (InProgress) while the
//     message is being processed, retried or held, so a slow handler or
//     Prepare is never redelivered under its feet, and a SIGKILLed member's
//     messages come back after AckWait. Close gives back (Nak) what it
//     holds, so they come back at once;
//   - MaxDeliver is unlimited: JetStream never drops a message the
//     consume.Consumer has not given up on; its MaxAttempts and
//     dead-letter path decide (a dead-letter goes to the same aggregate's
//     subject under the dead-letter topic, whose stream Start checks:
//     ErrDeadLetterTopicMissing when none captures it, unless
//     SkipDeadLetterTopicCheck; a copy over the stream's MaxMsgSize or the
//     server's max_payload is dead-lettered as a reference copy, with no
//     value, dlq-truncated, dlq-size and dlq-source "stream/sequence", and
//     the subject moves on: the original stays in its stream while the
//     stream's limits keep it);
//   - a held subject (a message that can be neither processed nor
//     dead-lettered) is held in the driver: its later messages stay in
//     hand, unacknowledged and renewed, until the holding message is
//     acked. MaxAckPending (1000) bounds them, with everything else in
//     hand: a subject is one aggregate, whose later events are few.
//
// Order is per subject, that is per aggregate: the durable consumer
// delivers in stream order and the consumer processes a subject's
// messages one at a time. Across a crash too: a member SIGKILLed with a
// subject's messages in hand leaves them pending on the durable until
// AckWait, and JetStream hands the later messages of that subject to the
// next member at once (it has no MaxAckPending per subject). The driver
// keeps such a later message back, in hand, until the subject's earlier
// messages are redelivered to it or acknowledged (the durable's ack
// floor passes them), checking the stream by subject (order.go has the
// steps); so the restarted member processes e1 e2 e3 and then e4 e5, not
// e4 e5 e1 e2 e3 (TestOrderAcrossACrash). What stays unordered: two live
// members pulling from one durable get different messages, possibly of
// one aggregate, at once; a message kept back because of one in a live
// member's hand is delivered after AckWait*1.5 + 2*FetchMaxWait without
// waiting further. When the order of one aggregate's events matters
// across live members, run one member per durable (or MaxAckPending 1);
// each event is still processed once either way, by the inbox. The
// check costs nothing while one member receives every sequence above the
// ack floor; otherwise one consumer info per Fetch and a stream message
// get per earlier message of the subject above the floor.
package natsjs
