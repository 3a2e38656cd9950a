package natsjs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consume"
)

// Consumer defaults.
const (
	// AckWaitDefault is the durable consumer's AckWait: how long a fetched,
	// unacknowledged message stays with this consumer before JetStream
	// delivers it again. The driver renews it (InProgress) every third of
	// it while the message is in hand, so it bounds the redelivery after a
	// crash, not the time a message may take.
	AckWaitDefault = 30 * time.Second
	// MaxAckPendingDefault is the durable consumer's MaxAckPending: the
	// messages delivered and not yet acknowledged, across every member.
	MaxAckPendingDefault = 1000
	// MaxPollRecordsDefault bounds the messages one Fetch asks for.
	MaxPollRecordsDefault = 100
	// FetchMaxWaitDefault bounds one pull request's wait.
	FetchMaxWaitDefault = 500 * time.Millisecond
	// DeadLetterSuffixDefault is appended to a topic to name its
	// dead-letter topic when ConsumerConfig.DeadLetterTopic is empty.
	DeadLetterSuffixDefault = ".dlq"
)

// ConsumerConfig configures the JetStream driver (NewDriver). URL, Group
// and Topics are required; every other field has a default.
type ConsumerConfig struct {
	// URL is the NATS server URL (nats://host:port, comma-separated for a
	// cluster). Required.
	URL string
	// Options are extra nats.Options (credentials, TLS, name), applied
	// after the driver's own (reconnect forever, never fail the connect).
	// Defaults to none.
	Options []nats.Option
	// Prefix, when set, goes before every topic, the dead-letter topic's
	// too (see PublisherConfig.Prefix). Defaults to "" (none).
	Prefix string
	// Group names the durable pull consumer on each topic's stream, shared
	// by every member of the group. Required.
	Group string
	// Topics are consumed, each from its stream (StreamName). Required.
	Topics []string
	// EventID derives a message's dedup key. Defaults to MessageEventID:
	// the event-id header, else Nats-Msg-Id, else stream/sequence.
	EventID func(jetstream.Msg) string
	// DeadLetterTopic receives the messages the consumer gave up on, on
	// the same aggregate subject under it (its stream must exist:
	// StreamConfig). Defaults to the message's topic + ".dlq".
	DeadLetterTopic string
	// SkipDeadLetterTopicCheck turns off Start's check that a stream
	// captures every dead-letter topic's subjects
	// (ErrDeadLetterTopicMissing). Without the check, a missing stream
	// shows only when the first poison message arrives. Defaults to false
	// (Start checks).
	SkipDeadLetterTopicCheck bool
	// AckWait is the durable consumer's AckWait. Defaults to
	// AckWaitDefault (30s).
	AckWait time.Duration
	// MaxAckPending is the durable consumer's MaxAckPending. Defaults to
	// MaxAckPendingDefault (1000).
	MaxAckPending int
	// MaxPollRecords bounds the messages one Fetch asks for. Defaults to
	// MaxPollRecordsDefault (100).
	MaxPollRecords int
	// FetchMaxWait bounds one pull request's wait, and so how long a stop
	// or a stuck message's retry waits for the Fetch in progress: a pull
	// request always runs to its expiry (see Fetch). Defaults to
	// FetchMaxWaitDefault (500ms).
	FetchMaxWait time.Duration
	// Logger receives what the driver retries or works around. Defaults
	// to slog.Default().
	Logger *slog.Logger
}

func (c *ConsumerConfig) setDefaults() {
	if c.EventID == nil {
		c.EventID = MessageEventID
	}
	if c.AckWait == 0 {
		c.AckWait = AckWaitDefault
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = MaxAckPendingDefault
	}
	if c.MaxPollRecords == 0 {
		c.MaxPollRecords = MaxPollRecordsDefault
	}
	if c.FetchMaxWait == 0 {
		c.FetchMaxWait = FetchMaxWaitDefault
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
	case c.URL == "":
		return bad("URL is empty")
	case c.Group == "" || strings.ContainsAny(c.Group, ".*> \t"):
		return bad("Group %q must be a non-empty consumer name (no '.', '*', '>', spaces)", c.Group)
	case len(c.Topics) == 0:
		return bad("Topics is empty")
	case c.AckWait < 300*time.Millisecond:
		return bad("AckWait %v is below 300ms", c.AckWait)
	case c.MaxAckPending < 1:
		return bad("MaxAckPending %d is below 1", c.MaxAckPending)
	case c.MaxPollRecords < 1:
		return bad("MaxPollRecords %d is below 1", c.MaxPollRecords)
	case c.FetchMaxWait < 10*time.Millisecond:
		return bad("FetchMaxWait %v is below 10ms", c.FetchMaxWait)
	}
	for _, t := range c.Topics {
		if err := ValidTopic(t); err != nil {
			return bad("Topics: %v", err)
		}
	}
	if c.Prefix != "" {
		if err := ValidTopic(c.Prefix); err != nil {
			return bad("Prefix: %v", err)
		}
	}
	if c.DeadLetterTopic != "" {
		if err := ValidTopic(c.DeadLetterTopic); err != nil {
			return bad("DeadLetterTopic: %v", err)
		}
	}
	return nil
}

