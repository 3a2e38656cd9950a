// Package outbox is a transactional outbox: events are written in the
// producer's own database transaction (EnqueueTx) and a Relay publishes
// them in batches to a Publisher (package kafka provides one for franz-go).
//
// Usage:
//
//	// in the business transaction:
//	_, err := outbox.EnqueueTx(ctx, tx, outbox.Message{
//		Topic: "orders.events", AggregateType: "order", AggregateID: id,
//		EventType: "OrderConfirmed", Payload: payload,
//	})
//	// once per process:
//	pub, err := kafka.NewPublisher(client, nil)
//	relay, err := outbox.NewRelay(pool, pub, nil)
//	_ = relay.Start(ctx) // lifecycle stops it
//
// # Guarantee
//
// An event is published if and only if the transaction that enqueued it
// commits, and it is published at least once — with several relays, after
// failed publishes, after crashes and lease expiry. Consumers deduplicate
// by event id (package inbox) to get effectively once.
//
// Order, exactly: the events of one aggregate (AggregateType, AggregateID)
// are numbered 1, 2, 3… in commit order (Event.Seq), and no event of an
// aggregate is handed to a Publisher before every earlier event of that
// aggregate has been delivered — acknowledged by the broker — whatever
// their topics. So on the wire, an aggregate's first deliveries (the first
// copy of each event id) come in sequence order, across all its topics;
// later copies are at-least-once duplicates and may come after later
// events (see Not guaranteed). "Before" across topics means the broker had
// acknowledged seq n before seq n+1 was sent; a consumer reading two topics
// sees that order only as far as its own reading preserves it.
//
// # How
//
// EnqueueTx numbers each aggregate's events (aggregate_seq) from a counter
// row that stays locked until the enqueuing transaction ends, so numbers
// follow commit order with no gaps. A relay claims with FOR UPDATE SKIP
// LOCKED only heads — PENDING events with no unpublished (PENDING,
// PUBLISHING, DEAD) event of their aggregate before them; a DISCARDED one
// counts as done — plus the
// contiguous run behind each head. Holding a head therefore holds its whole
// aggregate: other relays skip it and take other aggregates. The claim is
// status-based, not a high-water mark, so a transaction that commits a
// lower id after a higher one is never skipped: its row simply becomes
// PENDING-and-visible later and is claimed then.
//
// The claim's cost does not follow the events behind a head. It looks for
// heads first among the oldest unpublished, not held rows (by id; the
// window, one to sixteen batches, grown when it falls short and shrunk
// when it does not): when those are of different aggregates, the common
// case, each is its aggregate's head, and the claim is one statement that
// finds, locks and writes them (at-least-once: marks them PUBLISHED in the
// batch's transaction, undoing the mark of what is not delivered before
// the commit; two-phase: moves them to PUBLISHING). The window also makes
// the predecessor check cheap: ids follow sequences within an aggregate
// (both are taken under the counter row lock), so an unpublished
// predecessor that is not held is in the window whenever its successor
// is, and a head is its aggregate's first row there with no earlier event
// of its aggregate among the held rows, DISCARDED ones excepted (probed in
// a small index of held rows, empty while nothing fails). When the
// window's heads fall short (one aggregate's long run, other relays'
// batches, heads in backoff), it goes on by aggregate: an index of the same rows by
// (aggregate type, aggregate id, sequence) gives each aggregate's first
// one in a single descent, and the claim walks the aggregates (a skip
// scan) until its batch has its heads. So an aggregate with 100,000 events
// waiting costs a claim what one event does; the events behind its head
// come in the run. The walk starts after a per-relay cursor (the
// aggregate its last walk ended at) and wraps around, so that aggregates
// take turns and none starves behind a hot one: the oldest events are
// served first, the others in rotation, an order among aggregates that
// the guarantee never promised.
//
// Blocked aggregates: an aggregate whose first unpublished event has
// failed (DEAD, or PENDING in its retry backoff) is blocked, and its later
// events are held, out of the claim's index (outbox_event_claim_idx:
// unpublished rows that are not held), as is a DEAD event. So the events
// waiting behind failures cost a claim nothing: it reads the ready rows,
// the failing heads still in backoff (one per blocked aggregate) and rows
// in flight, never the backlog behind them. Safety does not rest on the
// flag: the claim still checks each candidate's predecessor (in the window
// if it is not held, in the held rows' index if it is), so a wrong held
// flag can delay an event but never reorder one. Liveness rests on
// this: the truth is outbox_aggregate.blocked, changed only while holding
// the aggregate's counter row lock, which EnqueueTx takes too, in a
// statement that follows the lock (so its snapshot includes every event
// committed by an enqueue that read the old flag, and later enqueues wait
// and read the new one, writing their events held while it is set). The
// relay blocks the aggregate in the transaction that records the failure
// (a two-phase relay while the failed row is still under its lease, so no
// other relay can deliver it first; one whose lease was reaped records
// nothing for that row and blocks nothing, the new owner does, and a
// block never holds a row in flight), and releases it when it delivers an
// event that had failed before; Requeue releases a requeued aggregate;
// and the reaper's sweep releases any blocked aggregate with no failed
// event left (a crash between a mark and its release, a row removed by
// hand), within ReapInterval.
//
// Within a batch the relay hands events to the Publisher in waves: each
// wave is one Publish call holding, of every aggregate, the run of its next
// events that go to one topic; the next wave waits for the outcome of the
// one before. A failed event ends its aggregate for the batch: its later
// events are held (not attempted, not counted) until the failed one is
// delivered. Inside one call, one aggregate's events share a topic, and the
// Publisher keeps them in order the way a broker's ordered stream does (see
// Publisher for the exact contract). An aggregate whose events in a batch
// all go to one topic — the common case — is in the first wave whole, so
// such a batch is one call. A Publisher that is also a Checker is asked
// first about every event; a refused event fails without being sent,
// unless an earlier event of its aggregate fails in the batch's calls:
// then it is held like the rest of its aggregate, not counted, so that a
// batch fails at most one event of an aggregate, its first unpublished
// one.
//
// Modes: AtLeastOnce claims, publishes and marks inside one transaction;
// TwoPhase moves the batch PENDING → PUBLISHING under a lease (owner,
// random token, locked_at), publishes with no transaction open and marks
// PUBLISHED with a token-guarded update; a reaper returns leases older than
// LeaseTTL to PENDING, attempts preserved. The claim commits with
// synchronous_commit off (losing it in a database crash equals a reaped
// lease); the mark commits synchronously. No index covers the status or
// lease columns (the claim index's predicate reads published_at and held;
// the two-phase claim clears held, which only changes the rows of a run
// behind a retried failure), so the claim is a HOT
// update where the page has room (the table's fillfactor is 50).
//
// Failures: each event's result is the Publisher's for that event (by
// input index), so a partial failure marks exactly the delivered events.
// A failed event is retried after an exponential backoff with full jitter
// (available_at), attempts counted, and becomes DEAD with its last error
// after MaxAttempts. Until then — and while DEAD, until an operator
// requeues or discards it (Admin) — it holds back the later events of its
// own aggregate only; other aggregates flow.
//
// Operators: Admin lists and shows events and changes a DEAD one, guarded
// by its status (of two concurrent changes of one event, one wins) and
// recorded in the row's audit trail: Requeue returns it to PENDING with
// its attempts reset; Discard gives it the terminal status DISCARDED,
// which the claim counts as done, so the later events of its aggregate
// are published and it never is (the row stays) — once every earlier
// event is done too: an aggregate may have two DEAD events (a two-phase
// batch of both, reaped at the attempt limit), and discarding the second
// leaves the later ones waiting for the first. A DISCARDED event stays
// held whatever releases its aggregate.
//
// Deadlines: each batch runs on
// context.WithTimeout(context.WithoutCancel(ctx), BatchTimeout), the same
// context for the database and the publisher. The publish gets three
// quarters of it; a call that has not returned by then (plus a short
// grace) is given up, its events count a failed attempt, and the last
// quarter records the outcome. A batch therefore ends by its BatchTimeout
// even against a broker that never answers, which is what makes
// LeaseTTL > 2 × BatchTimeout a guarantee rather than a hope.
//
// Shutdown: Stop is checked between batches only, so a SIGTERM never
// interrupts a batch between its publish and its mark; HardStop cancels the
// batch in hand. Relay satisfies lifecycle.Component and
// lifecycle.HardStopper.
//
// Wake-up: the doorbell. A relay LISTENs on a dedicated connection
// (reconnecting with backoff on failure) and polls as a fallback. An
// enqueue sends the NOTIFY only while a relay sleeps: a relay about to
// sleep holds an advisory lock exclusively (armed, on a second dedicated
// connection) after a last claim, and an enqueue tries the same lock
// shared for the rest of its transaction, notifying when the try fails.
// While relays are busy an enqueue sends nothing, and its shared lock,
// held to its commit, keeps relays from arming until its events are
// visible to their last claim ('busy': they poll again within
// milliseconds). A NOTIFY per enqueuing transaction would make PostgreSQL
// serialize those commits server-wide. A relay arms after every batch that
// leaves it nothing to do, one whose deliveries failed included, and a
// relay that stops rings, armed or not, for relays asleep behind its arm.
// Arming, the last claim and the protocol's corners (another relay armed,
// a relay stopping) are in doorbell.go and Relay.loop; TestDoorbell* prove
// that no event waits for the poll interval while the relays' connections
// are up. A cut doorbell connection drops its lock with it, so enqueues
// ring nobody: a relay that sleeps armed watches its connection and wakes
// when it fails, and an arm that fails on a cut connection retries on a
// new one. What the doorbell cannot see costs at most PollInterval: a
// relay that dies without stopping (its process killed) leaves the relays
// asleep behind its arm to their poll.
//
// Observation: RelayConfig.Hook receives a RelayEvent for each batch
// (begin, claimed, published, failed, dead, lease lost, done), for the
// reaper, the purge and the listener: every count an operator needs; the
// Logger only repeats the warnings.
//
// Crash windows are marked for fault injection (internal/failpoint):
// relay-mid-claim (claimed, nothing sent), relay-published (sent, not
// marked) in both modes, and purge-mid-batch in the retention purge.
//
// # Not guaranteed
//
//   - No exactly-once delivery: a crash (or a commit failure) between the
//     publish and the mark republishes the batch; so does a publish that
//     reached the broker but whose answer came after the deadline.
//   - After a lease is reaped during a slow publish (TwoPhase), the slow
//     relay's produce may still land after the new owner's — even after
//     later events of the aggregate. The slow relay's completion is refused
//     by the token guard, so the table stays right, but the wire then holds
//     a late duplicate of an event already delivered in order. Consumers
//     that deduplicate by event id see the order intact; others see a stale
//     repeat. The batch deadline keeps it to a relay paused (not merely
//     slow) for longer than LeaseTTL − BatchTimeout.
//   - A DEAD event blocks its aggregate until an operator requeues or
//     discards it (skipping it silently would break the order; a discard
//     is a gap in aggregate-seq that consumers see). One removed by other
//     means (deleted, or marked PUBLISHED by hand) releases its aggregate
//     at the reaper's next sweep, not at once.
//   - Enqueueing for one aggregate serializes on that aggregate's counter
//     row: keep such transactions short.
//   - No order between different aggregates.
//
// # database/sql
//
// EnqueueSQLTx is EnqueueTx for a *sql.Tx (lib/pq, pgx's stdlib driver,
// an ORM's transaction): the same statement and guarantees. The relay,
// reaper and purges keep their own pgxpool, opened from the same URL
// (docs/databasesql.md).
package outbox
