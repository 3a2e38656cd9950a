package kafkago_test

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemkit/idem/consume"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testkafka"
	"github.com/idemkit/idem/kafkago"
	"github.com/idemkit/idem/outbox"
)

// dropProxy stands between the clients and kfake (which advertises the
// proxy in its metadata, so every connection goes through it) and cuts
// the connection instead of passing on the first drop answers to Produce
// requests: the broker has appended the records, the client never hears
// so. It parses Kafka's framing: a 4-byte size, then a request (api key,
// version, correlation id, …) or a response (correlation id, …).
type dropProxy struct {
	ln      net.Listener
	target  string
	drops   atomic.Int64
	dropped atomic.Int64
	wg      sync.WaitGroup
}

func newDropProxy(t *testing.T, drops int) (*dropProxy, *testkafka.Cluster) {
	t.Helper()
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &dropProxy{ln: pl}
	p.drops.Store(int64(drops))
	c := testkafka.New(t, kfake.ListenFn(func(network, addr string) (net.Listener, error) {
		ln, err := net.Listen(network, "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		p.target = ln.Addr().String()
		return advertised{Listener: ln, adv: pl.Addr()}, nil
	}))
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() {
		_ = pl.Close()
		p.wg.Wait()
	})
	return p, c
}

type advertised struct {
	net.Listener
	adv net.Addr
}

func (a advertised) Addr() net.Addr { return a.adv }

func (p *dropProxy) serve() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		broker, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		var mu sync.Mutex
		produce := map[int32]bool{} // correlation ids of Produce requests in flight
		cut := func() {
			_ = client.(*net.TCPConn).SetLinger(0) // a reset, as a broken network gives
			_ = client.Close()
			_ = broker.Close()
		}
		p.wg.Add(2)
		go func() { // client → broker
			defer p.wg.Done()
			defer cut()
			for {
				frame, err := readFrame(client)
				if err != nil {
					return
				}
				if len(frame) >= 12 && binary.BigEndian.Uint16(frame[4:6]) == 0 { // api key 0: Produce
					mu.Lock()
					produce[int32(binary.BigEndian.Uint32(frame[8:12]))] = true
					mu.Unlock()
				}
				if _, err := broker.Write(frame); err != nil {
					return
				}
			}
		}()
		go func() { // broker → client
			defer p.wg.Done()
			defer cut()
			for {
				frame, err := readFrame(broker)
				if err != nil {
					return
				}
				if len(frame) >= 8 {
					mu.Lock()
					isProduce := produce[int32(binary.BigEndian.Uint32(frame[4:8]))]
					mu.Unlock()
					if isProduce && p.drops.Add(-1) >= 0 {
						p.dropped.Add(1)
						return // the answer is lost; cut() resets the client
					}
				}
				if _, err := client.Write(frame); err != nil {
					return
				}
			}
		}()
	}
}

func readFrame(r io.Reader) ([]byte, error) {
	var size [4]byte
	if _, err := io.ReadFull(r, size[:]); err != nil {
		return nil, err
	}
	frame := make([]byte, 4+binary.BigEndian.Uint32(size[:]))
	copy(frame, size[:])
	_, err := io.ReadFull(r, frame[4:])
	return frame, err
}

// TestRetryDuplicatesAtTheBroker shows what having no idempotent producer
// means: the broker appends a produce whose answer is then lost, kafka-go
// retries it, and the topic holds every record of the batch twice. Publish
// reports success; the first copies are in sequence order; and a consumer
// with the inbox applies each event once, skipping the copies as
// duplicates.
func TestRetryDuplicatesAtTheBroker(t *testing.T) {
	t.Parallel()
	proxy, c := newDropProxy(t, 1)
	c.CreateTopic(t, "orders.events", 1)
	c.CreateTopic(t, "orders.events.dlq", 1) // the consumer checks it at Start
	pub, err := kafkago.NewPublisher(newWriter(t, c.Addrs...))
	if err != nil {
		t.Fatal(err)
	}
	var events []outbox.Event
	for seq := int64(1); seq <= 3; seq++ {
		events = append(events, outbox.Event{Seq: seq, Message: outbox.Message{Topic: "orders.events", AggregateType: "order",
			AggregateID: "o1", EventID: "o1-" + strconv.FormatInt(seq, 10), EventType: "E", Payload: []byte(`{}`)}})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pub.Publish(ctx, events); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if proxy.dropped.Load() != 1 {
		t.Fatalf("the proxy dropped %d produce answers, want 1", proxy.dropped.Load())
	}
	recs := c.ReadAll(t, "orders.events", 6, 30*time.Second)
	var ids []string
	for _, r := range recs {
		ids = append(ids, decode(r).EventID)
	}
	if got, want := joinIDs(ids), "o1-1 o1-2 o1-3 o1-1 o1-2 o1-3"; got != want {
		t.Fatalf("on the topic: %s, want %s (the batch, then its retry)", got, want)
	}

	// The inbox absorbs the copies.
	db := testdb.New(t)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE effect (event_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var processed, dups atomic.Int64
	cons, err := kafkago.NewConsumer(db.Pool, func(ctx context.Context, tx pgx.Tx, m *kafka.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO effect VALUES ($1)`, kafkago.MessageEventID(m))
		return err
	}, &kafkago.ConsumerConfig{Brokers: c.Addrs, Group: "g", Topics: []string{"orders.events"}, Logger: quiet()},
		&consume.Config{Logger: quiet(), Hook: func(ctx context.Context, e consume.Event) context.Context {
			switch e.Kind {
			case consume.KindProcessed:
				processed.Add(1)
			case consume.KindDuplicate:
				dups.Add(1)
			}
			return ctx
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := cons.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := cons.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
	}()
	for deadline := time.Now().Add(30 * time.Second); processed.Load()+dups.Load() < 6; {
		if time.Now().After(deadline) {
			t.Fatalf("processed %d, duplicates %d: not all 6 records handled in 30s", processed.Load(), dups.Load())
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM effect`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 3 || processed.Load() != 3 || dups.Load() != 3 {
		t.Fatalf("effects %d, processed %d, duplicates %d; want 3, 3, 3", n, processed.Load(), dups.Load())
	}
}

func joinIDs(ids []string) string {
	out := ""
	for i, id := range ids {
		if i > 0 {
			out += " "
		}
		out += id
	}
	return out
}
