package main

import (
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testbin"
	"github.com/idemkit/idem/internal/testdb"
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

// The NATS URL's password never reaches billing's output: not on the
// error path (a signal while the streams are being created, against a NATS
// that does not answer), not in --help. On main the log line "billing
// stopped before ready … create stream … on nats://billing:PASSWORD@…"
// printed it.
func TestNATSPasswordNeverPrinted(t *testing.T) {
	t.Parallel()
	const secret = "pw-hunter2"
	db := testdb.New(t, testdb.MaxConns(2))
	// A "NATS server" that accepts and never answers: its first accepted
	// connection says billing is creating the streams.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	natsURL := "nats://billing:" + secret + "@" + ln.Addr().String()
	env := []string{"DATABASE_URL=" + db.URL, "BROKER=nats", "NATS_URL=" + natsURL, "PAYMENT_URL=http://127.0.0.1:1",
		"HTTP_ADDR=127.0.0.1:0", "BILLING_API_TOKENS=", "SHUTDOWN_TIMEOUT=5s"}
	cmd := exec.Command(billingBin, "serve")
	cmd.Env = append(os.Environ(), env...)
	var out testbin.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case c := <-accepted:
		defer c.Close()
	case err := <-exited:
		t.Fatalf("billing exited early: %v\n%s", err, out.String())
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
		t.Fatalf("billing never connected to NATS:\n%s", out.String())
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
		t.Fatalf("billing did not stop:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "creating topics") {
		t.Fatalf("the signal did not come while the streams were being created:\n%s", out.String())
	}
	if strings.Contains(out.String(), secret) {
		t.Errorf("the NATS password is printed:\n%s", out.String())
	}
	stdout, stderr, _ := runBilling(t, env, "serve", "--help")
	if strings.Contains(stdout+stderr, secret) {
		t.Errorf("--help prints the password")
	}
	// A usage error with NATS_URL set.
	stdout, stderr, code := runBilling(t, append(env, "NATS_ACK_WAIT=soon"), "serve")
	if code == 0 || strings.Contains(stdout+stderr, secret) {
		t.Errorf("usage error: exit %d, output %q %q", code, stdout, stderr)
	}
}