// ConsumerConfig returns the durable consumer the driver creates (or
// updates) on each topic's stream: explicit acks, after the database
// commit; every message from the start; MaxDeliver unlimited, so that
// JetStream never drops a message the consume.Consumer has not given up
// on (its MaxAttempts and dead-letter path decide); AckWait and
// MaxAckPending from c.
func (c *ConsumerConfig) consumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       c.Group,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.AckWait,
		MaxDeliver:    -1,
		MaxAckPending: c.MaxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
}

// MessageEventID is the default ConsumerConfig.EventID: the event-id
// header if present and non-empty, else Nats-Msg-Id, else
// "stream/sequence", which is stable across redeliveries of one message
// but not across re-publishes.
func MessageEventID(m jetstream.Msg) string {
	if id := m.Headers().Get(idem.HeaderEventID); id != "" {
		return id
	}
	if id := m.Headers().Get(HeaderMsgID); id != "" {
		return id
	}
	return source(m)
}

func source(m jetstream.Msg) string {
	md, err := m.Metadata()
	if err != nil {
		return m.Subject()
	}
	return md.Stream + "/" + strconv.FormatUint(md.Sequence.Stream, 10)
}

// NewDriver returns the JetStream consume.Driver of cfg: run it with
// consume.New. Each session (each Start) opens a connection of its own.
func NewDriver(cfg *ConsumerConfig) (consume.Driver, error) {
	c := ConsumerConfig{}
	if cfg != nil {
		c = *cfg
		c.Topics = slices.Clone(cfg.Topics)
	}
	c.setDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &driver{cfg: c, log: c.Logger.With("consumer", c.Group)}, nil
}

// Handler applies one message's effects inside tx (see consume.Handler),
// on the JetStream message.
type Handler func(ctx context.Context, tx pgx.Tx, m jetstream.Msg) error

// NewConsumer is consume.New on the JetStream driver, with a handler on
// jetstream.Msg. cfg configures the driver, ccfg the loop (ConsumerID
// defaults to cfg.Group). See package consume for the guarantee.
func NewConsumer(db consume.DB, handler Handler, cfg *ConsumerConfig, ccfg *consume.Config) (*consume.Consumer, error) {
	if handler == nil || cfg == nil {
		return nil, fmt.Errorf("%w: handler or cfg is nil", ErrInvalidConfig)
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
		return handler(ctx, tx, MsgOf(m))
	}, &cc)
}

// MsgOf returns the JetStream message behind m (nil if m is not from this
// driver).
func MsgOf(m *consume.Message) jetstream.Msg {
	if m == nil {
		return nil
	}
	jm, _ := m.Raw.(jetstream.Msg)
	return jm
}

type driver struct {
	cfg ConsumerConfig
	log *slog.Logger
}

// hold is a held subject: the stream sequence of the message that holds
// it, and the later messages kept back meanwhile, in sequence order.
type hold struct {
	at    uint64
	later []*consume.Message
}

// session is one run's connection. Fetch, Ack, Hold and Close run on the
// consumer's goroutine; DeadLetter and the heartbeat run beside them and
// share only inflight (under mu) and the connection (safe for concurrent
// use).
type session struct {
	cfg *ConsumerConfig
	log *slog.Logger
	nc  *nats.Conn
	js  jetstream.JetStream

	consumers []jetstream.Consumer // per topic, bound lazily in Fetch
	streams   []jetstream.Stream   // per topic, for the order checks
	order     []*seqOrder          // per topic: see seqOrder
	next      int                  // round robin over topics

	held  map[string]*hold
	ready []*consume.Message

	mu       sync.Mutex
	inflight map[*consume.Message]jetstream.Msg // fetched, not acked
	stop     chan struct{}
	beat     sync.WaitGroup
}

