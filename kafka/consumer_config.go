package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/consume"
	"github.com/idemkit/idem/inbox"
)

// Consumer defaults.
const (
	// ConsumerMaxPollRecordsDefault bounds the records taken per poll.
	ConsumerMaxPollRecordsDefault = 500
	// ConsumerMaxAttemptsDefault is how many times a failing handler runs
	// for one record before the record goes to the dead-letter topic.
	ConsumerMaxAttemptsDefault = consume.MaxAttemptsDefault
	// ConsumerBackoffMinDefault is the ceiling of the first pause after a
	// failure; it doubles per failure up to ConsumerBackoffMaxDefault.
	ConsumerBackoffMinDefault = consume.BackoffMinDefault
	// ConsumerBackoffMaxDefault caps the pause between attempts.
	ConsumerBackoffMaxDefault = consume.BackoffMaxDefault
	// ConsumerCommitTimeoutDefault bounds one offset commit and the group leave.
	ConsumerCommitTimeoutDefault = consume.AckTimeoutDefault
	// ConsumerDeadLetterAttemptsDefault is how many dead-letter produces a
	// record gets before it is reported stuck.
	ConsumerDeadLetterAttemptsDefault = consume.DeadLetterAttemptsDefault
	// ConsumerDeadLetterTimeoutDefault bounds one dead-letter produce.
	ConsumerDeadLetterTimeoutDefault = consume.DeadLetterTimeoutDefault
	// DeadLetterSuffixDefault is appended to a record's topic to name its
	// dead-letter topic when ConsumerConfig.DeadLetterTopic is empty.
	DeadLetterSuffixDefault = ".dlq"
)

// ErrInvalidConfig wraps every configuration error of NewConsumer.
var ErrInvalidConfig = errors.New("kafka: invalid config")

// ConsumerEvent is what ConsumerConfig.Hook receives: the broker-neutral
// consumer's event, so that one metrics or tracing hook serves every
// driver. Its Message.Raw is the *kgo.Record.
type ConsumerEvent = consume.Event

