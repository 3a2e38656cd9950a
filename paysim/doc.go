// Package paysim is a payment-provider simulator that honours
// Idempotency-Key, with reproducible fault injection and an auditable
// ledger, and the typed client of it: Client.Charge, the payment adapter a
// service such as billing calls. `idem paysim` runs it as a process.
//
// # HTTP contract (docs/contracts.md)
//
//	POST /charges  Idempotency-Key, {"order_id","customer_id","amount_kopecks"} → 201 {"charge_id"}, or 402 CARD_DECLINED
//	GET  /ledger   → {"charges":[{"charge_id","idempotency_key","order_id","customer_id","principal","amount_kopecks","created_at"}…],
//	                  "declines":[{"decline_id","idempotency_key","order_id","customer_id","principal","amount_kopecks","code","created_at"}…]}
//
// and, beyond the contract, GET /healthz and GET /metrics (Prometheus text:
// paysim_charges_total, paysim_declines_total, paysim_replays_total,
// paysim_conflicts_total{code}, paysim_faults_total{kind},
// paysim_rejected_total, paysim_ledger_rows).
//
// POST /charges runs behind the idempotency package's middleware over a
// MemoryStore, scoped by the Authorization header value: the same key and
// body replay the first answer with Idempotent-Replayed: true; the same key
// with another body is 409 IDEMPOTENCY_KEY_REUSED; a key whose charge is
// still running is 409 IDEMPOTENCY_KEY_IN_PROGRESS with Retry-After; no key
// is 400 IDEMPOTENCY_KEY_REQUIRED. Malformed JSON is 400 MALFORMED_JSON, a
// missing field or an amount ≤ 0 is 422 INVALID_CHARGE. Every error is
// application/problem+json with a code member, and none of them charges.
//
// # Guarantee
//
// One idempotency key of one principal (the Authorization header, as in
// the middleware's scope) has at most one ledger entry, a charge or a
// decline, under any concurrency and whatever the layer in front of the
// ledger does: the ledger's unique index and its entries change together
// under one mutex, and a write for a known key returns the existing entry
// (or ErrLedgerConflict for a different order, customer or amount, without
// a new one). A declined key is never charged, and a charged key never
// declined. Two rows for one order with different keys are possible, and
// are what Audit reports: the double charges of a client that makes a
// fresh key per attempt.
//
// # Declines and faults
//
// Config.DeclineRate declines a share of keys for good: 402 CARD_DECLINED,
// a decline in the ledger, nothing charged. The decision depends on
// Config.Seed and the key only, not on the arrival, so every attempt with
// the key gets it (the middleware also stores and replays the first 402):
// an auditor can match every failure a client recorded to a decline here.
//
// The faults are not answers. Config.FailRate answers 500 PROVIDER_FAULT
// before charging (the middleware releases the key, so a retry charges
// afresh). Config.DropRate lets the charge and the stored answer happen,
// then closes the connection without a response (http.Hijacker); a
// replayed 201 can be dropped too, as a network would. Config.Latency
// delays every charge after its key is claimed. A fault is a function of
// Config.Seed, the key and how many times the key has arrived, so a run is
// reproducible however requests interleave.
//
// # What it does not guarantee
//
// Everything is in memory: a restart forgets the ledger and the keys.
// Keys are remembered for the middleware's retention (24h). A principal is
// whatever Authorization header arrives: paysim authenticates nobody, and
// GET /ledger shows the principal, so never give it a real credential.
package paysim