// Open connects (without waiting for the server: an unreachable one shows
// in Fetch) and starts the heartbeat that keeps the messages in hand from
// being redelivered.
func (d *driver) Open(context.Context) (consume.Session, error) {
	opts := append([]nats.Option{
		nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond),
	}, d.options()...)
	nc, err := nats.Connect(d.cfg.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("natsjs: connect: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("natsjs: %w", err)
	}
	s := &session{
		cfg: &d.cfg, log: d.log, nc: nc, js: js,
		consumers: make([]jetstream.Consumer, len(d.cfg.Topics)),
		streams:   make([]jetstream.Stream, len(d.cfg.Topics)),
		order:     make([]*seqOrder, len(d.cfg.Topics)),
		held:      map[string]*hold{}, inflight: map[*consume.Message]jetstream.Msg{}, stop: make(chan struct{}),
	}
	s.beat.Add(1)
	go s.heartbeat()
	return s, nil
}

// heartbeat renews the AckWait of every message in hand (InProgress) every
// third of AckWait: a message being processed, retried or held is never
// redelivered to another member while this session lives; once it dies
// (SIGKILL), JetStream redelivers them after AckWait.
func (s *session) heartbeat() {
	defer s.beat.Done()
	t := time.NewTicker(s.cfg.AckWait / 3)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		s.mu.Lock()
		msgs := make([]jetstream.Msg, 0, len(s.inflight))
		for _, m := range s.inflight {
			msgs = append(msgs, m)
		}
		s.mu.Unlock()
		for _, m := range msgs {
			if err := m.InProgress(); err != nil {
				s.log.Debug("in progress", "subject", m.Subject(), "err", err)
			}
		}
	}
}

// bind returns topic i's consumer, creating or updating the durable.
func (s *session) bind(ctx context.Context, i int) (jetstream.Consumer, error) {
	if c := s.consumers[i]; c != nil {
		return c, nil
	}
	topic := WithPrefix(s.cfg.Prefix, s.cfg.Topics[i])
	c, err := s.js.CreateOrUpdateConsumer(ctx, StreamName(topic), s.cfg.consumerConfig())
	if err != nil {
		return nil, fmt.Errorf("natsjs: durable %s on stream %s: %w", s.cfg.Group, StreamName(topic), err)
	}
	st, err := s.js.Stream(ctx, StreamName(topic))
	if err != nil {
		return nil, fmt.Errorf("natsjs: stream %s: %w", StreamName(topic), err)
	}
	// The ack floor as this session begins: what is above it and not
	// delivered to this session may be in another member's hand, or in
	// a dead one's until AckWait.
	floor := c.CachedInfo().AckFloor.Stream
	s.consumers[i], s.streams[i] = c, st
	s.order[i] = &seqOrder{floor: floor, contig: floor, got: map[uint64]bool{}, waiting: map[string][]*waitingMsg{}}
	return c, nil
}

// Fetch hands over the messages of released holds first; otherwise it
// pulls up to MaxPollRecords from the next topic's durable consumer,
// waiting FetchMaxWait at most. Messages of held subjects are kept back,
// and so are those whose subject has earlier messages pending with
// another member, a dead one's until AckWait (see seqOrder).
func (s *session) Fetch(ctx context.Context) (consume.Fetch, error) {
	if len(s.ready) > 0 {
		n := min(len(s.ready), s.cfg.MaxPollRecords)
		f := consume.Fetch{Messages: s.ready[:n:n]}
		s.ready = s.ready[n:]
		return f, nil
	}
	i := s.next
	s.next = (s.next + 1) % len(s.cfg.Topics)
	var f consume.Fetch
	cons, err := s.bind(ctx, i)
	if err != nil {
		return f, err
	}
	if err := ctx.Err(); err != nil {
		return f, err
	}
	// The pull request runs to its expiry, whatever ctx does meanwhile:
	// a request given up early (its inbox gone) makes the server take
	// back what it was delivering, and nats-server 2.9 then delivers
	// those messages again as new, acked or not. A wake-up or a stop
	// waits FetchMaxWait at most.
	batch, err := cons.Fetch(s.cfg.MaxPollRecords, jetstream.FetchMaxWait(s.cfg.FetchMaxWait))
	if err != nil {
		return f, err
	}
	o := s.order[i]
	for jm := range batch.Messages() {
		m, err := s.message(s.cfg.Topics[i], jm)
		if err != nil {
			s.log.Warn("message without metadata: terminated", "subject", jm.Subject(), "err", err)
			_ = jm.Term()
			continue
		}
		s.mu.Lock()
		s.inflight[m] = jm
		s.mu.Unlock()
		o.received(uint64(m.Offset))
		if h := s.held[m.Stream]; h != nil {
			s.keep(h, m)
			continue
		}
		if o.behind(m) {
			continue // kept back until its subject's earlier messages come
		}
		if !s.inOrder(ctx, i, m) {
			o.wait(m)
			continue
		}
		f.Messages = append(f.Messages, m)
	}
	f.Messages = append(f.Messages, s.release(ctx, i)...)
	if err := batch.Error(); err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) &&
		!errors.Is(err, nats.ErrTimeout) && len(f.Messages) == 0 {
		return f, err
	}
	return f, nil
}