// ConsumerConfig configures a Consumer. Brokers, Group and Topics are
// required; every other field has a default.
type ConsumerConfig struct {
	// Brokers are the seed brokers. Required.
	Brokers []string
	// Group is the Kafka consumer group. Required.
	Group string
	// Topics are consumed by the group. Required.
	Topics []string
	// ConsumerID is the processed_event.consumer_id of this consumer.
	// Defaults to Group.
	ConsumerID string
	// EventID derives a record's dedup key. Defaults to RecordEventID: the
	// event-id header, else topic/partition/offset.
	EventID func(*kgo.Record) string
	// Batch processes the records of one partition fetched together in one
	// transaction (each still deduplicated). If a handler fails, the batch
	// transaction rolls back and that batch is processed record by record.
	// Defaults to false (one transaction per record).
	Batch bool
	// MaxPollRecords bounds the records taken per poll, hence per batch.
	// Defaults to ConsumerMaxPollRecordsDefault (500).
	MaxPollRecords int
	// MaxAttempts is how many times the handler runs for one record before
	// it is dead-lettered. Defaults to ConsumerMaxAttemptsDefault (5).
	MaxAttempts int
	// BackoffMin is the ceiling of the pause after the first failed
	// attempt; it doubles per failure up to BackoffMax, with full jitter.
	// Defaults to ConsumerBackoffMinDefault (100ms).
	BackoffMin time.Duration
	// BackoffMax caps the pause, and is the interval at which a stuck
	// record's dead-letter is retried. Defaults to
	// ConsumerBackoffMaxDefault (5s).
	BackoffMax time.Duration
	// DeadLetterTopic receives records the handler gave up on. Defaults to
	// the record's topic + DeadLetterSuffixDefault (".dlq").
	DeadLetterTopic string
	// SkipDeadLetterTopicCheck turns off Start's check that every
	// dead-letter topic exists (ErrDeadLetterTopicMissing): for a broker
	// that creates topics on first use, or when the consumed topics are
	// patterns (kgo.ConsumeRegex). Without the check, a missing topic
	// shows only when the first poison record arrives. Defaults to false
	// (Start checks).
	SkipDeadLetterTopicCheck bool
	// DeadLetterAttempts is how many dead-letter produces a record gets
	// before it is reported stuck (consume.KindStuck); a stuck record holds
	// only its partition, and its produce is retried every BackoffMax.
	// Defaults to ConsumerDeadLetterAttemptsDefault (3).
	DeadLetterAttempts int
	// DeadLetterTimeout bounds one dead-letter produce. Defaults to
	// ConsumerDeadLetterTimeoutDefault (10s).
	DeadLetterTimeout time.Duration
	// InboxForm is the SQL form of the dedup insert. Defaults to
	// inbox.FormDefault.
	InboxForm inbox.Form
	// CommitTimeout bounds each offset commit and the final group leave.
	// Defaults to ConsumerCommitTimeoutDefault (10s).
	CommitTimeout time.Duration
	// Retention is how long processed_event rows are kept: the consumer
	// purges older ones while it runs (see consume.Config.Retention).
	// Defaults to inbox.RetentionDefault (7 days).
	Retention time.Duration
	// PurgeInterval is the pause between two purge passes. Defaults to
	// inbox.PurgeIntervalDefault (1 minute).
	PurgeInterval time.Duration
	// PurgeBatchSize is the most rows one purge DELETE removes. Defaults
	// to inbox.PurgeBatchSizeDefault (1000).
	PurgeBatchSize int
	// DisablePurge turns the consumer's own purge of processed_event off
	// (rows kept for ever, or purged by an inbox.Purger of your own).
	// Defaults to false (the consumer purges).
	DisablePurge bool
	// Prepare, when set, runs for each record before its transaction, with
	// no transaction open: the place for an external call (a payment
	// provider) whose outcome the handler then records. Its result reaches
	// the handler through PreparedFromContext. Per record: a read of
	// processed_event outside any transaction (inbox.Seen; a record
	// already processed skips Prepare and is a duplicate), then Prepare,
	// then the handler's transaction. Prepare is at-least-once: its effect
	// must be idempotent (a call with a key fixed in the record). Errors
	// count as handler failures. ctx ends only on a hard stop. Not
	// allowed with Batch. See consume.Config.Prepare. Defaults to nil.
	Prepare func(ctx context.Context, rec *kgo.Record) (any, error)
	// Hook observes every record and offset commit (see consume.Kind):
	// begin (the ctx it returns becomes the handler's), processed,
	// duplicate, retried, dead-lettered, dead-letter failed, stuck,
	// abandoned, committed. It runs on the processing goroutine and must be
	// fast. Defaults to nil.
	Hook func(ctx context.Context, e ConsumerEvent) context.Context
	// Logger receives errors that the consumer retries or works around.
	// Defaults to slog.Default().
	Logger *slog.Logger
	// ClientOpts are extra franz-go options (TLS, SASL, reset offset…),
	// applied after the consumer's own. Options that change committing or
	// rebalancing (autocommit, OnPartitions*) break the guarantee; a static
	// kgo.InstanceID makes Stop keep the partitions reserved until the
	// session times out instead of handing them over; a kgo.WithContext
	// replaces the consumer's own, which lets a stop abandon a group leave
	// that a rebalance holds past the stop's deadline. Defaults to none.
	ClientOpts []kgo.Opt
}

func (c *ConsumerConfig) setDefaults() {
	if c.ConsumerID == "" {
		c.ConsumerID = c.Group
	}
	if c.EventID == nil {
		c.EventID = RecordEventID
	}
	if c.MaxPollRecords == 0 {
		c.MaxPollRecords = ConsumerMaxPollRecordsDefault
	}
	if c.CommitTimeout == 0 {
		c.CommitTimeout = ConsumerCommitTimeoutDefault
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	// The rest is defaulted, and validated, by consume.New.
}

// validate checks the fields the core does not know; consume.New checks
// the others (after its own defaults), wrapping this package's sentinel.
func (c *ConsumerConfig) validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...)
	}
	switch {
	case len(c.Brokers) == 0:
		return bad("Brokers is empty")
	case c.Group == "":
		return bad("Group is empty")
	case len(c.Topics) == 0:
		return bad("Topics is empty")
	case c.MaxPollRecords < 0:
		return bad("MaxPollRecords %d is negative", c.MaxPollRecords)
	case c.CommitTimeout < 0:
		return bad("CommitTimeout %v is negative", c.CommitTimeout)
	}
	for _, t := range c.Topics {
		if t == "" {
			return bad("Topics has an empty name")
		}
	}
	return nil
}
