// Package idemprom is a Prometheus collector for idem's components: it
// counts what their hooks (idem.Hook) report, with the names of the table
// in docs/metrics.md, which the OpenTelemetry module (package idemotel)
// shares. It is a Go module of its own (github.com/idemkit/idem/prom), so
// that a user of idem's core does not download the Prometheus client.
//
//	m, err := idemprom.New(reg)
//	mw, _ := idempotency.New(store, &idempotency.Config{Scope: scope, Hook: m.RequestHook()})
//	relay, _ := outbox.NewRelay(pool, pub, &outbox.RelayConfig{Hook: m.RelayHook()})
//	gauges, _ := m.OutboxGauges(pool, nil) // Start it: the backlog, read in the background
//
// Hooks combine with idem.JoinHooks (an OpenTelemetry hook and this one
// on one component). Label values come from fixed sets, or from values the
// code chooses (route patterns, topics, consumer ids) capped at 100 per
// label ("other" beyond). A scrape reads counters and the last backlog
// read: it never queries the database.
package idemprom

import (
	"context"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idem/consume"
	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/outbox"
)

// Metric names, as in docs/metrics.md.
const (
	MetricRequests           = "idem_idempotency_requests_total"
	MetricReplays            = "idem_idempotency_replays_total"
	MetricConflicts          = "idem_idempotency_conflicts_total"
	MetricMismatches         = "idem_idempotency_mismatches_total"
	MetricTakeovers          = "idem_idempotency_takeovers_total"
	MetricIdempotencyPurged  = "idem_idempotency_purged_total"
	MetricOutboxEvents       = "idem_outbox_events"
	MetricOutboxOldestAge    = "idem_outbox_oldest_pending_age_seconds"
	MetricOutboxPublished    = "idem_outbox_published_total"
	MetricOutboxFailures     = "idem_outbox_publish_failures_total"
	MetricOutboxDead         = "idem_outbox_dead_total"
	MetricOutboxLatency      = "idem_outbox_publish_latency_seconds"
	MetricOutboxBatch        = "idem_outbox_batch_duration_seconds"
	MetricOutboxReaped       = "idem_outbox_reaped_total"
	MetricOutboxPurged       = "idem_outbox_purged_total"
	MetricConsumerRecords    = "idem_consumer_records_total"
	MetricConsumerDuplicates = "idem_consumer_duplicates_total"
	MetricConsumerRetries    = "idem_consumer_retries_total"
	MetricConsumerDead       = "idem_consumer_dead_letters_total"
	MetricConsumerCommit     = "idem_consumer_commit_latency_seconds"
	MetricClientAttempts     = "idem_client_attempts_total"
	MetricClientRetries      = "idem_client_retries_total"
	MetricInboxPurged        = "idem_inbox_purged_total"
)

// Buckets are the histograms' bounds, in seconds (the OpenTelemetry
// module's too).
var Buckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}

// Relay batch outcomes (the outcome label of the batch duration).
const (
	BatchIdle      = "idle"
	BatchPublished = "published"
	BatchPartial   = "partial"
	BatchFailed    = "failed"
	BatchError     = "error"
)

// Metrics counts what the hooks it makes report. Make one per registry
// and give its hooks to every component; it is safe for concurrent use.
type Metrics struct {
	reg prometheus.Registerer

	requests, replays, conflicts, mismatches, takeovers, idemPurged *prometheus.CounterVec
	published, failures, dead, reaped, outboxPurged                 *prometheus.CounterVec
	latency, batch                                                  *prometheus.HistogramVec
	records, duplicates, retries, deadLetters                       *prometheus.CounterVec
	commit                                                          *prometheus.HistogramVec
	attempts, clientRetries                                         *prometheus.CounterVec
	inboxPurged                                                     prometheus.Counter

	routes, topics, consumers labelSet
}