func (s *session) message(topic string, jm jetstream.Msg) (*consume.Message, error) {
	md, err := jm.Metadata()
	if err != nil {
		return nil, err
	}
	m := &consume.Message{
		Stream: jm.Subject(), Topic: topic, Offset: int64(md.Sequence.Stream),
		Value: jm.Data(), EventID: s.cfg.EventID(jm), Delivery: int(md.NumDelivered), Time: md.Timestamp, Raw: jm,
	}
	if rest, ok := strings.CutPrefix(jm.Subject(), WithPrefix(s.cfg.Prefix, topic)+"."); ok {
		if _, id, ok := strings.Cut(rest, "."); ok {
			if key, err := ParseToken(id); err == nil {
				m.Key = []byte(key)
			}
		}
	}
	for k, vs := range jm.Headers() {
		for _, v := range vs {
			m.Headers = append(m.Headers, consume.Header{Key: k, Value: []byte(v)})
		}
	}
	return m, nil
}

// keep adds m to h's later messages, in sequence order and once.
func (s *session) keep(h *hold, m *consume.Message) {
	seq := uint64(m.Offset)
	if seq == h.at {
		return
	}
	for _, x := range h.later {
		if x.Offset == m.Offset {
			return
		}
	}
	i := len(h.later)
	for i > 0 && uint64(h.later[i-1].Offset) > seq {
		i--
	}
	h.later = append(h.later, nil)
	copy(h.later[i+1:], h.later[i:])
	h.later[i] = m
}

// ackConcurrency bounds the acknowledgements waited for at once.
const ackConcurrency = 32

// Ack acknowledges each message and waits for JetStream to confirm it
// (an acknowledgement the server never got would redeliver the message,
// which is harmless but costs a re-read), and ends the holds whose holding
// message is among them.
func (s *session) Ack(ctx context.Context, msgs []*consume.Message) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		sem   = make(chan struct{}, ackConcurrency)
	)
	for _, m := range msgs {
		jm := m.Raw.(jetstream.Msg)
		if h := s.held[m.Stream]; h != nil && uint64(m.Offset) >= h.at {
			delete(s.held, m.Stream)
			s.ready = append(s.ready, h.later...)
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			err := jm.DoubleAck(ctx)
			// Acked or not, the heartbeat lets go of it: a failed ack
			// must end in a redelivery after AckWait (skipped as a
			// duplicate), not in a message renewed for ever.
			s.mu.Lock()
			delete(s.inflight, m)
			s.mu.Unlock()
			if err == nil || errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
				return
			}
			mu.Lock()
			if first == nil {
				first = fmt.Errorf("natsjs: ack %s seq %d: %w", m.Stream, m.Offset, err)
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	return first
}

// Hold keeps m's subject back in the driver. The holding message and the
// later ones stay in hand (the heartbeat keeps them from redelivery) until
// the holding one is acked; JetStream bounds them by MaxAckPending.
func (s *session) Hold(_ context.Context, m *consume.Message) error {
	h := s.held[m.Stream]
	if h == nil {
		s.held[m.Stream] = &hold{at: uint64(m.Offset)}
		return nil
	}
	s.keep(h, m)
	return nil
}

// Close stops the heartbeat, gives back (Nak) every message in hand so
// that the next member gets it at once rather than after AckWait, and
// closes the connection, bounded by ctx.
func (s *session) Close(ctx context.Context) error {
	close(s.stop)
	s.beat.Wait()
	s.mu.Lock()
	left := make([]*consume.Message, 0, len(s.inflight))
	for m := range s.inflight {
		left = append(left, m)
	}
	s.inflight = map[*consume.Message]jetstream.Msg{}
	s.mu.Unlock()
	// In stream order: JetStream redelivers given-back messages in the
	// order it got them back, and a subject's order must hold.
	slices.SortFunc(left, func(a, b *consume.Message) int { return cmp.Compare(a.Offset, b.Offset) })
	for _, m := range left {
		_ = m.Raw.(jetstream.Msg).Nak()
	}
	err := s.nc.FlushWithContext(ctx)
	s.nc.Close()
	if err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		return fmt.Errorf("natsjs: close: %w", err)
	}
	return nil
}
