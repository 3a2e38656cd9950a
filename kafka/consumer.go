package kafka

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/consume"
)

// Handler applies one record's effects inside tx. It must do all its work
// through tx: tx commits together with the record's processed_event row, so
// the effects happen exactly once, and rolls back as a whole when the
// handler returns an error. No external call (HTTP, produce) belongs here;
// enqueue an outbox row with a ready idempotency key instead (see the
// package example), or make the call in ConsumerConfig.Prepare. A handler
// may run more than once for a record (retries, batch fallback,
// redelivery) but only one run ever commits.
//
// ctx ends only on a hard stop. The record's event id is
// EventIDFromContext(ctx).
type Handler func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error

// Consumer runs a Handler for every record of a consumer group, in a
// database transaction that also records the event in processed_event
// (package inbox), and commits the record's offset only after that
// transaction committed. It is package consume's loop on a franz-go
// driver: see consume's doc for the guarantee, the crash windows, and what
// happens to a record that can be neither processed nor dead-lettered.
//
// Kafka specifics: records of one partition are processed in order, one
// at a time (or one batch at a time); partitions are processed in turn on
// one goroutine. Offsets are committed once per poll, after the poll's
// records; a rebalance waits until the poll in hand is processed
// (kgo.BlockRebalanceOnPoll), so no offset is committed for a partition
// this member lost. A stuck record pauses its partition only.
//
// Each Start creates a fresh franz-go client; Stop leaves the group and
// closes it. Consumer satisfies lifecycle.Component and
// lifecycle.HardStopper.
type Consumer struct {
	*consume.Consumer
	cfg ConsumerConfig
}

// Start checks that every dead-letter topic exists (unless
// ConsumerConfig.SkipDeadLetterTopicCheck), then opens a session and
// processes records on a goroutine until Stop or HardStop (see
// consume.Consumer.Start). A missing dead-letter topic is
// ErrDeadLetterTopicMissing, naming it: found at start, not when the first
// poison record arrives. ctx bounds the check and the opening. The check
// is the driver's (consume.DeadLetterChecker), so a consume.Consumer on
// NewDriver makes it too.
func (c *Consumer) Start(ctx context.Context) error { return c.Consumer.Start(ctx) }

// NewConsumer validates cfg and returns a Consumer; nothing connects until
// Start. db runs the transactions (a *pgxpool.Pool), handler applies each
// record.
func NewConsumer(db consume.DB, handler Handler, cfg *ConsumerConfig) (*Consumer, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: db is nil", ErrInvalidConfig)
	}
	if handler == nil {
		return nil, fmt.Errorf("%w: handler is nil", ErrInvalidConfig)
	}
	c := ConsumerConfig{}
	if cfg != nil {
		c = *cfg
	}
	c.setDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	ccfg := &consume.Config{
		ConsumerID:         c.ConsumerID,
		Batch:              c.Batch,
		MaxAttempts:        c.MaxAttempts,
		BackoffMin:         c.BackoffMin,
		BackoffMax:         c.BackoffMax,
		DeadLetterAttempts: c.DeadLetterAttempts,
		DeadLetterTimeout:  c.DeadLetterTimeout,
		AckTimeout:         c.CommitTimeout,
		InboxForm:          c.InboxForm,
		Retention:          c.Retention,
		PurgeInterval:      c.PurgeInterval,
		PurgeBatchSize:     c.PurgeBatchSize,
		DisablePurge:       c.DisablePurge,
		Hook:               c.Hook,
		Logger:             c.Logger,
	}
	if p := c.Prepare; p != nil {
		ccfg.Prepare = func(ctx context.Context, m *consume.Message) (any, error) {
			return p(ctx, m.Raw.(*kgo.Record))
		}
	}
	h := func(ctx context.Context, tx pgx.Tx, m *consume.Message) error {
		return handler(ctx, tx, m.Raw.(*kgo.Record))
	}
	cc, err := consume.New(db, newDriver(&c), h, ccfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return &Consumer{Consumer: cc, cfg: c}, nil
}

// RecordEventID is the default ConsumerConfig.EventID: the event-id header
// if present and non-empty, else "topic/partition/offset", which is stable
// across redeliveries of the same record but not across re-publishes.
func RecordEventID(rec *kgo.Record) string {
	for _, h := range rec.Headers {
		if h.Key == HeaderEventID && len(h.Value) > 0 {
			return string(h.Value)
		}
	}
	return recordSource(rec)
}

// RecordEventType returns the record's event-type header (the outbox
// message's EventType, HeaderEventType), or "" when it has none: what a
// handler switches on when one topic carries several event types.
func RecordEventType(rec *kgo.Record) string {
	for _, h := range rec.Headers {
		if h.Key == HeaderEventType {
			return string(h.Value)
		}
	}
	return ""
}

func recordSource(rec *kgo.Record) string {
	return rec.Topic + "/" + strconv.Itoa(int(rec.Partition)) + "/" + strconv.FormatInt(rec.Offset, 10)
}

// EventIDFromContext returns the event id of the record a Handler or
// Prepare is processing, as ConsumerConfig.EventID computed it ("" outside
// one). Build idempotency keys of downstream effects from it.
func EventIDFromContext(ctx context.Context) string { return consume.EventIDFromContext(ctx) }

// PreparedFromContext returns the result of ConsumerConfig.Prepare for the
// record a Handler is processing (nil without Prepare).
func PreparedFromContext(ctx context.Context) any { return consume.PreparedFromContext(ctx) }

// Permanent marks a handler error as not worth retrying (a malformed
// payload): the record goes to the dead-letter topic at once. It is
// consume.Permanent.
func Permanent(err error) error { return consume.Permanent(err) }

// IsPermanent reports whether err was marked by Permanent.
func IsPermanent(err error) bool { return consume.IsPermanent(err) }

// RecordOf returns the record an event is about (nil for
// consume.KindCommitted).
func RecordOf(e ConsumerEvent) *kgo.Record {
	if e.Message == nil {
		return nil
	}
	rec, _ := e.Message.Raw.(*kgo.Record)
	return rec
}

// NewDriver returns the franz-go consume.Driver of cfg, for running a
// consume.Consumer directly: with a broker-neutral handler (on
// *consume.Message), or beside the drivers of other brokers. Only the
// fields that reach the broker count (Brokers, Group, Topics, EventID,
// MaxPollRecords, DeadLetterTopic, SkipDeadLetterTopicCheck, Logger,
// ClientOpts); the loop's own
// settings (MaxAttempts, Batch, Prepare, Hook…) are consume.Config's.
func NewDriver(cfg *ConsumerConfig) (consume.Driver, error) {
	c := ConsumerConfig{}
	if cfg != nil {
		c = *cfg
	}
	c.setDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	return newDriver(&c), nil
}
