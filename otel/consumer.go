package idemotel

import (
	"context"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/consume"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/outbox"
)

type recordSpanKey struct{}

// Consumer record outcomes (idem.outcome, and the outcome attribute of
// idem.consumer.records).
const (
	RecordProcessed    = "processed"
	RecordDuplicate    = "duplicate"
	RecordDeadLettered = "dead_lettered"
	RecordAbandoned    = "abandoned"
)

// ConsumerHook is the consumer's hook (kafka.ConsumerConfig.Hook, and
// consume.Config.Hook for every driver): a span per record and the
// consumer metrics.
//
// The record's span (kind consumer, "process TOPIC") is the child of the
// span context in the record's headers: the one that EnqueueTx recorded
// for the event, so the request that enqueued it and the work it causes
// are one trace. A child, not a link, because a record is one event of
// one trace (a batch of records, Config.Batch, still gets a span per
// record, each in its own trace); only the relay's batch, which carries
// many, links. A record without a trace context starts a new trace. The
// span covers Prepare, the handler and the transaction; the ctx returned
// for KindBegin carries it and OutboxPropagator, so the events the
// handler enqueues, and an idemclient call in Prepare, continue the trace.
//
// Attributes: messaging.system, messaging.operation.type process,
// messaging.destination.name, messaging.destination.partition.id,
// messaging.kafka.offset, messaging.consumer.group.name (the consumer
// id), messaging.message.id (the event id), messaging.batch.message_count
// in a batch, idem.outcome, idem.duplicate and idem.dead_lettered; each
// retry and a stuck dead-letter are span events.
func (i *Instrumentation) ConsumerHook() func(context.Context, consume.Event) context.Context {
	return func(ctx context.Context, e consume.Event) context.Context {
		if e.Kind == consume.KindCommitted {
			outcome := "ok"
			if e.Err != nil {
				outcome = "error"
			}
			i.m.commit.Record(ctx, e.Duration.Seconds(), metric.WithAttributes(
				attribute.String("consumer", i.m.consumers.value(e.ConsumerID)), attribute.String("outcome", outcome)))
			return ctx
		}
		labels := []attribute.KeyValue{attribute.String("consumer", i.m.consumers.value(e.ConsumerID)), attribute.String("topic", i.m.topics.value(e.Topic))}
		span, _ := ctx.Value(recordSpanKey{}).(trace.Span)
		outcome := ""
		switch e.Kind {
		case consume.KindBegin:
			return i.beginRecord(ctx, e)
		case consume.KindProcessed:
			outcome = RecordProcessed
		case consume.KindDuplicate:
			outcome = RecordDuplicate
			i.m.duplicates.Add(ctx, 1, metric.WithAttributes(labels...))
		case consume.KindDeadLettered:
			outcome = RecordDeadLettered
			i.m.deadLetters.Add(ctx, 1, metric.WithAttributes(labels...))
		case consume.KindAbandoned:
			outcome = RecordAbandoned
		case consume.KindRetried:
			cause := "database"
			if e.Handler {
				cause = "handler"
			}
			i.m.retries.Add(ctx, 1, metric.WithAttributes(append(labels, attribute.String("cause", cause))...))
			if span != nil {
				span.AddEvent("retry", trace.WithAttributes(attribute.Int("attempt", e.Attempt), attribute.String("cause", cause), attribute.String("error", errText(e.Err))))
			}
			return ctx
		case consume.KindStuck:
			if span != nil {
				span.AddEvent("stuck", trace.WithAttributes(attribute.String("error", errText(e.Err))))
			}
			return ctx
		default:
			return ctx
		}
		i.m.records.Add(ctx, 1, metric.WithAttributes(append(labels, attribute.String("outcome", outcome))...))
		if span == nil {
			return ctx
		}
		span.SetAttributes(AttrOutcome.String(outcome), AttrDuplicate.Bool(outcome == RecordDuplicate), AttrDeadLettered.Bool(outcome == RecordDeadLettered))
		if outcome == RecordDeadLettered {
			if e.Err != nil {
				span.RecordError(e.Err)
			}
			span.SetStatus(codes.Error, "dead-lettered")
		}
		span.End()
		return ctx
	}
}

func (i *Instrumentation) beginRecord(ctx context.Context, e consume.Event) context.Context {
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(
		i.system, semconv.MessagingOperationTypeProcess, semconv.MessagingOperationName("process"),
		semconv.MessagingDestinationName(e.Topic), semconv.MessagingDestinationPartitionID(strconv.Itoa(int(e.Partition))),
		semconv.MessagingKafkaOffset(int(e.Offset)), semconv.MessagingConsumerGroupName(e.ConsumerID),
		semconv.MessagingMessageID(e.EventID))}
	if e.Records > 1 {
		opts = append(opts, trace.WithAttributes(semconv.MessagingBatchMessageCount(e.Records)))
	}
	parent := ctx
	if e.Message != nil {
		if sc := i.extract(headerCarrier(e.Message.Headers)); sc.IsValid() {
			parent = trace.ContextWithRemoteSpanContext(ctx, sc)
		} else {
			opts = append(opts, trace.WithNewRoot())
		}
	}
	ctx, span := i.tracer.Start(parent, "process "+e.Topic, opts...)
	ctx = context.WithValue(ctx, recordSpanKey{}, span)
	return outbox.ContextWithPropagator(ctx, outboxPropagator{i.prop})
}

// headerCarrier reads a message's headers for a propagator; the first of
// repeated keys wins, as Kafka clients read headers.
type headerCarrier []consume.Header

func (h headerCarrier) Get(key string) string {
	for _, x := range h {
		if x.Key == key {
			return string(x.Value)
		}
	}
	return ""
}

func (h headerCarrier) Set(string, string) {} // extraction only

func (h headerCarrier) Keys() []string {
	keys := make([]string, len(h))
	for k, x := range h {
		keys[k] = x.Key
	}
	return keys
}

// InboxPurgeHook is inbox.PurgerConfig.Hook: idem.inbox.purged counts the
// processed_event rows each pass deleted. Purge passes make no spans.
func (i *Instrumentation) InboxPurgeHook() func(context.Context, inbox.PurgeEvent) context.Context {
	return func(ctx context.Context, e inbox.PurgeEvent) context.Context {
		if (e.Kind == inbox.PurgeDone || e.Kind == inbox.PurgeFailed) && e.Deleted > 0 {
			i.m.inboxPurged.Add(ctx, e.Deleted)
		}
		return ctx
	}
}
