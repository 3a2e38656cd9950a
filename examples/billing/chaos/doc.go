// Package chaos is the harness behind `billing chaos` and `billing demo`:
// it runs the reference billing system as real child processes, crashes it
// at random under load, and audits the payment provider's ledger.
//
// Run starts a devkafka broker with a data directory (unless KafkaBrokers is
// given), paysim with faults (charge then drop the answer, fail before
// charging) and Config.Instances `billing serve` processes on one database.
// A load driver creates and confirms orders and creates payments, retrying
// every POST with the same Idempotency-Key on timeouts, 5xx and 409
// IDEMPOTENCY_KEY_IN_PROGRESS on another live instance, throwing away some
// answers as if lost on the network, and sending some POSTs twice at once.
// Meanwhile, at seeded random moments, billing instances are SIGKILLed or
// SIGTERMed and restarted and the broker restarted, and, below the
// processes:
//
//   - ProduceFailRate: devkafka answers that share of produce
//     partition-requests with a non-retriable error, so that a relay batch
//     spanning partitions partly fails;
//   - PGRestarts: billing runs on a throwaway PostgreSQL cluster of its own
//     (internal/pgtemp), crashed with pg_ctl stop -m immediate and
//     restarted; paysim, the ground truth, stays on DatabaseURL;
//   - NetCuts: billing reaches PostgreSQL and Kafka through TCP fault
//     proxies (internal/faultproxy) that reset every open connection at
//     once, every other time after a stall. devkafka advertises its proxy in
//     metadata, so no client connection bypasses it.
//
// Instance faults and infrastructure faults run in two lanes side by side;
// an instance that fails to start while the database is down is started
// again, as a supervisor would, and counted. When the load is done it waits
// until every confirmed order and accepted payment is CHARGED or FAILED, the
// ledger is still and the outbox has nothing PENDING or PUBLISHING, then
// audits:
//
//   - every confirmed order and accepted payment has exactly one ledger
//     charge with its amount (CHARGED) or none (FAILED);
//   - no charge exists without a confirmed order or an accepted payment;
//   - every answer seen for one Idempotency-Key is byte-identical;
//   - all work reached a final status;
//   - every row of billing's outbox table reached its topic at least once
//     (a record with its event-id header), and the first deliveries of each
//     aggregate are in aggregate-sequence order: by offset within a
//     partition, by producer timestamp across topics (equal milliseconds
//     cannot be told apart and pass). The topics are read from the start
//     with a plain client; the outbox table is complete because billing
//     keeps published rows for days.
//
// Config.Unsafe switches one protection off (a fresh key per retry in the
// driver; inbox, fingerprint, lease or publish through BILLING_UNSAFE) and
// the audit must then fail: proof that it can. UnsafePublish makes each
// relay lose one event, which the Kafka audit names.
//
// What it does not prove: the audit sees what the driver was promised and
// what paysim charged. Work billing accepted but whose answer never reached
// the driver (an order created by an attempt whose reply was lost and never
// retried) is invisible to it, except that its charge shows up as an orphan.
// A passing run is evidence for its seed and its schedule, not a proof for
// all interleavings.
package chaos
