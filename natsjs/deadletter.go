package natsjs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consume"
)

// ErrDeadLetterTopicMissing is returned by the consumer's Start when no
// stream captures the subjects of a dead-letter topic it would publish to
// (see ConsumerConfig.SkipDeadLetterTopicCheck). The error names the
// topics and the stream StreamConfig would make for each.
var ErrDeadLetterTopicMissing = errors.New("natsjs: dead-letter topic has no stream")

// options are the connection options every connection of the driver
// takes: its name, then the caller's.
func (d *driver) options() []nats.Option {
	return append([]nats.Option{nats.Name("idem-" + d.cfg.Group)}, d.cfg.Options...)
}

// deadLetterTopics names the topics the consumer dead-letters to, under
// the prefix: the configured one, else each consumed topic's with
// DeadLetterSuffixDefault.
func (c *ConsumerConfig) deadLetterTopics() []string {
	if c.DeadLetterTopic != "" {
		return []string{WithPrefix(c.Prefix, c.DeadLetterTopic)}
	}
	out := make([]string, 0, len(c.Topics))
	for _, t := range c.Topics {
		out = append(out, WithPrefix(c.Prefix, t+DeadLetterSuffixDefault))
	}
	return out
}

// deadLetterCheckTimeout bounds Start's dead-letter check when the server
// does not answer.
const deadLetterCheckTimeout = 5 * time.Second

// CheckDeadLetter is consume.DeadLetterChecker: unless
// SkipDeadLetterTopicCheck, it asks JetStream, on a connection of its own
// (the driver's Options apply), which stream captures each dead-letter
// topic's subjects (topic.*.*, as StreamConfig makes). A topic that no
// stream captures is ErrDeadLetterTopicMissing, naming it. A server that
// cannot be asked (down, unreachable, JetStream off, within ctx and
// deadLetterCheckTimeout) is logged and not an error: an unreachable
// server shows in Fetch, as it always did.
func (d *driver) CheckDeadLetter(ctx context.Context) error {
	if d.cfg.SkipDeadLetterTopicCheck {
		return nil
	}
	topics := d.cfg.deadLetterTopics()
	ctx, cancel := context.WithTimeout(ctx, deadLetterCheckTimeout)
	defer cancel()
	skipped := func(err error) error {
		d.log.Warn("dead-letter topic check skipped: the server did not answer", "topics", strings.Join(topics, ","), "err", err)
		return nil
	}
	nc, err := nats.Connect(d.cfg.URL, append(d.options(), nats.Timeout(deadLetterCheckTimeout))...)
	if err != nil {
		return skipped(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return skipped(err)
	}
	var missing []string
	for _, t := range topics {
		_, err := js.StreamNameBySubject(ctx, t+".*.*")
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			missing = append(missing, fmt.Sprintf("%s (subjects %s.*.*, stream %s)", t, t, StreamName(t)))
		case err != nil:
			return skipped(err)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s: create it (natsjs.StreamConfig), or set ConsumerConfig.SkipDeadLetterTopicCheck",
			ErrDeadLetterTopicMissing, strings.Join(missing, ", "))
	}
	return nil
}

// DeadLetter publishes a copy of m on the dead-letter topic's subject for
// the same aggregate, with the dead-letter headers
// (consume.DeadLetter.CopyHeaders), and waits for JetStream's
// acknowledgement. The copy keeps m's Nats-Msg-Id: a second dead-letter
// of m within the duplicate window (a crash between the dead-letter and
// the ack) is dropped by the dead-letter stream.
//
// A copy too large for the connection (the server's max_payload,
// nats.ErrMaxPayload) or the dead-letter stream (its MaxMsgSize) is
// replaced by a reference copy, as package kafka does: no value, the
// event headers and Nats-Msg-Id when each is at most 1 KiB, the dlq-*
// headers, and dlq-truncated "true" with dlq-size, the original's size
// (consume.DeadLetter.ReferenceHeaders); dlq-source is "stream/sequence".
// The subject moves on; the original stays readable in its stream at
// that sequence until the stream's limits delete it.
func (s *session) DeadLetter(ctx context.Context, m *consume.Message, dl consume.DeadLetter) error {
	jm := m.Raw.(jetstream.Msg)
	topic := s.cfg.DeadLetterTopic
	if topic == "" {
		topic = m.Topic + DeadLetterSuffixDefault
	}
	subject := WithPrefix(s.cfg.Prefix, topic)
	if rest, ok := strings.CutPrefix(jm.Subject(), WithPrefix(s.cfg.Prefix, m.Topic)+"."); ok {
		subject += "." + rest
	}
	src := source(jm)
	msgID := jm.Headers().Get(HeaderMsgID)
	if msgID == "" {
		msgID = m.EventID
	}
	h := header(dl.CopyHeaders(m, src))
	if h.Get(HeaderMsgID) == "" && msgID != "" {
		h.Set(HeaderMsgID, msgID)
	}
	_, err := s.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: h, Data: jm.Data()})
	if !tooLarge(err) {
		return err
	}
	// Held, the message would stop its subject on every attempt until an
	// operator raised a limit: dead-letter where it is instead.
	ref := header(dl.ReferenceHeaders(m, src))
	if msgID != "" && len(msgID) <= consume.ReferenceFieldMaxBytes {
		ref.Set(HeaderMsgID, msgID)
	}
	if _, rerr := s.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: ref}); rerr != nil {
		return fmt.Errorf("natsjs: dead-letter copy too large (%w), and its reference copy failed: %w", err, rerr)
	}
	s.log.Warn("dead-lettered a reference copy: the message is too large to dead-letter whole; its value stays in the source stream",
		"source", src, "size", consume.MessageSize(m), "dead_letter_subject", subject, "err", err)
	return nil
}

// header converts the shared dead-letter headers to a NATS header: a
// repeated name keeps its values in order, except the dlq-* headers, of
// which the last wins (a message dead-lettered again after a redrive
// carries the new ones only).
func header(hs []consume.Header) nats.Header {
	h := nats.Header{}
	for _, x := range hs {
		if idem.IsReservedHeader(x.Key) && strings.HasPrefix(x.Key, "dlq-") {
			h[x.Key] = []string{string(x.Value)}
			continue
		}
		h[x.Key] = append(h[x.Key], string(x.Value))
	}
	return h
}

// tooLarge reports a publish refused for its size: by the client (the
// server's max_payload) or by the stream (MaxMsgSize).
func tooLarge(err error) bool {
	if errors.Is(err, nats.ErrMaxPayload) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum
}
