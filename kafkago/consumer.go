package kafkago

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consume"
)

// Consumer defaults.
const (
	// MaxPollRecordsDefault bounds the messages one Fetch hands over.
	MaxPollRecordsDefault = 500
	// MaxHeldMessagesDefault bounds, per held partition, the later
	// messages the driver keeps back in memory (see the package doc).
	MaxHeldMessagesDefault = 10_000
	// DeadLetterSuffixDefault is appended to a message's topic to name its
	// dead-letter topic when ConsumerConfig.DeadLetterTopic is empty.
	DeadLetterSuffixDefault = ".dlq"
	// DeadLetterMaxBytesDefault bounds a dead-letter copy (kafka-go's
	// Writer BatchBytes default).
	DeadLetterMaxBytesDefault = 1 << 20
	// MaxWaitDefault is the Reader's fetch wait (kafka-go's own is 10s).
	MaxWaitDefault = 500 * time.Millisecond
)

// ConsumerConfig configures the kafka-go driver (NewDriver) and
// NewConsumer. Brokers, Group and Topics are required; every other field
// has a default.
type ConsumerConfig struct {
	// Brokers are the seed brokers. Required.
	Brokers []string
	// Group is the Kafka consumer group. Required.
	Group string
	// Topics are consumed by the group. Required.
	Topics []string
	// EventID derives a message's dedup key. Defaults to MessageEventID:
	// the event-id header, else topic/partition/offset.
	EventID func(*kafka.Message) string
	// MaxPollRecords bounds the messages one Fetch hands over, hence a
	// batch. Defaults to MaxPollRecordsDefault (500).
	MaxPollRecords int
	// MaxHeldMessages bounds, per held partition, the later messages kept
	// back in memory; past it they are dropped and fetched again after the
	// hold, by reconnecting the Reader. Defaults to MaxHeldMessagesDefault
	// (10000).
	MaxHeldMessages int
	// DeadLetterTopic receives the messages the consumer gave up on.
	// Defaults to the message's topic + DeadLetterSuffixDefault (".dlq").
	DeadLetterTopic string
	// SkipDeadLetterTopicCheck turns off Start's check that every
	// dead-letter topic exists (ErrDeadLetterTopicMissing): for a broker
	// that creates topics on first use. Without the check, a missing
	// topic shows only when the first poison message arrives. Defaults to
	// false (Start checks).
	SkipDeadLetterTopicCheck bool
	// DeadLetterMaxBytes bounds a dead-letter copy (its Writer's
	// BatchBytes): a larger copy, or one the broker refuses as too large
	// (the topic's max.message.bytes), is replaced by a reference copy
	// (see the package doc) and the partition moves on. Defaults to
	// DeadLetterMaxBytesDefault (1 MiB).
	DeadLetterMaxBytes int64
	// Reader, when set, adjusts the kafka.ReaderConfig after the driver
	// filled it in (Dialer for TLS or SASL, session and rebalance
	// timeouts, MaxWait). Fields that change committing or the group
	// (GroupID, GroupTopics, CommitInterval, Partition) break the
	// guarantee. Defaults to nil.
	Reader func(*kafka.ReaderConfig)
	// Writer, when set, adjusts the dead-letter Writer after the driver
	// made it (Transport for TLS or SASL). Defaults to nil.
	Writer func(*kafka.Writer)
	// Logger receives what the driver retries or works around. Defaults
	// to slog.Default().
	Logger *slog.Logger
}

func (c *ConsumerConfig) setDefaults() {
	if c.EventID == nil {
		c.EventID = MessageEventID
	}
	if c.MaxPollRecords == 0 {
		c.MaxPollRecords = MaxPollRecordsDefault
	}
	if c.MaxHeldMessages == 0 {
		c.MaxHeldMessages = MaxHeldMessagesDefault
	}
	if c.DeadLetterMaxBytes == 0 {
		c.DeadLetterMaxBytes = DeadLetterMaxBytesDefault
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

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
	case c.MaxPollRecords < 1:
		return bad("MaxPollRecords %d is below 1", c.MaxPollRecords)
	case c.MaxHeldMessages < 1:
		return bad("MaxHeldMessages %d is below 1", c.MaxHeldMessages)
	case c.DeadLetterMaxBytes < 1:
		return bad("DeadLetterMaxBytes %d is below 1", c.DeadLetterMaxBytes)
	}
	for _, t := range c.Topics {
		if t == "" {
			return bad("Topics has an empty name")
		}
	}
	return nil
}

// MessageEventID is the default ConsumerConfig.EventID: the event-id
// header if present and non-empty, else "topic/partition/offset", which is
// stable across redeliveries of the same message but not across
// re-publishes (package kafka's RecordEventID, on a kafka-go message).
func MessageEventID(m *kafka.Message) string {
	for _, h := range m.Headers {
		if h.Key == idem.HeaderEventID && len(h.Value) > 0 {
			return string(h.Value)
		}
	}
	return source(m)
}

func source(m *kafka.Message) string {
	return m.Topic + "/" + strconv.Itoa(m.Partition) + "/" + strconv.FormatInt(m.Offset, 10)
}

// NewDriver returns the kafka-go consume.Driver of cfg: run it with
// consume.New. Each session (each Start) makes a group Reader and a
// dead-letter Writer; Close closes both.
func NewDriver(cfg *ConsumerConfig) (consume.Driver, error) {
	c := ConsumerConfig{}
	if cfg != nil {
		c = *cfg
	}
	c.setDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &driver{cfg: c, log: c.Logger.With("consumer", c.Group)}, nil
}

// Handler applies one message's effects inside tx (see consume.Handler):
// the article's handler shape, on the kafka-go message.
type Handler func(ctx context.Context, tx pgx.Tx, m *kafka.Message) error

// NewConsumer is consume.New on the kafka-go driver, with a handler on
// *kafka.Message. cfg configures the driver, ccfg the loop (ConsumerID
// defaults to cfg.Group). See package consume for the guarantee.
func NewConsumer(db consume.DB, handler Handler, cfg *ConsumerConfig, ccfg *consume.Config) (*consume.Consumer, error) {
	if handler == nil {
		return nil, fmt.Errorf("%w: handler is nil", ErrInvalidConfig)
	}
	d, err := NewDriver(cfg)
	if err != nil {
		return nil, err
	}
	cc := consume.Config{}
	if ccfg != nil {
		cc = *ccfg
	}
	if cc.ConsumerID == "" {
		cc.ConsumerID = cfg.Group
	}
	return consume.New(db, d, func(ctx context.Context, tx pgx.Tx, m *consume.Message) error {
		return handler(ctx, tx, MessageOf(m))
	}, &cc)
}

// MessageOf returns the kafka-go message behind m (nil if m is not from
// this driver).
func MessageOf(m *consume.Message) *kafka.Message {
	if m == nil {
		return nil
	}
	km, _ := m.Raw.(*kafka.Message)
	return km
}
