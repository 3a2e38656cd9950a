// Package billing is the reference service of idem: the billing system of
// the seed article, laid out as the article's hexagonal service and built
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
// The flow, the HTTP contract and the shutdown order are in ARCHITECTURE.md.
// Every step is either one database transaction or an external call with a
// key fixed before the first attempt, so a process stopped at any point
// leaves nothing half-done: a retry, a redelivery or the relay finishes it,
// and nothing is charged twice.
package billing
