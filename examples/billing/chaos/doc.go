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
// SIGTERMed and restarted and the broker restarted. When the load is done it
// waits until every confirmed order and accepted payment is CHARGED or
// FAILED and the ledger is still, then audits:
//
//   - every confirmed order and accepted payment has exactly one ledger
//     charge with its amount (CHARGED) or none (FAILED);
//   - no charge exists without a confirmed order or an accepted payment;
//   - every answer seen for one Idempotency-Key is byte-identical;
//   - all work reached a final status.
//
// Config.Unsafe switches one protection off (a fresh key per retry in the
// driver; inbox, fingerprint or lease through BILLING_UNSAFE) and the audit
// must then fail: proof that it can.
//
// What it does not prove: the audit sees what the driver was promised and
// what paysim charged. Work billing accepted but whose answer never reached
// the driver (an order created by an attempt whose reply was lost and never
// retried) is invisible to it, except that its charge shows up as an orphan.
// A passing run is evidence for its seed and its schedule, not a proof for
// all interleavings.
package chaos
