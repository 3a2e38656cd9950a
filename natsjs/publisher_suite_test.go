package natsjs_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/natsjs"
	"github.com/idemkit/idem/outbox/publishertest"
)

// The JetStream publisher passes the outbox.Publisher suite against the
// real server, each subtest in a namespace (Prefix) of its own: a topic
// is rejected by sealing its stream, stalled by moving the stream's
// subjects away and answering its subjects with a subscriber that never
// replies, and MaxMsgSize is 64 KiB, which Check enforces.
func TestPublisherSuite(t *testing.T) {
	t.Parallel()
	publishertest.Run(t, func(t *testing.T, topics []string) *publishertest.Broker {
		s := newServer(t)
		for _, topic := range topics {
			s.createTopic(t, topic, 0)
		}
		pub, err := natsjs.NewPublisher(s.js, &natsjs.PublisherConfig{Prefix: s.prefix, MaxMsgSize: 64 << 10})
		if err != nil {
			t.Fatal(err)
		}
		update := func(topic string, change func(*jetstream.StreamConfig)) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			st, err := s.js.Stream(ctx, s.stream(topic))
			if err != nil {
				t.Fatal(err)
			}
			cfg := st.CachedInfo().Config
			change(&cfg)
			if _, err := s.js.UpdateStream(ctx, cfg); err != nil {
				t.Fatalf("update stream %s: %v", cfg.Name, err)
			}
		}
		return &publishertest.Broker{
			Publisher: pub,
			Read: func(ctx context.Context, topic string) ([]publishertest.Message, error) {
				raw, err := s.readAll(ctx, topic)
				if err != nil {
					return nil, err
				}
				out := make([]publishertest.Message, len(raw))
				for i, m := range raw {
					out[i] = decode(s, topic, m)
				}
				return out, nil
			},
			Reject: func(topic string) { update(topic, func(c *jetstream.StreamConfig) { c.Sealed = true }) },
			Stall: func(topic string) {
				full := natsjs.WithPrefix(s.prefix, topic)
				update(topic, func(c *jetstream.StreamConfig) { c.Subjects = []string{"stalled." + full + ".*.*"} })
				if _, err := s.nc.Subscribe(full+".>", func(*nats.Msg) {}); err != nil {
					t.Fatal(err)
				}
				if err := s.nc.Flush(); err != nil {
					t.Fatal(err)
				}
			},
			TooLarge: 128 << 10,
		}
	})
}

func decode(s *server, topic string, m *jetstream.RawStreamMsg) publishertest.Message {
	out := publishertest.Message{Topic: topic, AggregateID: s.aggregateID(topic, m.Subject), Payload: m.Data, Headers: map[string]string{}}
	for k, vs := range m.Header {
		v := vs[0]
		switch k {
		case idem.HeaderEventID:
			out.EventID = v
		case idem.HeaderEventType:
			out.EventType = v
		case idem.HeaderAggregateType:
			out.AggregateType = v
		case idem.HeaderAggregateSeq:
			out.Seq, _ = strconv.ParseInt(v, 10, 64)
		case natsjs.HeaderMsgID:
		default:
			out.Headers[k] = v
		}
	}
	return out
}
