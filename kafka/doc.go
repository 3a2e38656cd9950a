// Package kafka adapts idem's core packages to Kafka through franz-go: an
// outbox publisher (one produce call per relay batch) and a consumer runner
// that commits offsets only after the handler's database transaction. The
// consumer is package consume's broker-neutral loop on a franz-go driver,
// which passes consume/consumertest against kfake.
//
// The core packages (outbox, inbox, consume) never import franz-go; this
// package does.
package kafka
