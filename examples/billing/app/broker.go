package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/consume"
	"github.com/idemkit/idem/examples/billing/adapters/out/postgres"
	"github.com/idemkit/idem/examples/billing/consumer"
	"github.com/idemkit/idem/examples/billing/usecase"
	"github.com/idemkit/idem/internal/cli"
	"github.com/idemkit/idem/kafka"
	idemkafkago "github.com/idemkit/idem/kafkago"
	"github.com/idemkit/idem/lifecycle"
	"github.com/idemkit/idem/natsjs"
	"github.com/idemkit/idem/outbox"
)

// Brokers (Config.Broker, BROKER) and Kafka clients (Config.KafkaClient,
// KAFKA_CLIENT). The topics, consumer groups and headers are the same on
// each; only the client library (or the broker) changes.
const (
	// BrokerKafka: Kafka (KAFKA_BROKERS), through the client of
	// KafkaClient. The default.
	BrokerKafka = "kafka"
	// BrokerNATS: NATS JetStream (NATS_URL), through package natsjs: a
	// stream per topic (natsjs.StreamConfig), a durable pull consumer per
	// group, Nats-Msg-Id = event id.
	BrokerNATS = "nats"
	// KafkaClientFranz: franz-go (package kafka), with its idempotent
	// producer. The default.
	KafkaClientFranz = "franz"
	// KafkaClientKafkaGo: segmentio/kafka-go (package kafkago), the source
	// article's client: no idempotent producer, so a retried produce may
	// leave a duplicate on the topic, which the inbox drops.
	KafkaClientKafkaGo = "kafkago"
	// NATSAckWaitDefault is the durable consumers' AckWait on NATS: how
	// soon the messages a killed instance held are delivered again.
	NATSAckWaitDefault = natsjs.AckWaitDefault
)

var (
	// ErrBadBroker is a BROKER value other than kafka or nats.
	ErrBadBroker = errors.New("billing: BROKER must be kafka or nats")
	// ErrBadKafkaClient is a KAFKA_CLIENT value other than franz or kafkago.
	ErrBadKafkaClient = errors.New("billing: KAFKA_CLIENT must be franz or kafkago")
)

// ParseBroker checks a BROKER value ("" means BrokerKafka).
func ParseBroker(s string) (string, error) {
	switch s {
	case "":
		return BrokerKafka, nil
	case BrokerKafka, BrokerNATS:
		return s, nil
	}
	return "", fmt.Errorf("%w, got %q", ErrBadBroker, s)
}

// ParseKafkaClient checks a KAFKA_CLIENT value ("" means KafkaClientFranz).
func ParseKafkaClient(s string) (string, error) {
	switch s {
	case "":
		return KafkaClientFranz, nil
	case KafkaClientFranz, KafkaClientKafkaGo:
		return s, nil
	}
	return "", fmt.Errorf("%w, got %q", ErrBadKafkaClient, s)
}

// broker is the client side of the broker Config selects, for everything
// but franz-go on Kafka with the pgx data layer, which Run wires itself
// (package kafka's Consumer); on the database/sql layer franz-go's
// consumers are consume.Consumers on kafka.NewDriver too.
type broker struct {
	cfg        *Config
	kind       string // BrokerKafka or BrokerNATS
	client     string // with BrokerKafka: KafkaClientFranz or KafkaClientKafkaGo
	ackWait    time.Duration
	session    time.Duration
	heartbeat  time.Duration
	rebalance  time.Duration
	log        *slog.Logger
	unsafeInbx bool
}

// franz reports whether Run's own franz-go wiring applies.
func (b *broker) franz() bool { return b.kind == BrokerKafka && b.client == KafkaClientFranz }

// ensure creates the topics (Kafka) or streams (NATS) when missing.
func (b *broker) ensure(ctx context.Context, partitions int32) error {
	if b.kind == BrokerKafka {
		return ensureTopics(ctx, b.cfg.Brokers, partitions)
	}
	nc, js, err := b.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// Each consumer's dead-letter topic too: the consumers check at Start
	// that a stream captures it.
	for _, t := range []string{usecase.TopicOrderEvents, usecase.TopicBillingCommands,
		usecase.TopicOrderEvents + natsjs.DeadLetterSuffixDefault, usecase.TopicBillingCommands + natsjs.DeadLetterSuffixDefault} {
		if _, err := js.CreateOrUpdateStream(ctx, natsjs.StreamConfig(t)); err != nil {
			return fmt.Errorf("billing: create stream %s on %s: %w", natsjs.StreamName(t), cli.RedactList(b.cfg.NATSURL), err)
		}
	}
	return nil
}

// connect opens a NATS connection that reconnects forever.
func (b *broker) connect() (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(b.cfg.NATSURL, nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond), nats.Name("billing"))
	if err != nil {
		return nil, nil, fmt.Errorf("billing: nats connect: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("billing: jetstream: %w", err)
	}
	return nc, js, nil
}

