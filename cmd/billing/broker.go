package main

import (
	"os"
	"strings"

	"github.com/idemkit/idem/examples/billing/app"
	"github.com/idemkit/idem/internal/cli"
)

// brokerUsage is the part of serve's help about the broker.
const brokerUsage = `
  BROKER              kafka (default) or nats
  KAFKA_CLIENT        with BROKER=kafka: franz (default: franz-go, idempotent
                      producer) or kafkago (segmentio/kafka-go, the source
                      article's client; a retried produce may leave a duplicate
                      on the topic, which the inbox drops)
  NATS_URL            with BROKER=nats: the NATS server, e.g. nats://127.0.0.1:4222
                      (required); JetStream streams are created when missing
  NATS_ACK_WAIT       with BROKER=nats: the durable consumers' AckWait, how soon
                      the messages a killed instance held come back (default 30s)`

// brokerEnv reads BROKER, KAFKA_CLIENT, KAFKA_BROKERS, NATS_URL and
// NATS_ACK_WAIT into cfg; a bad or missing value is a usage error.
func brokerEnv(cfg *app.Config) error {
	kind, err := app.ParseBroker(os.Getenv("BROKER"))
	if err != nil {
		return cli.Usagef("%v", err)
	}
	client, err := app.ParseKafkaClient(os.Getenv("KAFKA_CLIENT"))
	if err != nil {
		return cli.Usagef("%v", err)
	}
	ackWait, err := cli.DurationEnv("NATS_ACK_WAIT", app.NATSAckWaitDefault)
	if err != nil {
		return err
	}
	cfg.Broker, cfg.KafkaClient, cfg.NATSAckWait = kind, client, ackWait
	switch kind {
	case app.BrokerKafka:
		for _, b := range strings.Split(os.Getenv("KAFKA_BROKERS"), ",") {
			if b = strings.TrimSpace(b); b != "" {
				cfg.Brokers = append(cfg.Brokers, b)
			}
		}
		if len(cfg.Brokers) == 0 {
			return cli.Usagef("KAFKA_BROKERS is empty: set it to the seed brokers (for a local broker run 'idem devkafka')")
		}
	case app.BrokerNATS:
		cfg.NATSURL = strings.TrimSpace(os.Getenv("NATS_URL"))
		if cfg.NATSURL == "" {
			return cli.Usagef("NATS_URL is empty: BROKER=nats needs the NATS server (nats-server -js)")
		}
	}
	return nil
}
