package natsjs

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/outbox"
)

// Defaults.
const (
	// MaxMsgSizeDefault is what Check lets through: the NATS server's
	// default max_payload (1 MiB), which bounds a message with its
	// headers.
	MaxMsgSizeDefault = 1 << 20
	// DuplicatesDefault is StreamConfig's duplicate window: JetStream's
	// default. A re-send of an event within it is dropped at the broker.
	DuplicatesDefault = 2 * time.Minute
)

// HeaderMsgID is JetStream's dedup header: the Publisher sets it to the
// event id.
const HeaderMsgID = jetstream.MsgIDHeader

// Errors.
var (
	// ErrInvalidConfig wraps every configuration error.
	ErrInvalidConfig = errors.New("natsjs: invalid config")
	// ErrBadTopic is a topic that cannot start a NATS subject.
	ErrBadTopic = errors.New("natsjs: topic is not a valid subject prefix")
)

// Subject is the subject an event is published on:
// topic.<aggregate type>.<aggregate id>, each of the last two a subject
// token (see Token). One aggregate is one subject, which JetStream keeps
// in order.
func Subject(topic, aggregateType, aggregateID string) string {
	return topic + "." + Token(aggregateType) + "." + Token(aggregateID)
}

// Token makes s a subject token: s itself when it is made of ASCII
// letters, digits, '-' and '_' only, else "~" followed by s in unpadded
// base64url (which never has a '~'), so that two values never share a
// token and a token never holds '.', '*', '>' or a space.
func Token(s string) string {
	if s != "" && safeToken(s) {
		return s
	}
	return "~" + base64.RawURLEncoding.EncodeToString([]byte(s))
}

// ParseToken is Token's inverse.
func ParseToken(tok string) (string, error) {
	if !strings.HasPrefix(tok, "~") {
		return tok, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(tok[1:])
	return string(b), err
}

func safeToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// ValidTopic reports whether topic can start a subject: dot-separated
// tokens of ASCII letters, digits, '-' and '_'.
func ValidTopic(topic string) error {
	if topic == "" {
		return fmt.Errorf("%w: empty", ErrBadTopic)
	}
	for _, t := range strings.Split(topic, ".") {
		if t == "" || !safeToken(t) {
			return fmt.Errorf("%w: %q (dot-separated tokens of letters, digits, '-', '_')", ErrBadTopic, topic)
		}
	}
	return nil
}

// StreamName is the JetStream stream that holds topic: the topic with '.'
// replaced by '_' (stream names cannot hold a dot). Two topics that differ
// only there ("a.b", "a_b") would share a name: StreamConfig's creation
// of the second then fails, it never mixes them.
func StreamName(topic string) string { return strings.ReplaceAll(topic, ".", "_") }

// StreamConfig is the stream idem expects for topic: named StreamName(topic),
// capturing topic.*.* (every aggregate's subject, and nothing of a longer
// topic such as topic.dlq, whose subjects have one token more), file
// storage, limits retention (consumers and audits read it from the start),
// and a duplicate window of DuplicatesDefault. Widen Duplicates to the
// longest a relay may take to re-send an event (its publish deadline plus
// its backoff, or a lease's expiry) to drop more re-sends at the broker;
// the consumers' inbox drops the rest. Create it with
// jetstream.JetStream.CreateOrUpdateStream.
func StreamConfig(topic string) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:       StreamName(topic),
		Subjects:   []string{topic + ".*.*"},
		Storage:    jetstream.FileStorage,
		Retention:  jetstream.LimitsPolicy,
		Duplicates: DuplicatesDefault,
	}
}

// PublisherConfig configures a Publisher. A nil config means all defaults.
type PublisherConfig struct {
	// Prefix, when set, goes before every topic: the event of topic t is
	// published as if its topic were Prefix.t (an environment or tenant
	// namespace on a shared server; tests use one per test). Dot-separated
	// tokens, like a topic. Defaults to "" (none).
	Prefix string
	// MaxMsgSize is the largest message (payload and headers) Check lets
	// through: the server's max_payload, or the streams' MaxMsgSize if
	// smaller. Defaults to MaxMsgSizeDefault (1 MiB).
	MaxMsgSize int
}

// Publisher is an outbox.Publisher (and outbox.Checker) on JetStream: each
// event is a message on Subject(topic, aggregate type, aggregate id), with
// Nats-Msg-Id = event id, so that JetStream's duplicate window drops the
// relay's re-sends, headers event-id, event-type, aggregate-type,
// aggregate-seq and the event's own, and the payload as data.
//
// Order: an aggregate's events in a call are published one after the
// other, each once the previous one is acknowledged (the others' side by
// side, asynchronously): a failed event never lets a later one of its
// aggregate through, and a subject's messages are stored in the order they
// were acknowledged.
type Publisher struct {
	js      jetstream.JetStream
	prefix  string
	maxSize int
}

var (
	_ outbox.Publisher = (*Publisher)(nil)
	_ outbox.Checker   = (*Publisher)(nil)
)

// NewPublisher returns a publisher on js, whose connection the caller owns
// and closes. The streams must exist (StreamConfig): a subject no stream
// captures fails its events.
func NewPublisher(js jetstream.JetStream, cfg *PublisherConfig) (*Publisher, error) {
	if js == nil {
		return nil, fmt.Errorf("%w: JetStream is nil", ErrInvalidConfig)
	}
	c := PublisherConfig{}
	if cfg != nil {
		c = *cfg
	}
	if c.MaxMsgSize == 0 {
		c.MaxMsgSize = MaxMsgSizeDefault
	}
	if c.MaxMsgSize < 0 {
		return nil, fmt.Errorf("%w: MaxMsgSize %d is negative", ErrInvalidConfig, c.MaxMsgSize)
	}
	if c.Prefix != "" {
		if err := ValidTopic(c.Prefix); err != nil {
			return nil, fmt.Errorf("%w: Prefix: %w", ErrInvalidConfig, err)
		}
	}
	return &Publisher{js: js, prefix: c.Prefix, maxSize: c.MaxMsgSize}, nil
}

