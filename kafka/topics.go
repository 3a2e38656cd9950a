package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ErrDeadLetterTopicMissing is returned by Consumer.Start when a
// dead-letter topic the consumer would produce to does not exist on the
// broker (see ConsumerConfig.SkipDeadLetterTopicCheck). The error names
// the topics.
var ErrDeadLetterTopicMissing = errors.New("kafka: dead-letter topic missing")

// EnsureTopics creates those of topics that do not exist yet, each with
// partitions partitions (0 or less: the broker's default) and the
// broker's default replication factor, and leaves the others as they are
// (an existing topic keeps its partitions). It is idempotent and safe to
// run from several processes at once: a topic that another one created
// meanwhile counts as existing. ctx bounds the whole call.
//
// Run it at start, before the relay publishes: a broker that does not
// create topics on first use answers a produce to a missing topic with
// UNKNOWN_TOPIC_OR_PARTITION, which the relay spends attempts on.
func EnsureTopics(ctx context.Context, client *kgo.Client, partitions int32, topics ...string) error {
	if client == nil {
		return errors.New("kafka: EnsureTopics: client is nil")
	}
	var want []string
	for _, t := range topics {
		if t == "" {
			return errors.New("kafka: EnsureTopics: empty topic name")
		}
		if !slices.Contains(want, t) {
			want = append(want, t)
		}
	}
	if len(want) == 0 {
		return nil
	}
	if partitions <= 0 {
		partitions = -1
	}
	resps, err := kadm.NewClient(client).CreateTopics(ctx, partitions, -1, nil, want...)
	if err != nil {
		return fmt.Errorf("kafka: create topics %s: %w", strings.Join(want, ","), err)
	}
	for _, r := range resps.Sorted() {
		if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("kafka: create topic %s: %w", r.Topic, r.Err)
		}
	}
	return nil
}

// deadLetterTopics names the topics the consumer dead-letters to: the
// configured one, else each consumed topic's with DeadLetterSuffixDefault.
func (c *ConsumerConfig) deadLetterTopics() []string {
	if c.DeadLetterTopic != "" {
		return []string{c.DeadLetterTopic}
	}
	out := make([]string, 0, len(c.Topics))
	for _, t := range c.Topics {
		out = append(out, t+DeadLetterSuffixDefault)
	}
	return out
}

// CheckDeadLetter is consume.DeadLetterChecker: checkDeadLetterTopics
// unless SkipDeadLetterTopicCheck.
func (d *driver) CheckDeadLetter(ctx context.Context) error {
	if d.cfg.SkipDeadLetterTopicCheck {
		return nil
	}
	return d.cfg.checkDeadLetterTopics(ctx)
}

// deadLetterCheckTimeout bounds Start's dead-letter check when the
// broker does not answer.
const deadLetterCheckTimeout = 5 * time.Second

// checkDeadLetterTopics asks the broker whether every dead-letter topic
// exists, through a client of its own (the consumer's options, no group:
// it must not join). A missing one is ErrDeadLetterTopicMissing, naming
// it. A broker that cannot be asked (down, unreachable, within ctx and
// deadLetterCheckTimeout) is logged and not an error: an unreachable
// broker shows in the consumer's fetches, as it always did, and a
// service whose broker restarts while it starts still starts.
func (c *ConsumerConfig) checkDeadLetterTopics(ctx context.Context) error {
	topics := c.deadLetterTopics()
	ctx, cancel := context.WithTimeout(ctx, deadLetterCheckTimeout)
	defer cancel()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.Brokers...)}, c.ClientOpts...)...)
	if err != nil {
		return fmt.Errorf("kafka: dead-letter check: client: %w", err)
	}
	defer cl.Close()
	details, err := kadm.NewClient(cl).ListTopics(ctx, topics...)
	if err != nil {
		c.Logger.Warn("dead-letter topic check skipped: the broker did not answer", "consumer", c.ConsumerID, "topics", strings.Join(topics, ","), "err", err)
		return nil
	}
	var missing []string
	for _, t := range topics {
		d, ok := details[t]
		switch {
		case !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition):
			missing = append(missing, t)
		case d.Err != nil:
			return fmt.Errorf("kafka: dead-letter check: topic %s: %w", t, d.Err)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s (create it, e.g. with kafka.EnsureTopics, or set ConsumerConfig.SkipDeadLetterTopicCheck for a broker that creates topics on first use)",
			ErrDeadLetterTopicMissing, strings.Join(missing, ", "))
	}
	return nil
}
