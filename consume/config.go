package consume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/inbox"
)

// Config defaults.
const (
	// MaxAttemptsDefault is how many times a failing handler runs for one
	// record before the record is dead-lettered.
	MaxAttemptsDefault = 5
	// BackoffMinDefault is the ceiling of the first pause after a failure.
	BackoffMinDefault = 100 * time.Millisecond
	// BackoffMaxDefault caps every pause.
	BackoffMaxDefault = 5 * time.Second
	// DeadLetterAttemptsDefault is how many dead-letter attempts a record
	// gets before it is reported stuck.
	DeadLetterAttemptsDefault = 3
	// DeadLetterTimeoutDefault bounds one dead-letter attempt.
	DeadLetterTimeoutDefault = 10 * time.Second
	// AckTimeoutDefault bounds one Ack and the session's Close.
	AckTimeoutDefault = 10 * time.Second
)

// ErrInvalidConfig wraps every configuration error of New.
var ErrInvalidConfig = errors.New("consume: invalid config")

// Handler applies one message's effects inside tx. It must do all its work
// through tx: tx commits together with the message's processed_event row,
// so the effects happen exactly once, and rolls back as a whole when the
// handler returns an error. No external call (HTTP, produce) belongs here:
// enqueue an outbox row with an idempotency key derived from the event id
// instead, or make the call in Config.Prepare. A handler may run more than
// once for a message (retries, batch fallback, redelivery), but only one
// run ever commits.
//
// ctx ends only on a hard stop. It carries the message's event id
// (EventIDFromContext) and Prepare's result (PreparedFromContext).
type Handler func(ctx context.Context, tx pgx.Tx, m *Message) error

// PrepareFunc is Config.Prepare.
type PrepareFunc func(ctx context.Context, m *Message) (any, error)

