// Package outbox is a transactional outbox: events are written in the
// producer's own database transaction (EnqueueTx) and a Relay publishes
// them in batches to a Publisher (package kafka provides one for franz-go).
//
// # Guarantee
//
// An event is published if and only if the transaction that enqueued it
// commits; it is published at least once, and the events of one aggregate
// (AggregateType, AggregateID) are first published in enqueue order — with
// several relays, after failed publishes, after crashes and lease expiry.
// Consumers deduplicate by event id (package inbox) to get effectively
// once.
//
// # How
//
// EnqueueTx numbers each aggregate's events (aggregate_seq) from a counter
// row that stays locked until the enqueuing transaction ends, so numbers
// follow commit order with no gaps. A relay claims with FOR UPDATE SKIP
// LOCKED only heads — PENDING events with no unpublished (PENDING,
// PUBLISHING, DEAD) event of their aggregate before them — plus the
// contiguous run behind each head. Holding a head therefore holds its whole
// aggregate: other relays skip it and take other aggregates. The claim is
// status-based, not a high-water mark, so a transaction that commits a
// lower id after a higher one is never skipped: its row simply becomes
// PENDING-and-visible later and is claimed then. The whole batch goes out
// in one Publisher call and is marked in one statement.
//
// Modes: AtLeastOnce claims, publishes and marks inside one transaction;
// TwoPhase moves the batch PENDING → PUBLISHING under a lease (owner,
// random token, locked_at), publishes with no transaction open and marks
// PUBLISHED with a token-guarded update; a reaper returns leases older than
// LeaseTTL to PENDING, attempts preserved. The claim commits with
// synchronous_commit off (losing it in a database crash equals a reaped
// lease); the mark commits synchronously. No index covers the status or
// lease columns, so the claim is a HOT update where the page has room
// (the table's fillfactor is 50).
//
// Failures: a failed event is retried after an exponential backoff
// (available_at), attempts counted, and becomes DEAD with its last error
// after MaxAttempts. Until then — and while DEAD, until Requeue — it holds
// back the later events of its own aggregate only; other aggregates flow.
//
// Shutdown: cancellation is checked between batches only; each batch runs
// on context.WithTimeout(context.WithoutCancel(ctx), BatchTimeout), the
// same context for the database and the publisher, so a SIGTERM never
// interrupts a batch between its publish and its mark.
//
// Wake-up: a trigger NOTIFYs at commit; the relay LISTENs on a dedicated
// connection (reconnecting on failure) and polls as a fallback.
//
// # Not guaranteed
//
//   - No exactly-once delivery: a crash (or a commit failure) between the
//     publish and the mark republishes the batch.
//   - After a lease is reaped during a slow publish (TwoPhase), the slow
//     relay's produce may still land after the new owner's — even after
//     later events of the aggregate. The slow relay's completion is refused
//     by the token guard, so the table stays right, but the wire then holds
//     a late duplicate of an event already delivered in order. Consumers
//     that deduplicate by event id see the order intact; others see a stale
//     repeat. LeaseTTL must exceed 2 × BatchTimeout to make this rare: the
//     slow batch's context expires long before the lease does.
//   - A DEAD event blocks its aggregate until an operator calls Requeue
//     (skipping it would silently break the order).
//   - Enqueueing for one aggregate serializes on that aggregate's counter
//     row: keep such transactions short.
package outbox
