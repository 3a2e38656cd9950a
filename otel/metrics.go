package idemotel

import (
	"errors"

	"go.opentelemetry.io/otel/metric"
)

// Metric names: the table in docs/metrics.md lists each with its
// attributes and the name the Prometheus collector (package idemprom)
// gives it, which is this one with dots as underscores, the unit's suffix
// (_seconds) and _total for a counter.
const (
	MetricRequests           = "idem.idempotency.requests"
	MetricReplays            = "idem.idempotency.replays"
	MetricConflicts          = "idem.idempotency.conflicts"
	MetricMismatches         = "idem.idempotency.mismatches"
	MetricTakeovers          = "idem.idempotency.takeovers"
	MetricIdempotencyPurged  = "idem.idempotency.purged"
	MetricOutboxEvents       = "idem.outbox.events"
	MetricOutboxOldestAge    = "idem.outbox.oldest_pending_age"
	MetricOutboxPublished    = "idem.outbox.published"
	MetricOutboxFailures     = "idem.outbox.publish_failures"
	MetricOutboxDead         = "idem.outbox.dead"
	MetricOutboxLatency      = "idem.outbox.publish.latency"
	MetricOutboxBatch        = "idem.outbox.batch.duration"
	MetricOutboxReaped       = "idem.outbox.reaped"
	MetricOutboxPurged       = "idem.outbox.purged"
	MetricConsumerRecords    = "idem.consumer.records"
	MetricConsumerDuplicates = "idem.consumer.duplicates"
	MetricConsumerRetries    = "idem.consumer.retries"
	MetricConsumerDead       = "idem.consumer.dead_letters"
	MetricConsumerCommit     = "idem.consumer.commit.latency"
	MetricClientAttempts     = "idem.client.attempts"
	MetricClientRetries      = "idem.client.retries"
	MetricInboxPurged        = "idem.inbox.purged"
)

// secondsBuckets are the histograms' bounds, in seconds: from a
// millisecond (a commit, a local publish) to half a minute (a batch at its
// deadline). The SDK's default bounds are for milliseconds.
var secondsBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}

type instruments struct {
	requests, replays, conflicts, mismatches, takeovers, idemPurged metric.Int64Counter
	published, failures, dead, reaped, outboxPurged                 metric.Int64Counter
	latency, batch                                                  metric.Float64Histogram
	records, duplicates, retries, deadLetters                       metric.Int64Counter
	commit                                                          metric.Float64Histogram
	attempts, clientRetries, inboxPurged                            metric.Int64Counter
	routes, topics, consumers                                       labelSet
}

func newInstruments(m metric.Meter) (*instruments, error) {
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	seconds := func(name, desc string) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc), metric.WithExplicitBucketBoundaries(secondsBuckets...))
		errs = append(errs, err)
		return h
	}
	in := &instruments{
		requests:      counter(MetricRequests, "{request}", "Guarded requests by outcome (complete, replay, conflict, mismatch, release, fenced, store_error, rejected)."),
		replays:       counter(MetricReplays, "{request}", "Requests answered with a stored response."),
		conflicts:     counter(MetricConflicts, "{request}", "Requests answered 409 in progress."),
		mismatches:    counter(MetricMismatches, "{request}", "Requests whose key was reused with a different request."),
		takeovers:     counter(MetricTakeovers, "{request}", "Claims that took an expired lease over."),
		idemPurged:    counter(MetricIdempotencyPurged, "{record}", "Idempotency records deleted past their retention."),
		published:     counter(MetricOutboxPublished, "{event}", "Outbox events delivered to the broker."),
		failures:      counter(MetricOutboxFailures, "{event}", "Failed publish attempts of outbox events."),
		dead:          counter(MetricOutboxDead, "{event}", "Outbox events that used up their attempts (DEAD)."),
		reaped:        counter(MetricOutboxReaped, "{event}", "Expired PUBLISHING leases returned by the reaper."),
		outboxPurged:  counter(MetricOutboxPurged, "{event}", "PUBLISHED outbox events deleted past their retention."),
		latency:       seconds(MetricOutboxLatency, "From the enqueue of an outbox event to the broker's acknowledgement."),
		batch:         seconds(MetricOutboxBatch, "Relay batch duration, claim to mark, by outcome."),
		records:       counter(MetricConsumerRecords, "{record}", "Consumed records by outcome (processed, duplicate, dead_lettered, abandoned)."),
		duplicates:    counter(MetricConsumerDuplicates, "{record}", "Records skipped as already processed (processed_event)."),
		retries:       counter(MetricConsumerRetries, "{attempt}", "Failed attempts retried, by cause (handler, database)."),
		deadLetters:   counter(MetricConsumerDead, "{record}", "Records sent to the dead-letter destination."),
		commit:        seconds(MetricConsumerCommit, "Offset commit (ack) latency, by outcome (ok, error)."),
		attempts:      counter(MetricClientAttempts, "{attempt}", "idemclient attempts by outcome (ok, transport, in_progress, status, definitive)."),
		clientRetries: counter(MetricClientRetries, "{retry}", "idemclient retries by reason (transport, in_progress, status)."),
		inboxPurged:   counter(MetricInboxPurged, "{row}", "processed_event rows deleted past their retention."),
	}
	return in, errors.Join(errs...)
}