// publisher returns the relay's publisher and what closes its client.
func (b *broker) publisher() (outbox.Publisher, lifecycle.Component, error) {
	if b.kind == BrokerKafka {
		w := idemkafkago.NewWriter(b.cfg.Brokers...)
		p, err := idemkafkago.NewPublisher(w)
		if err != nil {
			return nil, nil, err
		}
		return p, lifecycle.Closer(func() { _ = w.Close() }), nil
	}
	nc, js, err := b.connect()
	if err != nil {
		return nil, nil, err
	}
	p, err := natsjs.NewPublisher(js, nil)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return p, lifecycle.Closer(nc.Close), nil
}

// driver returns the consume.Driver of group on topic; maxPoll bounds
// franz-go's poll (0: its default).
func (b *broker) driver(group, topic string, maxPoll int) (consume.Driver, error) {
	if b.franz() {
		cfg := &kafka.ConsumerConfig{
			Brokers: b.cfg.Brokers, Group: group, Topics: []string{topic}, Logger: b.log, MaxPollRecords: maxPoll,
			ClientOpts: []kgo.Opt{kgo.SessionTimeout(b.session), kgo.HeartbeatInterval(b.heartbeat), kgo.RebalanceTimeout(b.rebalance)},
		}
		if b.unsafeInbx {
			cfg.EventID = consumer.DeliveryEventID
		}
		return kafka.NewDriver(cfg)
	}
	if b.kind == BrokerKafka {
		cfg := &idemkafkago.ConsumerConfig{
			Brokers: b.cfg.Brokers, Group: group, Topics: []string{topic}, Logger: b.log,
			Reader: func(rc *kafkago.ReaderConfig) {
				rc.SessionTimeout, rc.HeartbeatInterval, rc.RebalanceTimeout = b.session, b.heartbeat, b.rebalance
			},
		}
		if b.unsafeInbx {
			cfg.EventID = func(m *kafkago.Message) string { return consumer.UnsafeEventID(idemkafkago.MessageEventID(m)) }
		}
		return idemkafkago.NewDriver(cfg)
	}
	cfg := &natsjs.ConsumerConfig{
		URL: b.cfg.NATSURL, Group: group, Topics: []string{topic}, Logger: b.log, AckWait: b.ackWait,
	}
	if b.unsafeInbx {
		cfg.EventID = func(m jetstream.Msg) string { return consumer.UnsafeEventID(natsjs.MessageEventID(m)) }
	}
	return natsjs.NewDriver(cfg)
}

// newBroker checks Config's broker fields.
func newBroker(cfg *Config, log *slog.Logger, session, heartbeat, rebalance time.Duration) (*broker, error) {
	kind, err := ParseBroker(cfg.Broker)
	if err != nil {
		return nil, err
	}
	client, err := ParseKafkaClient(cfg.KafkaClient)
	if err != nil {
		return nil, err
	}
	ackWait := cfg.NATSAckWait
	if ackWait == 0 {
		ackWait = NATSAckWaitDefault
	}
	if ackWait < 0 {
		return nil, errors.New("billing: NATSAckWait must not be negative")
	}
	return &broker{
		cfg: cfg, kind: kind, client: client, ackWait: ackWait,
		session: session, heartbeat: heartbeat, rebalance: rebalance, log: log,
		unsafeInbx: cfg.Unsafe == UnsafeInbox,
	}, nil
}

// orderConsumer is the orders.events consumer on the broker's driver, in
// db's transactions; hook is its consume.Config.Hook.
func (b *broker) orderConsumer(db postgres.DB, hook func(context.Context, consume.Event) context.Context) (*consume.Consumer, error) {
	drv, err := b.driver(consumer.OrderGroup, usecase.TopicOrderEvents, 0)
	if err != nil {
		return nil, err
	}
	return consumer.NewOrderConsumerOn(db, drv, b.log, hook)
}

// chargeWorker is the charge worker: package kafka's on franz-go with the
// pgx layer (on pool), else on the broker's driver in db's transactions.
func (b *broker) chargeWorker(pool consume.DB, db postgres.DB, gw usecase.PaymentGateway, cfg *consumer.ChargeWorkerConfig) (lifecycle.Component, error) {
	if b.franz() && db.Layer() == postgres.LayerPGX {
		return consumer.NewChargeWorker(pool, gw, cfg)
	}
	group := cfg.Group
	if group == "" {
		group = consumer.ChargeGroupDefault
	}
	drv, err := b.driver(group, usecase.TopicBillingCommands, consumer.ChargeMaxPollDefault)
	if err != nil {
		return nil, err
	}
	return consumer.NewChargeWorkerOn(db, gw, drv, cfg)
}
