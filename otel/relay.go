package idemotel

import (
	"context"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/outbox"
)

type relayBatchKey struct{}

// relayBatch is one batch in flight: the span starts at the claim, so
// that an idle poll (a batch that claims nothing, several a second on an
// idle relay) makes no span at all.
type relayBatch struct {
	begun time.Time
	mu    sync.Mutex
	span  trace.Span
}

// BatchOutcome values of a relay batch (idem.outcome, and the outcome
// attribute of the batch duration).
const (
	BatchIdle      = "idle"      // claimed nothing
	BatchPublished = "published" // every attempted event delivered
	BatchPartial   = "partial"   // some delivered, some failed
	BatchFailed    = "failed"    // attempted events all failed
	BatchError     = "error"     // the batch failed before any outcome (a database error)
)

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

// RelayHook is outbox.RelayConfig.Hook: a span per relay batch that
// claimed events, and the outbox metrics (publish latency, failures, dead
// events, batch duration, reaped and purged rows).
//
// The batch span (kind producer, "publish", messaging.operation.type
// send) is the root of a trace of its own, with a link to the trace of
// every event it claimed (the context EnqueueTx recorded in the event's
// headers): one batch carries events of many requests, so it can be the
// child of none of them. It starts at the claim, timed from the batch's
// begin, so that idle polls make no spans; the publisher's ctx therefore
// does not hold it. Attributes: messaging.system,
// messaging.batch.message_count, idem.mode, idem.outcome (published,
// partial, failed, error) and the tally idem.published, idem.failed,
// idem.held; each failed attempt is a span event.
//
// The consumer's span for a record is the child of the context in the
// record's headers (ConsumerHook), not of the batch: the trace of a
// request goes on through the broker, and the batch is linked to it.
func (i *Instrumentation) RelayHook() func(context.Context, outbox.RelayEvent) context.Context {
	return func(ctx context.Context, e outbox.RelayEvent) context.Context {
		b, _ := ctx.Value(relayBatchKey{}).(*relayBatch)
		mode := attribute.String("mode", e.Mode.String())
		switch e.Kind {
		case outbox.RelayBatchBegin:
			return context.WithValue(ctx, relayBatchKey{}, &relayBatch{begun: time.Now()})
		case outbox.RelayBatchClaimed:
			if b == nil {
				return ctx
			}
			links := make([]trace.Link, 0, len(e.Events))
			for _, ev := range e.Events {
				if sc := i.extract(propagation.MapCarrier(ev.Headers)); sc.IsValid() {
					links = append(links, trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{semconv.MessagingMessageID(ev.EventID)}})
				}
			}
			_, span := i.tracer.Start(ctx, "publish", trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindProducer),
				trace.WithTimestamp(b.begun), trace.WithLinks(links...), trace.WithAttributes(
					i.system, semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("publish"),
					semconv.MessagingBatchMessageCount(e.Count), AttrMode.String(e.Mode.String())))
			b.mu.Lock()
			b.span = span
			b.mu.Unlock()
		case outbox.RelayPublished:
			now := time.Now()
			for _, ev := range e.Events {
				topic := attribute.String("topic", i.m.topics.value(ev.Topic))
				i.m.published.Add(ctx, 1, metric.WithAttributes(topic))
				if !ev.CreatedAt.IsZero() {
					i.m.latency.Record(ctx, max(0, now.Sub(ev.CreatedAt).Seconds()), metric.WithAttributes(topic))
				}
			}
		case outbox.RelayFailed:
			for _, ev := range e.Events {
				i.m.failures.Add(ctx, 1, metric.WithAttributes(attribute.String("topic", i.m.topics.value(ev.Topic))))
			}
			if s := b.get(); s != nil {
				s.AddEvent("publish_failed", trace.WithAttributes(attribute.Int("count", e.Count), attribute.String("error", errText(e.Err))))
			}
		case outbox.RelayDead:
			for _, ev := range e.Events {
				i.m.dead.Add(ctx, 1, metric.WithAttributes(attribute.String("topic", i.m.topics.value(ev.Topic))))
			}
		case outbox.RelayBatchDone:
			outcome := batchOutcome(e)
			i.m.batch.Record(ctx, e.Duration.Seconds(), metric.WithAttributes(mode, attribute.String("outcome", outcome)))
			s := b.get()
			if s == nil {
				return ctx
			}
			s.SetAttributes(AttrOutcome.String(outcome), AttrPublished.Int(e.Published), AttrFailed.Int(e.Failed), AttrHeld.Int(e.Held))
			if e.Err != nil {
				s.SetStatus(codes.Error, errText(e.Err))
			}
			s.End()
		case outbox.RelayReaped:
			if e.Count > 0 {
				i.m.reaped.Add(ctx, int64(e.Count), metric.WithAttributes(mode))
			}
		case outbox.RelayPurged:
			if e.Count > 0 {
				i.m.outboxPurged.Add(ctx, int64(e.Count), metric.WithAttributes(mode))
			}
		}
		return ctx
	}
}

func (b *relayBatch) get() trace.Span {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.span
}

// errText bounds an error's text in a span: a broker's or a publisher's
// error may quote a whole record.
func errText(err error) string {
	if err == nil {
		return ""
	}
	s := err.Error()
	if len(s) > 512 {
		s = strings.ToValidUTF8(s[:512], "")
	}
	return s
}
