package chaos

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testdb"
)

// The short chaos run on each other broker and client billing supports:
// NATS JetStream (BROKER=nats, a nats-server -js child restarted mid-run)
// and Kafka through kafka-go (KAFKA_CLIENT=kafkago), each with a SIGKILL,
// a SIGTERM and a broker restart under load. Every confirmed order and
// payment must be charged exactly once, and the broker audit (the same
// rules on the Kafka topics and the JetStream streams) must find every
// outbox event, each aggregate's first copies in order.
func TestChaosOtherBrokers(t *testing.T) {
	t.Parallel()
	testCases := []struct {
		name   string
		broker string
		env    []string
		want   string // Report.Broker
	}{
		{name: "nats", broker: BrokerNATS, want: "nats"},
		{name: "kafkago", broker: BrokerKafka, env: []string{"KAFKA_CLIENT=kafkago"}, want: "kafka/kafkago"},
	}
	for _, tt := range testCases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, testdb.Empty())
			var log bytes.Buffer
			work := t.TempDir()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			rep, err := Run(ctx, &Config{
				IdemBin: needIdem(t), BillingBin: needBilling(t), DatabaseURL: db.URL,
				Broker: tt.broker, Env: tt.env,
				Orders: 30, Payments: 15, Instances: 2, Kills: 1, Terms: 1, BrokerRestarts: 1,
				DropRate: 0.2, FailRate: 0.1, Seed: 17, LoadDuration: 15 * time.Second,
				Quiescence: 3 * time.Minute, Progress: &log, WorkDir: work,
			})
			if rep != nil {
				var out strings.Builder
				rep.WriteText(&out)
				t.Log(out.String())
			}
			if err != nil {
				t.Fatalf("run: %v\n%s", err, log.String())
			}
			if !rep.Pass {
				t.Fatalf("violations %+v\n%s", rep.Violations, log.String())
			}
			if rep.Broker != tt.want {
				t.Errorf("report says broker %q, want %q", rep.Broker, tt.want)
			}
			if rep.Kills != 1 || rep.Terms != 1 || rep.BrokerRestarts != 1 {
				t.Errorf("chaos not carried out: %d kills, %d terms, %d broker restarts", rep.Kills, rep.Terms, rep.BrokerRestarts)
			}
			// 45 orders (15 carry the payments), 30 confirmed: an
			// OrderConfirmed and a ChargeRequested each, and a
			// ChargeRequested per payment.
			if rep.KafkaEvents != 75 || rep.KafkaAggregates != 45 || rep.KafkaRecords < rep.KafkaEvents {
				t.Errorf("broker audit checked %d events of %d aggregates in %d records, want 75 of 45", rep.KafkaEvents, rep.KafkaAggregates, rep.KafkaRecords)
			}
			// billing really ran on that broker and client.
			b, err := os.ReadFile(filepath.Join(work, "logs", "billing-1.log"))
			if err != nil {
				t.Fatal(err)
			}
			want := "broker=" + strings.Replace(tt.want, "/", " kafka_client=", 1)
			if !strings.Contains(string(b), want) {
				t.Errorf("billing-1.log does not say %q", want)
			}
		})
	}
}

// The NATS audit can fail: with --unsafe=publish each relay reports its
// first OrderConfirmed published without sending it, and the audit of the
// JetStream streams must name the events lost.
func TestChaosNATSAuditCatchesALostEvent(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, testdb.Empty())
	var log bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rep, err := Run(ctx, &Config{
		IdemBin: needIdem(t), BillingBin: needBilling(t), DatabaseURL: db.URL, Broker: BrokerNATS,
		Orders: 6, Payments: 2, Instances: 2, LoadDuration: 2 * time.Second, Quiescence: 15 * time.Second,
		Unsafe: UnsafePublish, Seed: 11, Progress: &log, WorkDir: t.TempDir(),
	})
	if err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	if rep.Pass {
		t.Fatal("unsafe=publish on NATS passed: the NATS audit did not see the lost events")
	}
	lost := 0
	for _, v := range rep.Violations {
		if v.Kind == "lost-event" {
			lost++
			if !strings.Contains(v.Detail, "PUBLISHED") || !strings.Contains(v.Detail, "orders.events") {
				t.Errorf("lost-event does not name the PUBLISHED event and its topic: %+v", v)
			}
		}
	}
	if lost == 0 {
		t.Fatalf("no lost-event among %+v", rep.Violations)
	}
}

func TestConfigValidateBroker(t *testing.T) {
	t.Parallel()
	ok := Config{IdemBin: "i", BillingBin: "b", DatabaseURL: "d"}
	testCases := []struct {
		name   string
		mutate func(c *Config)
	}{
		{"unknown broker", func(c *Config) { c.Broker = "rabbitmq" }},
		{"nats with net cuts", func(c *Config) { c.Broker, c.NetCuts = BrokerNATS, 1 }},
		{"nats with produce failures", func(c *Config) { c.Broker, c.ProduceFailRate = BrokerNATS, 0.1 }},
		{"nats with external kafka", func(c *Config) { c.Broker, c.KafkaBrokers = BrokerNATS, "k:9092" }},
	}
	for _, tt := range testCases {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.mutate(&c)
			_, err := Run(context.Background(), &c)
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "Broker") {
				t.Fatalf("err %v, want ErrConfig naming Broker", err)
			}
		})
	}
}
