package natsjs_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consume"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/natsjs"
)

// A consumer whose dead-letter topic has no stream fails at Start, naming
// the topic; SkipDeadLetterTopicCheck starts it anyway; with the stream
// there it starts.
func TestConsumerStartChecksDeadLetterTopic(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	db := testdb.New(t)
	s.createTopic(t, "orders", 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	newCons := func(mod func(*natsjs.ConsumerConfig)) *consume.Consumer {
		cfg := &natsjs.ConsumerConfig{URL: s.url, Prefix: s.prefix, Group: "g", Topics: []string{"orders"}, Logger: quiet()}
		if mod != nil {
			mod(cfg)
		}
		c, err := natsjs.NewConsumer(db.Pool, func(context.Context, pgx.Tx, jetstream.Msg) error { return nil }, cfg, &consume.Config{Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	stop := func(c *consume.Consumer) {
		if err := c.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}

	c := newCons(nil)
	err := c.Start(ctx)
	if !errors.Is(err, natsjs.ErrDeadLetterTopicMissing) || !strings.Contains(err.Error(), s.prefix+".orders.dlq") {
		t.Fatalf("Start without a stream for orders.dlq: %v, want ErrDeadLetterTopicMissing naming it", err)
	}
	stop(c)
	named := newCons(func(cfg *natsjs.ConsumerConfig) { cfg.DeadLetterTopic = "poison" })
	if err := named.Start(ctx); !errors.Is(err, natsjs.ErrDeadLetterTopicMissing) || !strings.Contains(err.Error(), "poison") {
		t.Fatalf("Start without the configured dead-letter topic's stream: %v, want ErrDeadLetterTopicMissing naming poison", err)
	}
	skip := newCons(func(cfg *natsjs.ConsumerConfig) { cfg.SkipDeadLetterTopicCheck = true })
	if err := skip.Start(ctx); err != nil {
		t.Fatalf("Start with SkipDeadLetterTopicCheck: %v", err)
	}
	stop(skip)
	s.createTopic(t, "orders.dlq", 0)
	c = newCons(nil)
	if err := c.Start(ctx); err != nil {
		t.Fatalf("Start with the orders.dlq stream there: %v", err)
	}
	stop(c)
}

// TestDeadLetterTooLargeReferenceCopy: the dead-letter stream accepts at
// most 4 KiB (MaxMsgSize) and a 20 KB message fails its handler for good.
// Its full copy is refused, so the consumer dead-letters a reference copy
// on the same aggregate's subject (no value; event id, Nats-Msg-Id,
// dlq-source stream/sequence, dlq-size, the error, dlq-truncated); the
// message behind it on the subject is processed, all three are acked, and
// nothing is reported stuck.
func TestDeadLetterTooLargeReferenceCopy(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	db := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s.createTopic(t, "orders", 0)
	s.createTopic(t, "orders.dlq", 4096)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE effect (event_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		kinds []consume.Kind
	)
	c, err := natsjs.NewConsumer(db.Pool, func(ctx context.Context, tx pgx.Tx, m jetstream.Msg) error {
		if len(m.Data()) > 10_000 {
			return consume.Permanent(errors.New("payload too large to charge"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO effect VALUES ($1)`, m.Headers().Get(idem.HeaderEventID))
		return err
	}, &natsjs.ConsumerConfig{URL: s.url, Prefix: s.prefix, Group: "g", Topics: []string{"orders"}, FetchMaxWait: 100 * time.Millisecond, Logger: quiet()},
		&consume.Config{Logger: quiet(), BackoffMin: time.Millisecond, DeadLetterAttempts: 2, Hook: func(ctx context.Context, e consume.Event) context.Context {
			mu.Lock()
			kinds = append(kinds, e.Kind)
			mu.Unlock()
			return ctx
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	subj := natsjs.Subject(natsjs.WithPrefix(s.prefix, "orders"), "order", "o1")
	for i, v := range [][]byte{[]byte("0"), make([]byte, 20_000), []byte("2")} {
		h := nats.Header{}
		h.Set(idem.HeaderEventID, "ev-"+strconv.Itoa(i))
		h.Set(natsjs.HeaderMsgID, "ev-"+strconv.Itoa(i))
		h.Set("trace", "t-"+strconv.Itoa(i))
		if _, err := s.js.PublishMsg(ctx, &nats.Msg{Subject: subj, Header: h, Data: v}); err != nil {
			t.Fatal(err)
		}
	}
	var dl []*jetstream.RawStreamMsg
	for deadline := time.Now().Add(30 * time.Second); len(dl) == 0; {
		if dl, err = s.readAll(ctx, "orders.dlq"); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("no dead letter in 30s")
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
	m := dl[0]
	h := m.Header
	if len(m.Data) != 0 || h.Get(idem.HeaderDeadLetterTruncated) != "true" || h.Get(idem.HeaderDeadLetterSource) != s.stream("orders")+"/2" ||
		h.Get(idem.HeaderEventID) != "ev-1" || h.Get(natsjs.HeaderMsgID) != "ev-1" || h.Get("trace") != "" ||
		!strings.Contains(h.Get(idem.HeaderDeadLetterError), "payload too large to charge") ||
		m.Subject != natsjs.Subject(natsjs.WithPrefix(s.prefix, "orders.dlq"), "order", "o1") {
		t.Fatalf("reference copy: subject %s, value %d bytes, headers %v", m.Subject, len(m.Data), h)
	}
	if size, _ := strconv.Atoi(h.Get(idem.HeaderDeadLetterSize)); size < 20_000 {
		t.Errorf("dlq-size %q, want at least 20000", h.Get(idem.HeaderDeadLetterSize))
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM effect WHERE event_id = 'ev-2'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("ev-2, behind the too-large message on its subject, not processed in 30s")
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	for _, k := range kinds {
		if k == consume.KindStuck {
			t.Error("the too-large message was reported stuck")
		}
	}
	mu.Unlock()
	cons, err := s.js.Consumer(ctx, s.stream("orders"), "g")
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.AckFloor.Stream != 3 {
		t.Errorf("ack floor %d, want 3: the subject did not move past the message", info.AckFloor.Stream)
	}
}
