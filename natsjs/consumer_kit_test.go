package natsjs_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consume"
	"github.com/idemkit/idem/consume/consumertest"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/natsjs"
)

// kitMaxMsgSize is the kit streams' MaxMsgSize: NearLimitValue fits with
// its two headers, its dead-letter copy (with the dead-letter headers)
// does not.
const kitMaxMsgSize = 64 << 10

// TestConsumerKit runs the broker-neutral consumer kit on the JetStream
// driver against the real server. A kit partition is an aggregate, hence
// a subject: topic.kit.p<N>.
func TestConsumerKit(t *testing.T) {
	consumertest.Run(t, consumertest.Harness{
		New: func(t testing.TB) consumertest.Broker {
			return &kitBroker{s: newServer(t)}
		},
		Attach: func(t testing.TB, addr string) consumertest.Broker {
			url, prefix, _ := strings.Cut(addr, "|")
			return &kitBroker{s: attach(t, url, prefix, false)}
		},
		NearLimitValue: kitMaxMsgSize - 300,
		// A copy too large is dead-lettered as a reference (no value).
		ReferenceCopy: true,
		SQLDrivers:    testdb.SQLDrivers,
	})
}

type kitBroker struct{ s *server }

func (b *kitBroker) Addr() string { return b.s.url + "|" + b.s.prefix }

func (b *kitBroker) CreateTopic(t testing.TB, topic string, _ int) {
	b.s.createTopic(t, topic, kitMaxMsgSize)
}

func (b *kitBroker) Produce(t testing.TB, topic string, msgs ...consumertest.Msg) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, m := range msgs {
		h := nats.Header{}
		h.Set(idem.HeaderEventID, m.EventID)
		h.Set(natsjs.HeaderMsgID, m.EventID)
		subj := natsjs.Subject(natsjs.WithPrefix(b.s.prefix, topic), "kit", "p"+strconv.Itoa(m.Partition))
		if _, err := b.s.js.PublishMsg(ctx, &nats.Msg{Subject: subj, Header: h, Data: m.Value}); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
}

func (b *kitBroker) Driver(t testing.TB, cfg consumertest.DriverConfig) consume.Driver {
	t.Helper()
	d, err := natsjs.NewDriver(&natsjs.ConsumerConfig{
		URL: b.s.url, Prefix: b.s.prefix, Group: cfg.Group, Topics: cfg.Topics, DeadLetterTopic: cfg.DeadLetterTopic,
		SkipDeadLetterTopicCheck: cfg.SkipDeadLetterCheck,
		// A killed member's messages come back after AckWait: short here.
		AckWait: 3 * time.Second, FetchMaxWait: 200 * time.Millisecond, Logger: quiet(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func (b *kitBroker) Read(t testing.TB, topic string, n int, timeout time.Duration) []consumertest.Msg {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		raw, err := b.s.readAll(ctx, topic)
		cancel()
		if err != nil {
			t.Fatalf("read %s: %v", topic, err)
		}
		if len(raw) >= n {
			out := make([]consumertest.Msg, n)
			for i, m := range raw[:n] {
				out[i] = consumertest.Msg{Value: m.Data, Headers: map[string]string{}}
				for k, vs := range m.Header {
					out[i].Headers[k] = vs[0]
				}
				out[i].EventID = out[i].Headers[idem.HeaderEventID]
				p, _ := strings.CutPrefix(b.s.aggregateID(topic, m.Subject), "p")
				out[i].Partition, _ = strconv.Atoi(p)
			}
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("read %s: %d of %d messages in %v", topic, len(raw), n, timeout)
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
}

// Acked counts the group's acknowledged messages of topic: those its
// durable consumer delivered, less those still pending (delivered and
// neither acked nor terminated). The kit's streams hold one topic each,
// from sequence 1, with no gaps.
func (b *kitBroker) Acked(t testing.TB, group, topic string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := b.s.js.Consumer(ctx, b.s.stream(topic), group)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return 0
	}
	if err != nil {
		t.Fatalf("consumer %s: %v", group, err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatalf("consumer info %s: %v", group, err)
	}
	return int(info.Delivered.Stream) - info.NumAckPending
}
