// Package paysim is a payment-provider simulator that honours
// Idempotency-Key, with reproducible fault injection and an auditable
// ledger, and the typed client of it: Client.Charge, the payment adapter a
// service such as billing calls. `idem paysim` runs it as a process.
//
// Usage:
//
//	srv, _ := paysim.New(nil) // an http.Handler: POST /charges, GET /ledger
//	cl, _ := paysim.NewClient(baseURL, idemClient)
//	res, err := cl.Charge(ctx, paysim.ChargeCommand{IdempotencyKey: key, OrderID: "o-1", AmountKopecks: 1000})
//
// # HTTP contract (docs/contracts.md)
//
//	POST /charges  Idempotency-Key, {"order_id","customer_id","amount_kopecks"} → 201 {"charge_id"}, or 402 CARD_DECLINED
//	GET  /ledger   [?after=&limit=] → {"charges":[{"charge_id","idempotency_key","order_id","customer_id","principal","amount_kopecks","created_at"}…],
//	                  "declines":[{"decline_id","idempotency_key","order_id","customer_id","principal","amount_kopecks","code","created_at"}…],
//	                  "next" (on a page after which more remain)}
//
// and, beyond the contract, GET /healthz and GET /metrics (Prometheus text:
// paysim_charges_total, paysim_declines_total, paysim_replays_total,
// paysim_conflicts_total{code}, paysim_faults_total{kind},
// paysim_rejected_total, paysim_ledger_rows, paysim_ledger_full_total,
// paysim_ledger_keys(_max), paysim_ledger_bytes(_max),
// paysim_connections_open, paysim_connections_refused_total).
//
// POST /charges is validated first, before the idempotency middleware and
// as early as it can be: a missing or invalid key, or a principal over
// MaxPrincipalLength (400 FIELD_TOO_LONG), or a new key on a full ledger
// (507 LEDGER_FULL) is answered from the header alone, before the body is
// read; then the body must be at most 64 KiB (413), one JSON object with
// exactly the contract's members, each once and spelled exactly, valid
// UTF-8 (else 400 MALFORMED_JSON), ids of at most MaxFieldLength bytes
// (400 FIELD_TOO_LONG) without control characters, and a positive amount
// (else 422 INVALID_CHARGE). None of these refusals is stored under the
// key: nothing ran, so a corrected request with the same key is a new
// attempt. A valid charge then runs behind the idempotency package's
// middleware over Config.Store (a MemoryStore by default), scoped by the
// Authorization header value:
// the same key and body replay the first answer with Idempotent-Replayed:
// true; the same key with another body is 409 IDEMPOTENCY_KEY_REUSED; a
// key whose charge is still running is 409 IDEMPOTENCY_KEY_IN_PROGRESS
// with Retry-After. Every error is application/problem+json with a code
// member, and none of them charges.
//
// GET /ledger shows the caller its own principal's entries, whole
// (streamed, never copied whole) or a page (?limit=1..10000&after=next);
// Config.LedgerToken lets an auditor see every principal's.
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
// # Bounds
//
// An anonymous client cannot grow the simulator without bound: the ledger
// remembers at most Config.MaxLedgerEntries keys and Config.MaxLedgerBytes
// of what they hold (the estimate covers the ledger, its indexes, the
// fault counters and the middleware's records; TestLedgerBudgetCoversTheHeap
// holds it to the heap), and a new key beyond that is 507 LEDGER_FULL with
// nothing charged and nothing recorded, never a charge the ledger does not
// show. A key it already holds keeps its answer. Serve bounds the rest,
// with the same server as billing's (internal/httpserver): header,
// whole-request, write and idle timeouts, a header size, and
// Config.MaxConns connections at once (one more is answered 503
// TOO_MANY_CONNECTIONS and closed). Every problem's detail is at most 200
// bytes. Package paysimtest serves it the same way for a test.
//
// # What it does not guarantee
//
// Everything is in memory: a restart forgets the ledger and the keys, and
// nothing but a restart frees room in a full ledger. Keys are remembered by
// the middleware for its retention (24h) and by the ledger for good. A
// principal is whatever Authorization header arrives: paysim
// authenticates nobody, so whoever sends a principal's header value sees
// that principal's ledger; never give it a real credential. It listens on
// loopback unless told otherwise (`idem paysim --addr`).
package paysim