// Config configures a Consumer. ConsumerID is required; every other field
// has a default.
type Config struct {
	// ConsumerID is the processed_event.consumer_id of this consumer: the
	// dedup scope. Required.
	ConsumerID string
	// Batch processes the messages of one stream fetched together in one
	// transaction (each still deduplicated). If the handler fails for any
	// of them, the transaction rolls back and those messages are processed
	// one by one. Defaults to false (one transaction per message).
	Batch bool
	// MaxAttempts is how many times the handler runs for one message
	// before the message is dead-lettered. Defaults to MaxAttemptsDefault (5).
	MaxAttempts int
	// BackoffMin is the ceiling of the pause after the first failed
	// attempt; it doubles per failure up to BackoffMax, with full jitter
	// (internal/backoff). Defaults to BackoffMinDefault (100ms).
	BackoffMin time.Duration
	// BackoffMax caps every pause, and is the interval at which a stuck
	// message's dead-letter is retried. Defaults to BackoffMaxDefault (5s).
	BackoffMax time.Duration
	// DeadLetterAttempts is how many times a message's dead-letter is
	// attempted (with backoff) before the message is reported stuck
	// (KindStuck). The first attempt runs in the processing loop; later
	// ones run in the background while the message holds its stream.
	// Defaults to DeadLetterAttemptsDefault (3).
	DeadLetterAttempts int
	// DeadLetterTimeout bounds each dead-letter attempt. Defaults to
	// DeadLetterTimeoutDefault (10s).
	DeadLetterTimeout time.Duration
	// AckTimeout bounds each Ack and the session's Close. Defaults to
	// AckTimeoutDefault (10s).
	AckTimeout time.Duration
	// InboxForm is the SQL form of the dedup insert. Defaults to
	// inbox.FormDefault.
	InboxForm inbox.Form
	// Prepare, when set, runs for each message before its transaction,
	// with no transaction open: the place for an external call (a payment
	// provider) whose outcome the handler then records. Its result reaches
	// the handler through PreparedFromContext. Per message, step by step:
	//
	//  1. inbox.Seen, one read outside any transaction: an event already
	//     processed skips Prepare and is a duplicate (no handler either);
	//  2. Prepare, outside any transaction;
	//  3. the handler's transaction: processed_event + the effects, then
	//     the ack as usual.
	//
	// A crash after 2 repeats Prepare on redelivery, and a concurrent
	// consumer may pass 1 too (its transaction then finds the duplicate):
	// Prepare is at-least-once, so its effect must be idempotent (a call
	// with a key fixed in the message). A Prepare error counts as a handler
	// failure (retried, dead-lettered after MaxAttempts, at once if
	// Permanent); a successful Prepare is not repeated when only the
	// transaction is retried. ctx ends only on a hard stop. Not allowed
	// with Batch. Defaults to nil.
	Prepare PrepareFunc
	// Retention is how long processed_event rows are kept: the consumer
	// runs an inbox.Purger (started and stopped with it) that deletes
	// rows older than that, of every consumer_id, in batches. A message
	// redelivered after its row was purged is processed again, so keep it
	// above the longest redelivery you expect (a replay from the earliest
	// offset needs it off, or longer than the topic's retention).
	// Defaults to inbox.RetentionDefault (7 days).
	Retention time.Duration
	// PurgeInterval is the pause between two purge passes. Defaults to
	// inbox.PurgeIntervalDefault (1 minute).
	PurgeInterval time.Duration
	// PurgeBatchSize is the most rows one purge DELETE removes. Defaults
	// to inbox.PurgeBatchSizeDefault (1000).
	PurgeBatchSize int
	// DisablePurge turns the consumer's own purge off: for rows kept for
	// ever, or purged by one inbox.Purger of your own (with its Hook for
	// metrics) instead of one per consumer. Defaults to false (the
	// consumer purges).
	DisablePurge bool
	// Hook observes every record and ack (see Kind): the place for metrics
	// and traces. It runs synchronously on the processing goroutine and
	// must be fast. Defaults to nil.
	Hook func(ctx context.Context, e Event) context.Context
	// Logger receives what the consumer retries or works around. Defaults
	// to slog.Default().
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.MaxAttempts == 0 {
		c.MaxAttempts = MaxAttemptsDefault
	}
	if c.BackoffMin == 0 {
		c.BackoffMin = BackoffMinDefault
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = max(BackoffMaxDefault, c.BackoffMin)
	}
	if c.DeadLetterAttempts == 0 {
		c.DeadLetterAttempts = DeadLetterAttemptsDefault
	}
	if c.DeadLetterTimeout == 0 {
		c.DeadLetterTimeout = DeadLetterTimeoutDefault
	}
	if c.AckTimeout == 0 {
		c.AckTimeout = AckTimeoutDefault
	}
	if c.InboxForm == "" {
		c.InboxForm = inbox.FormDefault
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// validate checks a config whose defaults are filled in.
func (c *Config) validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...)
	}
	switch {
	case c.ConsumerID == "":
		return bad("ConsumerID is empty")
	case c.MaxAttempts < 1:
		return bad("MaxAttempts %d is below 1", c.MaxAttempts)
	case c.BackoffMin < 0:
		return bad("BackoffMin %v is negative", c.BackoffMin)
	case c.BackoffMax < c.BackoffMin:
		return bad("BackoffMax %v is below BackoffMin %v", c.BackoffMax, c.BackoffMin)
	case c.DeadLetterAttempts < 1:
		return bad("DeadLetterAttempts %d is below 1", c.DeadLetterAttempts)
	case c.DeadLetterTimeout < 0:
		return bad("DeadLetterTimeout %v is negative", c.DeadLetterTimeout)
	case c.AckTimeout < 0:
		return bad("AckTimeout %v is negative", c.AckTimeout)
	case c.Retention < 0:
		return bad("Retention %v is negative", c.Retention)
	case c.PurgeInterval < 0:
		return bad("PurgeInterval %v is negative", c.PurgeInterval)
	case c.PurgeBatchSize < 0:
		return bad("PurgeBatchSize %d is negative", c.PurgeBatchSize)
	case c.Prepare != nil && c.Batch:
		return bad("Prepare and Batch are exclusive")
	}
	return nil
}
