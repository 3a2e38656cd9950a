// Package chaos is the harness behind `billing chaos` and `billing demo`:
// it runs the reference billing system as real child processes, crashes it
// at random under load, and audits the payment provider's ledger.
//
// Run starts a devkafka broker with a data directory (unless KafkaBrokers is
// given; with Broker BrokerNATS a nats-server -js with a store directory
// instead, billing on BROKER=nats and the broker audit on its JetStream
// streams, natsaudit.go), paysim with faults (charge then drop the answer, fail before
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
// again, as a supervisor would, and counted, and so is one that exits on
// its own once ready (a failpoint's kill).
//
// Failpoints (Config.Failpoints, see failpoints.go) aim kills at the crash
// windows of internal/failpoint: one instance at a time runs with
// IDEM_FAILPOINTS arming a kill at each window still short of its hits;
// the report counts the hits per window from the instances' output and
// names the windows a run missed.
//
// When the load is done it waits until every confirmed order and accepted
// payment is CHARGED or FAILED, then until nothing is in flight (no outbox
// row PENDING or PUBLISHING, no consumer lag in either group, no
// idempotency claim with a live lease), then watches the ledger for longer
// than the longest redelivery timer of the configuration (a change starts
// the wait again), and audits. The audit trusts paysim's ledger, the
// topics and its own driver's records, and nothing billing reports but the
// final statuses it checks:
//
//   - every confirmed order and accepted payment has exactly one ledger
//     charge with its order, customer, amount, billing's provider
//     principal and the key of billing's charge command for it (CHARGED),
//     or none and exactly one of paysim's definitive declines, likewise
//     matched (FAILED): a FAILED without a decline is a transient fault
//     (a 500, a lost answer) that became a failure;
//   - no charge or decline exists without a confirmed order or an
//     accepted payment;
//   - every answer seen for one Idempotency-Key repeats the first: status,
//     allow-listed headers (Content-Type, Content-Language, Location) and
//     bytes; a difference names the first differing byte;
//   - a key reused with another body, each member changed in turn, is
//     refused with IDEMPOTENCY_KEY_REUSED;
//   - all work reached a final status;
//   - every row of billing's outbox table reached its topic at least once
//     (a record with its event-id header), and the first deliveries of each
//     aggregate are in aggregate-sequence order: by offset within a
//     partition, by producer timestamp across topics (equal milliseconds
//     cannot be told apart and pass). The topics are read from the start
//     with a plain client; the outbox table is complete because billing
//     keeps published rows for days. With OutboxMode wal the events come
//     instead from an audit slot the harness creates before billing
//     starts, in commit order (their Seq is their position among their
//     aggregate's events), and every kill aims at the instance whose
//     relay reads billing's slot.
//
// Config.Unsafe switches one protection off (a fresh key per retry in the
// driver; inbox, fingerprint, lease or publish through BILLING_UNSAFE) and
// the audit must then fail: proof that it can. UnsafePublish makes each
// relay lose one event, which the Kafka audit names. An unsafe run that
// passes is reported inconclusive (billing chaos exits 3). The mutation
// test (package mutants) does the same with deliberate bugs in the code.
//
// What it does not prove: the audit sees what the driver was promised and
// what paysim charged. Work billing accepted but whose answer never reached
// the driver (an order created by an attempt whose reply was lost and never
// retried) is invisible to it, except that its charge shows up as an orphan.
// A passing run is evidence for its seed and its schedule, not a proof for
// all interleavings.
package chaos
