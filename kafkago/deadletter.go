package kafkago

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/consume"
)

// ErrDeadLetterTopicMissing is returned by the consumer's Start when a
// dead-letter topic it would write to does not exist on the broker (see
// ConsumerConfig.SkipDeadLetterTopicCheck). The error names the topics.
var ErrDeadLetterTopicMissing = errors.New("kafkago: dead-letter topic missing")

// newWriter is a session's dead-letter Writer (and the check's transport).
func (d *driver) newWriter() *kafka.Writer {
	w := &kafka.Writer{
		Addr:         kafka.TCP(d.cfg.Brokers...),
		Balancer:     &kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll,
		BatchBytes:   d.cfg.DeadLetterMaxBytes,
		BatchTimeout: WriterBatchTimeout,
		// The consumer bounds and retries each dead-letter itself.
		MaxAttempts: 3,
		Transport:   &kafka.Transport{},
	}
	if d.cfg.Writer != nil {
		d.cfg.Writer(w)
	}
	return w
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

// deadLetterCheckTimeout bounds Start's dead-letter check when the
// broker does not answer.
const deadLetterCheckTimeout = 5 * time.Second

// CheckDeadLetter is consume.DeadLetterChecker: unless
// SkipDeadLetterTopicCheck, it asks the broker (a metadata request, which
// never creates a topic) whether every dead-letter topic exists, through
// the dead-letter Writer's address and Transport (cfg.Writer's TLS or
// SASL apply). A missing one is ErrDeadLetterTopicMissing, naming it. A
// broker that cannot be asked (down, unreachable, within ctx and
// deadLetterCheckTimeout) is logged and not an error: an unreachable
// broker shows in the Reader's fetches, as it always did, and a service
// whose broker restarts while it starts still starts.
func (d *driver) CheckDeadLetter(ctx context.Context) error {
	if d.cfg.SkipDeadLetterTopicCheck {
		return nil
	}
	topics := d.cfg.deadLetterTopics()
	ctx, cancel := context.WithTimeout(ctx, deadLetterCheckTimeout)
	defer cancel()
	w := d.newWriter()
	if t, ok := w.Transport.(*kafka.Transport); ok {
		defer t.CloseIdleConnections()
	}
	md, err := (&kafka.Client{Addr: w.Addr, Transport: w.Transport}).Metadata(ctx, &kafka.MetadataRequest{Topics: topics})
	if err != nil {
		d.log.Warn("dead-letter topic check skipped: the broker did not answer", "topics", strings.Join(topics, ","), "err", err)
		return nil
	}
	found := map[string]error{}
	for _, t := range md.Topics {
		found[t.Name] = t.Error
	}
	var missing []string
	for _, t := range topics {
		terr, ok := found[t]
		switch {
		case !ok || errors.Is(terr, kafka.UnknownTopicOrPartition):
			missing = append(missing, t)
		case terr != nil:
			return fmt.Errorf("kafkago: dead-letter check: topic %s: %w", t, terr)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s (create it, e.g. with kafka.EnsureTopics, or set ConsumerConfig.SkipDeadLetterTopicCheck for a broker that creates topics on first use)",
			ErrDeadLetterTopicMissing, strings.Join(missing, ", "))
	}
	return nil
}

// DeadLetter writes a copy of m to the dead-letter topic with the
// dead-letter headers (consume.DeadLetter.CopyHeaders) and waits for the
// broker's acknowledgement, or for ctx.
//
// A copy too large for the Writer (DeadLetterMaxBytes) or the topic (the
// broker's MESSAGE_TOO_LARGE) is replaced by a reference copy, as package
// kafka does: no value, the key and the event headers when each is at
// most 1 KiB, the dlq-* headers, and dlq-truncated "true" with dlq-size,
// the original's size (consume.DeadLetter.ReferenceHeaders). The
// partition moves on; the original stays readable at dlq-source until
// the source topic's retention deletes it (idem dlq show and redrive read
// it there).
func (s *session) DeadLetter(ctx context.Context, m *consume.Message, dl consume.DeadLetter) error {
	km := m.Raw.(*kafka.Message)
	topic := s.cfg.DeadLetterTopic
	if topic == "" {
		topic = km.Topic + DeadLetterSuffixDefault
	}
	err := s.w.WriteMessages(ctx, kafka.Message{Topic: topic, Key: km.Key, Value: km.Value, Headers: headers(dl.CopyHeaders(m, source(km)))})
	if !tooLarge(err) {
		return err
	}
	// Held, the message would stop its partition on every attempt until
	// an operator raised a limit: dead-letter where it is instead (see
	// package kafka's session.DeadLetter for the same step).
	ref := kafka.Message{Topic: topic, Key: consume.ReferenceKey(m), Headers: headers(dl.ReferenceHeaders(m, source(km)))}
	if rerr := s.w.WriteMessages(ctx, ref); rerr != nil {
		return fmt.Errorf("kafkago: dead-letter copy too large (%w), and its reference copy failed: %w", err, rerr)
	}
	s.log.Warn("dead-lettered a reference copy: the message is too large to dead-letter whole; its value stays in the source topic",
		"source", source(km), "size", consume.MessageSize(m), "dead_letter_topic", topic, "err", err)
	return nil
}

func headers(hs []consume.Header) []kafka.Header {
	out := make([]kafka.Header, len(hs))
	for i, h := range hs {
		out[i] = kafka.Header{Key: h.Key, Value: h.Value}
	}
	return out
}

// tooLarge reports a write refused for its size: locally (the Writer's
// BatchBytes, MessageTooLargeError) or by the broker (MESSAGE_TOO_LARGE,
// RECORD_LIST_TOO_LARGE, inside WriteErrors).
func tooLarge(err error) bool {
	if err == nil {
		return false
	}
	is := func(e error) bool {
		return errors.Is(e, kafka.MessageSizeTooLarge) || errors.Is(e, kafka.RecordListTooLarge)
	}
	var we kafka.WriteErrors
	if errors.As(err, &we) {
		for _, e := range we {
			if e != nil && is(e) {
				return true
			}
		}
		return false
	}
	return is(err)
}
