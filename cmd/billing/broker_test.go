package main

import (
	"strings"
	"testing"
)

// BROKER, KAFKA_CLIENT, NATS_URL and NATS_ACK_WAIT: a bad or missing value
// is one line on stderr and exit status 2, before anything connects.
func TestServeBrokerEnv(t *testing.T) {
	t.Parallel()
	testCases := []struct {
		name    string
		env     []string
		wantErr string
	}{
		{"unknown broker", []string{"BROKER=rabbitmq"}, "BROKER must be kafka or nats"},
		{"unknown kafka client", []string{"KAFKA_BROKERS=127.0.0.1:1", "KAFKA_CLIENT=sarama"}, "KAFKA_CLIENT must be franz or kafkago"},
		{"nats without url", []string{"BROKER=nats", "NATS_URL="}, "NATS_URL is empty"},
		{"bad ack wait", []string{"BROKER=nats", "NATS_URL=nats://127.0.0.1:1", "NATS_ACK_WAIT=soon"}, "NATS_ACK_WAIT"},
		{"kafka without brokers", []string{"BROKER=kafka", "KAFKA_BROKERS=", "NATS_URL=nats://127.0.0.1:1"}, "KAFKA_BROKERS is empty"},
		// NATS needs no Kafka: the next missing setting is the provider's.
		{"nats needs no kafka", []string{"BROKER=nats", "NATS_URL=nats://127.0.0.1:1", "KAFKA_BROKERS=", "PAYMENT_URL="}, "PAYMENT_URL is empty"},
	}
	for _, tt := range testCases {
		_, stderr, code := runBilling(t, tt.env, "serve")
		if code != 2 || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tt.wantErr) {
			t.Errorf("%s: exit %d, stderr %q; want 2 and one line with %q", tt.name, code, stderr, tt.wantErr)
		}
	}
	stdout, _, code := runBilling(t, nil, "serve", "--help")
	for _, want := range []string{"BROKER", "KAFKA_CLIENT", "NATS_URL", "NATS_ACK_WAIT"} {
		if code != 0 || !strings.Contains(stdout, want) {
			t.Errorf("--help: exit %d, no %s", code, want)
		}
	}
	_, stderr, code := runBilling(t, nil, "chaos", "--broker", "rabbitmq")
	if code != 2 || !strings.Contains(stderr, "--broker") {
		t.Errorf("chaos --broker rabbitmq: exit %d, stderr %q; want 2 naming --broker", code, stderr)
	}
	_, stderr, code = runBilling(t, nil, "chaos", "--broker", "nats", "--net-cuts", "1")
	if code != 2 || !strings.Contains(stderr, "--net-cuts") {
		t.Errorf("chaos --broker nats --net-cuts 1: exit %d, stderr %q; want 2 naming --net-cuts", code, stderr)
	}
}
