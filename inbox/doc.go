// Package inbox deduplicates incoming events for a consumer: one row per
// (consumer_id, event_id) in processed_event, written by MarkProcessedTx in
// the handler's own transaction. Package consume runs the whole consumer
// loop on it (with a broker driver such as package kafka's); use inbox
// directly for a consumer of your own.
//
// Usage:
//
//	first, err := inbox.MarkProcessedTx(ctx, tx, "billing", eventID)
//	if err != nil || !first {
//		return err // a duplicate: its effects are already committed
//	}
//	// apply the event's effects through tx; they commit with the mark
//
// # Database seams
//
// A function whose name ends in Tx (MarkProcessedTx, MarkProcessedBatchTx,
// SeenTx) takes a pgx.Tx: it writes or reads inside the caller's
// transaction, and the name is the promise. Seen, Purge and NewPurger take
// a DBTX (Exec, Query, QueryRow: a pool in practice), on which each
// statement commits on its own.
//
// # Guarantee
//
// If every effect of handling an event is written in the same PostgreSQL
// transaction as its MarkProcessedTx call, and the handler skips its work
// when MarkProcessedTx reports a repeat, then each event's effects commit at
// most once per consumer, however often the event is delivered, crashed on
// or raced on by several consumer instances; with a redelivering source
// (Kafka without a committed offset, an outbox relay) that makes it exactly
// once in effect.
//
// # What it does not guarantee
//
//   - Effects outside the transaction (an HTTP call, a Kafka produce) are not
//     covered: a crash after such a call and before the commit repeats it.
//     Enqueue them as outbox rows with an idempotency key derived from the
//     event id instead, and let a worker make the call with that key.
//   - Rows are purged after a retention window (Purge, Purger; the
//     consume and kafka consumers run a Purger of their own by default): a
//     duplicate arriving later than that is processed again.
//   - Seen and SeenTx only read: a false answer can be stale by the time
//     the caller acts on it. MarkProcessedTx alone decides.
//   - The event id must identify the event, not the delivery: use the id
//     the producer assigned (the outbox's event-id header).
//
// # The two SQL forms
//
// FormDoNothing is INSERT … ON CONFLICT DO NOTHING judged by rows affected;
// FormDoUpdate is INSERT … ON CONFLICT DO UPDATE … RETURNING (xmax = 0), the
// form often shown for this pattern because it returns a row either way. Both answer the same (TestFormsAgreeUnderRace). On a repeat,
// DO UPDATE writes a new row version (a dead tuple for vacuum, WAL, and a
// row lock held to the end of the transaction); DO NOTHING reads the
// conflicting row and writes nothing, so a transaction that only found a
// duplicate commits without a WAL flush.
//
// FormDefault is FormDoNothing, by measurement (BenchmarkMarkProcessed: one
// transaction per mark on the local PostgreSQL 15, 2 shared cores,
// go test -bench MarkProcessed -benchtime 3000x ./inbox/):
//
//	form        first delivery   duplicate     heap growth per duplicate
//	do-nothing  0.53 ms          0.19 ms       0 B
//	do-update   0.67 ms          0.56 ms       ~8 B (a dead tuple every few)
//
// First deliveries cost the same (both insert one row); a duplicate costs
// three times less under DO NOTHING and leaves no dead tuple to vacuum and
// no row lock that a concurrent redelivery would queue behind. Duplicates
// are exactly what a restart or rebalance produces in bulk, so that is the
// case to optimise. DO UPDATE stays available for callers that want the
// row back (RETURNING).
//
// The functions ending in SQLTx (MarkProcessedSQLTx, SeenSQLTx) are the
// same statements on a database/sql *sql.Tx.
package inbox