// New registers idem's counters and histograms with reg (the backlog
// gauges come with OutboxGauges). A registration error (a name already
// registered) is returned as is.
func New(reg prometheus.Registerer) (*Metrics, error) {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	seconds := func(name, help string, labels ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: Buckets}, labels)
	}
	m := &Metrics{
		reg:           reg,
		requests:      counter(MetricRequests, "Guarded requests by outcome (complete, replay, conflict, mismatch, release, fenced, store_error, rejected).", "route", "method", "mode", "outcome"),
		replays:       counter(MetricReplays, "Requests answered with a stored response.", "route", "method", "mode"),
		conflicts:     counter(MetricConflicts, "Requests answered 409 in progress.", "route", "method", "mode"),
		mismatches:    counter(MetricMismatches, "Requests whose key was reused with a different request.", "route", "method", "mode"),
		takeovers:     counter(MetricTakeovers, "Claims that took an expired lease over.", "route", "method", "mode"),
		idemPurged:    counter(MetricIdempotencyPurged, "Idempotency records deleted past their retention.", "mode"),
		published:     counter(MetricOutboxPublished, "Outbox events delivered to the broker.", "topic"),
		failures:      counter(MetricOutboxFailures, "Failed publish attempts of outbox events.", "topic"),
		dead:          counter(MetricOutboxDead, "Outbox events that used up their attempts (DEAD).", "topic"),
		reaped:        counter(MetricOutboxReaped, "Expired PUBLISHING leases returned by the reaper.", "mode"),
		outboxPurged:  counter(MetricOutboxPurged, "PUBLISHED outbox events deleted past their retention.", "mode"),
		latency:       seconds(MetricOutboxLatency, "From the enqueue of an outbox event to the broker's acknowledgement.", "topic"),
		batch:         seconds(MetricOutboxBatch, "Relay batch duration, claim to mark, by outcome.", "mode", "outcome"),
		records:       counter(MetricConsumerRecords, "Consumed records by outcome (processed, duplicate, dead_lettered, abandoned).", "consumer", "topic", "outcome"),
		duplicates:    counter(MetricConsumerDuplicates, "Records skipped as already processed (processed_event).", "consumer", "topic"),
		retries:       counter(MetricConsumerRetries, "Failed attempts retried, by cause (handler, database).", "consumer", "topic", "cause"),
		deadLetters:   counter(MetricConsumerDead, "Records sent to the dead-letter destination.", "consumer", "topic"),
		commit:        seconds(MetricConsumerCommit, "Offset commit (ack) latency, by outcome (ok, error).", "consumer", "outcome"),
		attempts:      counter(MetricClientAttempts, "idemclient attempts by outcome (ok, transport, in_progress, status, definitive).", "method", "outcome"),
		clientRetries: counter(MetricClientRetries, "idemclient retries by reason (transport, in_progress, status).", "method", "reason"),
		inboxPurged:   prometheus.NewCounter(prometheus.CounterOpts{Name: MetricInboxPurged, Help: "processed_event rows deleted past their retention."}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.replays, m.conflicts, m.mismatches, m.takeovers, m.idemPurged,
		m.published, m.failures, m.dead, m.reaped, m.outboxPurged, m.latency, m.batch,
		m.records, m.duplicates, m.retries, m.deadLetters, m.commit, m.attempts, m.clientRetries, m.inboxPurged} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// RequestHook is idempotency.Config.Hook (and paysim.Config.Hook): the
// idempotency counters. The route label is the pattern without its method
// ("/orders/{id}/confirm").
func (m *Metrics) RequestHook() func(context.Context, idempotency.Event) context.Context {
	return func(ctx context.Context, e idempotency.Event) context.Context {
		mode := e.Mode.String()
		if e.Kind == idempotency.EventPurge {
			if e.Purged > 0 {
				m.idemPurged.WithLabelValues(mode).Add(float64(e.Purged))
			}
			return ctx
		}
		route := e.Route
		if meth, rest, ok := strings.Cut(route, " "); ok && meth == e.Method {
			route = rest
		}
		route = m.routes.value(route)
		switch e.Kind {
		case idempotency.EventTakeover:
			m.takeovers.WithLabelValues(route, e.Method, mode).Inc()
			return ctx
		case idempotency.EventReplay:
			m.replays.WithLabelValues(route, e.Method, mode).Inc()
		case idempotency.EventConflict:
			m.conflicts.WithLabelValues(route, e.Method, mode).Inc()
		case idempotency.EventMismatch:
			m.mismatches.WithLabelValues(route, e.Method, mode).Inc()
		case idempotency.EventComplete, idempotency.EventRelease, idempotency.EventFenced,
			idempotency.EventStoreError, idempotency.EventRejected:
		default:
			return ctx // begin, claim, lease_lost: not an end
		}
		m.requests.WithLabelValues(route, e.Method, mode, string(e.Kind)).Inc()
		return ctx
	}
}

// ClientHook is idemclient.Config.Hook: attempts by outcome, retries by
// reason.
func (m *Metrics) ClientHook() func(context.Context, idemclient.Event) context.Context {
	return func(ctx context.Context, e idemclient.Event) context.Context {
		switch e.Kind {
		case idemclient.EventAttempt:
			outcome := "ok"
			if e.Reason != "" {
				outcome = string(e.Reason)
			}
			m.attempts.WithLabelValues(e.Method, outcome).Inc()
		case idemclient.EventRetry:
			m.clientRetries.WithLabelValues(e.Method, string(e.Reason)).Inc()
		}
		return ctx
	}
}

// RelayHook is outbox.RelayConfig.Hook: published, failed and dead events
// by topic, the publish latency (enqueue to acknowledgement), the batch
// duration by outcome, reaped and purged rows.
func (m *Metrics) RelayHook() func(context.Context, outbox.RelayEvent) context.Context {
	return func(ctx context.Context, e outbox.RelayEvent) context.Context {
		mode := e.Mode.String()
		switch e.Kind {
		case outbox.RelayPublished:
			for _, ev := range e.Events {
				topic := m.topics.value(ev.Topic)
				m.published.WithLabelValues(topic).Inc()
				if !ev.CreatedAt.IsZero() {
					m.latency.WithLabelValues(topic).Observe(max(0, time.Since(ev.CreatedAt).Seconds()))
				}
			}
		case outbox.RelayFailed:
			for _, ev := range e.Events {
				m.failures.WithLabelValues(m.topics.value(ev.Topic)).Inc()
			}
		case outbox.RelayDead:
			for _, ev := range e.Events {
				m.dead.WithLabelValues(m.topics.value(ev.Topic)).Inc()
			}
		case outbox.RelayBatchDone:
			m.batch.WithLabelValues(mode, batchOutcome(e)).Observe(e.Duration.Seconds())
		case outbox.RelayReaped:
			if e.Count > 0 {
				m.reaped.WithLabelValues(mode).Add(float64(e.Count))
			}
		case outbox.RelayPurged:
			if e.Count > 0 {
				m.outboxPurged.WithLabelValues(mode).Add(float64(e.Count))
			}
		}
		return ctx
	}
}

func batchOutcome(e outbox.RelayEvent) string {
	switch {
	case e.Failed > 0 && e.Published > 0:
		return BatchPartial
	case e.Failed > 0:
		return BatchFailed
	case e.Err != nil && e.Published == 0:
		return BatchError
	case e.Count == 0:
		return BatchIdle
	}
	return BatchPublished
}

// ConsumerHook is the consumer's hook (kafka.ConsumerConfig.Hook,
// consume.Config.Hook): records by outcome, duplicates, retries by cause,
// dead letters, commit latency.
func (m *Metrics) ConsumerHook() func(context.Context, consume.Event) context.Context {
	return func(ctx context.Context, e consume.Event) context.Context {
		consumer := m.consumers.value(e.ConsumerID)
		if e.Kind == consume.KindCommitted {
			outcome := "ok"
			if e.Err != nil {
				outcome = "error"
			}
			m.commit.WithLabelValues(consumer, outcome).Observe(e.Duration.Seconds())
			return ctx
		}
		topic := m.topics.value(e.Topic)
		outcome := ""
		switch e.Kind {
		case consume.KindProcessed:
			outcome = "processed"
		case consume.KindDuplicate:
			outcome = "duplicate"
			m.duplicates.WithLabelValues(consumer, topic).Inc()
		case consume.KindDeadLettered:
			outcome = "dead_lettered"
			m.deadLetters.WithLabelValues(consumer, topic).Inc()
		case consume.KindAbandoned:
			outcome = "abandoned"
		case consume.KindRetried:
			cause := "database"
			if e.Handler {
				cause = "handler"
			}
			m.retries.WithLabelValues(consumer, topic, cause).Inc()
			return ctx
		default:
			return ctx
		}
		m.records.WithLabelValues(consumer, topic, outcome).Inc()
		return ctx
	}
}

// InboxPurgeHook is inbox.PurgerConfig.Hook: the processed_event rows
// each pass deleted.
func (m *Metrics) InboxPurgeHook() func(context.Context, inbox.PurgeEvent) context.Context {
	return func(ctx context.Context, e inbox.PurgeEvent) context.Context {
		if (e.Kind == inbox.PurgeDone || e.Kind == inbox.PurgeFailed) && e.Deleted > 0 {
			m.inboxPurged.Add(float64(e.Deleted))
		}
		return ctx
	}
}
