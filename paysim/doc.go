// Package paysim is a payment-provider simulator that honours
// Idempotency-Key, with fault injection and an auditable ledger, and the
// typed client of it (Client.Charge, the article's payment adapter).
//
// The server side is being written; the client API (NewClient, Charge,
// ChargeCommand, ChargeResult) is stable.
package paysim
