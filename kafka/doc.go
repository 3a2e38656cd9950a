// Package kafka adapts idem's core packages to Kafka through franz-go: an
// outbox publisher (one produce call per relay batch) and a consumer runner
// that commits offsets only after the handler's database transaction.
//
// The core packages (outbox, inbox) never import franz-go; this package does.
package kafka
