// Package billing is the reference service of idem: a billing system that
// confirms orders and charges them through a payment provider, laid out as
// a hexagonal service (domain, use cases, adapters in and out) and built
// only on idem's public packages.
//
//	domain/              orders, payments, their states and rules
//	usecase/             the operations, written against ports (interfaces)
//	adapters/in/httpapi/ the HTTP API: bearer principals, idempotency middleware
//	                     in transactional mode, problem+json, /metrics
//	adapters/out/postgres/ the repository (sqlc) and billing's own migrations
//	adapters/out/payment/  the payment provider through idemclient (paysim)
//	consumer/            orders.events → ChargeRequested (inbox + outbox), and
//	                     the charge worker on billing.commands
//	scheduler/           outbox relay and reaper, retention purges
//	app/                 wiring, roles and the ordered shutdown (lifecycle)
//
// The flow and the shutdown order are in docs/architecture.md, the HTTP
// contract in docs/contracts.md.
//
// # What it guarantees
//
// Every step is either one database transaction or an external call with a
// key fixed before the first attempt, so a process stopped at any point —
// SIGTERM, SIGKILL, a hard stop at the end of a shutdown budget — leaves
// nothing half-done: a client retry with the same Idempotency-Key, a Kafka
// redelivery or the outbox relay finishes it, and the provider is never
// charged twice for one order confirmation or one payment:
//
//   - POST: the idempotency claim, the business rows and the outbox events
//     commit in one transaction (transactional mode), or none of them does;
//   - orders.events consumer: processed_event and the ChargeRequested outbox
//     row commit together; the key (event id + ":billing") is fixed there;
//   - charge worker: the provider call carries that key on every attempt,
//     outside any transaction; the outcome and processed_event commit
//     together; the offset is committed only after.
//
// # Switching a protection off
//
// BILLING_UNSAFE (app.Config.Unsafe) switches one protection off, for
// `billing chaos --unsafe=LAYER` to prove that its audit catches what
// follows; billing logs a loud warning at start. inbox: the consumers see
// every delivery as new and derive the charge key per delivery (both are
// needed: with the event's key the provider would answer the repeat from
// its own store), so a redelivery after a SIGKILL charges again.
// fingerprint: the request body is left out of the fingerprint, so a key
// reused with another amount replays the first answer. lease: POSTs run as
// two-step claims with a zero lease, their writes in their own transaction,
// so a duplicate sent while the first runs executes again (transactional
// mode has no lease to shorten: its lock and its one commit are the
// protection).
//
// # What it does not guarantee
//
// Exactly-once holds per key: two POST /payments with different
// Idempotency-Keys are two payments, by design. A charge declined by the
// provider is recorded as FAILED, not retried. The provider's own
// idempotency window must outlast the longest redelivery delay (paysim keeps
// keys 24 h). Order of charges across different orders is not preserved.
package billing