// Check refuses, before anything is sent, an event whose topic cannot
// start a subject and one larger than MaxMsgSize.
func (p *Publisher) Check(e outbox.Event) error {
	if err := ValidTopic(e.Topic); err != nil {
		return fmt.Errorf("natsjs: event %s: %w", e.EventID, err)
	}
	if n := msgSize(p.msg(&e)); n > p.maxSize {
		return fmt.Errorf("natsjs: event %s: %w (%d bytes, limit %d)", e.EventID, nats.ErrMaxPayload, n, p.maxSize)
	}
	return nil
}

func msgSize(m *nats.Msg) int {
	n := len(m.Data) + len(m.Subject) + 16
	for k, vs := range m.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

// WithPrefix is topic under prefix ("" leaves it as it is).
func WithPrefix(prefix, topic string) string {
	if prefix == "" {
		return topic
	}
	return prefix + "." + topic
}

func (p *Publisher) msg(e *outbox.Event) *nats.Msg { return Msg(WithPrefix(p.prefix, e.Topic), e) }

// Msg is the NATS message Publisher sends for e on topic (e.Topic, or it
// under the Publisher's Prefix). The event's own headers are written
// first and idem's last, so idem's win: a header of a name idem reserves
// (idem.IsReservedHeader, refused at enqueue since, but an older row may
// hold one) or JetStream's dedup name (HeaderMsgID) is dropped in any
// case, whatever its letter case.
func Msg(topic string, e *outbox.Event) *nats.Msg {
	h := nats.Header{}
	for _, k := range slices.Sorted(maps.Keys(e.Headers)) {
		if idem.IsReservedHeader(k) || strings.EqualFold(k, HeaderMsgID) {
			continue
		}
		// Set, not Add: a nats.Header canonicalises nothing (it is a plain
		// map), so the event's own names are kept as they are.
		h[k] = []string{e.Headers[k]}
	}
	h[HeaderMsgID] = []string{e.EventID}
	h[idem.HeaderEventID] = []string{e.EventID}
	h[idem.HeaderEventType] = []string{e.EventType}
	h[idem.HeaderAggregateType] = []string{e.AggregateType}
	h[idem.HeaderAggregateSeq] = []string{strconv.FormatInt(e.Seq, 10)}
	return &nats.Msg{Subject: Subject(topic, e.AggregateType, e.AggregateID), Header: h, Data: e.Payload}
}

// Publish sends events and waits for every acknowledgement, or for ctx's
// deadline. It returns nil when every event was stored (or dropped by the
// stream as a duplicate of one stored), else an *outbox.BatchError with
// Errs[i] the result of events[i]; an event unanswered by the deadline is
// failed with ctx's error (its outcome is unknown: a re-send within the
// duplicate window is dropped at the broker).
//
// Step by step: the events go out in rounds; round k holds the k-th event
// of every aggregate of the call, published asynchronously side by side;
// round k+1 starts once round k is answered, without the aggregates that
// failed in it (their later events are failed as held back).
func (p *Publisher) Publish(ctx context.Context, events []outbox.Event) error {
	if len(events) == 0 {
		return nil
	}
	errs := make([]error, len(events))
	type agg struct{ typ, id string }
	var rounds [][]int
	pos := map[agg]int{}
	for i := range events {
		a := agg{events[i].AggregateType, events[i].AggregateID}
		k := pos[a]
		pos[a] = k + 1
		if k == len(rounds) {
			rounds = append(rounds, nil)
		}
		rounds[k] = append(rounds[k], i)
	}
	failed := map[agg]error{}
	for _, round := range rounds {
		futures := make([]jetstream.PubAckFuture, len(round))
		for k, i := range round {
			e := &events[i]
			if err, ok := failed[agg{e.AggregateType, e.AggregateID}]; ok {
				errs[i] = fmt.Errorf("natsjs: %s held back: an earlier event of its aggregate failed: %w", e.EventID, err)
				continue
			}
			if ctx.Err() != nil {
				errs[i] = fmt.Errorf("natsjs: publish %s: not sent by the deadline: %w", e.EventID, ctx.Err())
				failed[agg{e.AggregateType, e.AggregateID}] = errs[i]
				continue
			}
			f, err := p.js.PublishMsgAsync(p.msg(e), jetstream.WithMsgID(e.EventID))
			if err != nil {
				errs[i] = fmt.Errorf("natsjs: publish %s to %s: %w", e.EventID, e.Topic, err)
				failed[agg{e.AggregateType, e.AggregateID}] = err
				continue
			}
			futures[k] = f
		}
		for k, i := range round {
			f := futures[k]
			if f == nil {
				continue
			}
			e := &events[i]
			var err error
			select {
			case <-f.Ok():
				continue
			case err = <-f.Err():
			case <-ctx.Done():
				// An answer that came before the deadline counts: a select
				// with both ready picks at random, and an earlier future of
				// the round may have used up the wait.
				select {
				case <-f.Ok():
					continue
				case err = <-f.Err():
				default:
					err = fmt.Errorf("no acknowledgement by the deadline, outcome unknown: %w", ctx.Err())
				}
			}
			errs[i] = fmt.Errorf("natsjs: publish %s to %s: %w", e.EventID, e.Topic, err)
			failed[agg{e.AggregateType, e.AggregateID}] = err
		}
	}
	for _, err := range errs {
		if err != nil {
			return &outbox.BatchError{Errs: errs}
		}
	}
	return nil
}
