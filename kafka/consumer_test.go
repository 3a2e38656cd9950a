package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/consume"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testkafka"
	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/lifecycle"
)

// consBundle is one consumer test's world.
type consBundle struct {
	db    *testdb.DB
	kc    *testkafka.Cluster
	topic string
	group string
	prod  *kgo.Client
}

func consSetup(t *testing.T, partitions int32) *consBundle {
	t.Helper()
	b := &consBundle{db: testdb.New(t), kc: testkafka.New(t), topic: "orders", group: "billing"}
	b.kc.CreateTopic(t, b.topic, partitions)
	b.kc.CreateTopic(t, b.topic+kafka.DeadLetterSuffixDefault, 1)
	b.prod = b.kc.Client(t, kgo.DefaultProduceTopic(b.topic))
	if _, err := b.db.Pool.Exec(context.Background(), `
		CREATE TABLE cons_effect (
			id       bigserial PRIMARY KEY,
			event_id text NOT NULL,
			member   text NOT NULL,
			value    text
		)`); err != nil {
		t.Fatal(err)
	}
	return b
}

// consProduce produces records from..to-1 with event-id "ev-i", value "i",
// spread over partitions by key.
func (b *consBundle) consProduce(t *testing.T, from, to int) {
	t.Helper()
	var recs []*kgo.Record
	for i := from; i < to; i++ {
		recs = append(recs, &kgo.Record{
			Key:     []byte("k" + strconv.Itoa(i%11)),
			Value:   []byte(strconv.Itoa(i)),
			Headers: []kgo.RecordHeader{{Key: kafka.HeaderEventID, Value: []byte("ev-" + strconv.Itoa(i))}},
		})
	}
	if err := b.prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// consEffectHandler inserts one cons_effect row per handled record.
func consEffectHandler(member string) kafka.Handler {
	return func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		_, err := tx.Exec(ctx, `INSERT INTO cons_effect (event_id, member, value) VALUES ($1, $2, $3)`,
			kafka.EventIDFromContext(ctx), member, string(rec.Value))
		return err
	}
}

func (b *consBundle) consConfig(extra func(*kafka.ConsumerConfig)) *kafka.ConsumerConfig {
	cfg := &kafka.ConsumerConfig{
		Brokers:       b.kc.Addrs,
		Group:         b.group,
		Topics:        []string{b.topic},
		BackoffMin:    time.Millisecond,
		CommitTimeout: 5 * time.Second,
		Logger:        slog.New(slog.DiscardHandler),
	}
	if extra != nil {
		extra(cfg)
	}
	return cfg
}

func (b *consBundle) consStart(t *testing.T, h kafka.Handler, extra func(*kafka.ConsumerConfig)) *kafka.Consumer {
	t.Helper()
	c, err := kafka.NewConsumer(b.db.Pool, h, b.consConfig(extra))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return c
}

// onOutcome returns a hook calling f with each record's terminal kind
// (processed, duplicate, dead-lettered, abandoned).
func onOutcome(f func(ctx context.Context, k consume.Kind)) func(context.Context, kafka.ConsumerEvent) context.Context {
	return func(ctx context.Context, e kafka.ConsumerEvent) context.Context {
		switch e.Kind {
		case consume.KindProcessed, consume.KindDuplicate, consume.KindDeadLettered, consume.KindAbandoned:
			f(ctx, e.Kind)
		}
		return ctx
	}
}

// consWaitEffects polls until cons_effect holds at least n distinct events.
func (b *consBundle) consWaitEffects(t *testing.T, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var got int
		if err := b.db.Pool.QueryRow(context.Background(), `SELECT count(DISTINCT event_id) FROM cons_effect`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events handled after %v", got, n, timeout)
		}
		time.Sleep(20 * time.Millisecond) // polling interval, not a wait for an event
	}
}

// consAssertExactlyOnce checks that events ev-0..ev-(n-1) each have exactly
// one effect and nothing else does.
func (b *consBundle) consAssertExactlyOnce(t *testing.T, n int) {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `SELECT event_id, count(*) FROM cons_effect GROUP BY event_id`)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for rows.Next() {
		var id string
		var c int
		if err := rows.Scan(&id, &c); err != nil {
			t.Fatal(err)
		}
		counts[id] = c
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		id := "ev-" + strconv.Itoa(i)
		if counts[id] != 1 {
			t.Errorf("%s: %d effects, want 1", id, counts[id])
		}
		delete(counts, id)
	}
	if len(counts) > 0 {
		t.Errorf("unexpected effects: %v", counts)
	}
}

// consCommitted returns the group's committed offsets summed over partitions.
func (b *consBundle) consCommitted(t *testing.T) int64 {
	t.Helper()
	adm := kadm.NewClient(b.kc.Client(t))
	offs, err := adm.FetchOffsets(context.Background(), b.group)
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	offs.Each(func(o kadm.OffsetResponse) {
		if o.Err == nil && o.At > 0 {
			sum += o.At
		}
	})
	return sum
}

// TestConsumerRebalanceExactlyOnce: member A consumes while records keep
// arriving; member B joins mid-stream and takes partitions over. Each
// event's effect is recorded exactly once, and both members did work.
func TestConsumerRebalanceExactlyOnce(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			t.Parallel()
			b := consSetup(t, 4)
			var handledA, handledB atomic.Int64
			count := func(n *atomic.Int64) func(*kafka.ConsumerConfig) {
				return func(cfg *kafka.ConsumerConfig) {
					cfg.Batch = batch
					cfg.MaxPollRecords = 20
					cfg.ClientOpts = []kgo.Opt{kgo.HeartbeatInterval(200 * time.Millisecond)}
					cfg.Hook = onOutcome(func(_ context.Context, k consume.Kind) {
						if k == consume.KindProcessed {
							n.Add(1)
						}
					})
				}
			}
			b.consStart(t, consEffectHandler("A"), count(&handledA))
			b.consProduce(t, 0, 100)
			b.consWaitEffects(t, 50, 30*time.Second)
			b.consStart(t, consEffectHandler("B"), count(&handledB))
			// Keep producing, a chunk at a time (so the backlog stays small
			// and the join lands mid-stream), until B has taken over some
			// work and at least 600 records went out.
			total := 100
			deadline := time.Now().Add(60 * time.Second)
			for total < 600 || handledB.Load() < 20 {
				if time.Now().After(deadline) {
					t.Fatalf("B handled %d records in 60s", handledB.Load())
				}
				b.consProduce(t, total, total+20)
				total += 20
				b.consWaitEffects(t, total-40, 60*time.Second)
			}
			b.consWaitEffects(t, total, 60*time.Second)
			b.consAssertExactlyOnce(t, total)
			if handledA.Load() == 0 || handledB.Load() == 0 {
				t.Fatalf("handled: A %d, B %d; want both > 0 (no rebalance happened)", handledA.Load(), handledB.Load())
			}
			if got := handledA.Load() + handledB.Load(); got != int64(total) {
				t.Errorf("handler committed %d times, want %d", got, total)
			}
		})
	}
}

// TestConsumerPoisonGoesToDeadLetter: a record the handler always fails on
// is retried MaxAttempts times and dead-lettered with the error in its
// headers; a Permanent error is dead-lettered at once; the records after
// them on the same partition are handled, in order.
func TestConsumerPoisonGoesToDeadLetter(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			t.Parallel()
			b := consSetup(t, 1)
			var attempts sync.Map // value -> *atomic.Int64
			h := func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
				n, _ := attempts.LoadOrStore(string(rec.Value), new(atomic.Int64))
				n.(*atomic.Int64).Add(1)
				switch string(rec.Value) {
				case "3":
					return errors.New("poison: amount is negative")
				case "6":
					return kafka.Permanent(errors.New("malformed payload"))
				}
				return consEffectHandler("A")(ctx, tx, rec)
			}
			b.consStart(t, h, func(cfg *kafka.ConsumerConfig) {
				cfg.Batch = batch
				cfg.MaxAttempts = 3
			})
			b.consProduce(t, 0, 10)
			dl := b.kc.ReadAll(t, b.topic+kafka.DeadLetterSuffixDefault, 2, 60*time.Second)
			b.consWaitEffects(t, 8, 60*time.Second)

			wantDL := []struct{ value, err, attempts string }{
				{"3", "poison: amount is negative", "3"},
				{"6", "malformed payload", "1"},
			}
			for i, w := range wantDL {
				hs := map[string]string{}
				for _, h := range dl[i].Headers {
					hs[h.Key] = string(h.Value)
				}
				if string(dl[i].Value) != w.value || hs[kafka.HeaderDeadLetterError] != w.err || hs[kafka.HeaderDeadLetterAttempts] != w.attempts ||
					hs[kafka.HeaderEventID] != "ev-"+w.value || hs[kafka.HeaderDeadLetterSource] != b.topic+"/0/"+w.value {
					t.Errorf("dead letter %d = %q %v, want value %s error %q attempts %s", i, dl[i].Value, hs, w.value, w.err, w.attempts)
				}
			}
			// The partition carried on, in order, without the two bad records.
			rows, err := b.db.Pool.Query(context.Background(), `SELECT value FROM cons_effect ORDER BY id`)
			if err != nil {
				t.Fatal(err)
			}
			got, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			if want := "0 1 2 4 5 7 8 9"; strings.Join(got, " ") != want {
				t.Errorf("effects in order %v, want %s", got, want)
			}
			// The poison record ran MaxAttempts times in per-record mode
			// (+1 for the failed batch in batch mode); no record got a
			// second processed_event row.
			n, _ := attempts.Load("3")
			if want := int64(3); n.(*atomic.Int64).Load() < want || n.(*atomic.Int64).Load() > want+1 {
				t.Errorf("poison attempts = %d, want 3 (or 4 in batch mode)", n.(*atomic.Int64).Load())
			}
		})
	}
}

// TestConsumerDuplicatesSkipped: the same event id delivered three times
// (as a relay that crashed before marking it published would) reaches the
// handler once; a record without the header gets topic/partition/offset.
func TestConsumerDuplicatesSkipped(t *testing.T) {
	t.Parallel()
	for _, form := range []inbox.Form{inbox.FormDoNothing, inbox.FormDoUpdate} {
		t.Run(string(form), func(t *testing.T) {
			t.Parallel()
			b := consSetup(t, 1)
			var mu sync.Mutex
			outcomes := map[string][]consume.Kind{}
			b.consStart(t, consEffectHandler("A"), func(cfg *kafka.ConsumerConfig) {
				cfg.InboxForm = form
				cfg.Hook = onOutcome(func(ctx context.Context, k consume.Kind) {
					mu.Lock()
					defer mu.Unlock()
					id := kafka.EventIDFromContext(ctx)
					outcomes[id] = append(outcomes[id], k)
				})
			})
			b.consProduce(t, 0, 1)
			b.consProduce(t, 0, 1)
			b.consProduce(t, 0, 1)
			if err := b.prod.ProduceSync(context.Background(), &kgo.Record{Value: []byte("no header")}).FirstErr(); err != nil {
				t.Fatal(err)
			}
			b.consWaitEffects(t, 2, 30*time.Second)
			var ids []string
			rows, _ := b.db.Pool.Query(context.Background(), `SELECT event_id FROM cons_effect ORDER BY id`)
			ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(ids, ",") != "ev-0,orders/0/3" {
				t.Fatalf("effects for %v, want ev-0 once and orders/0/3", ids)
			}
			mu.Lock()
			defer mu.Unlock()
			if fmt.Sprint(outcomes["ev-0"]) != "[processed duplicate duplicate]" {
				t.Errorf("outcomes of ev-0 = %v", outcomes["ev-0"])
			}
		})
	}
}

// TestConsumerGracefulStop: Stop while the handler is in the middle of a
// record waits for it, commits its transaction and its offset, and leaves
// the group, so a member that is already in the group gets the partitions
// well before the session timeout (30s here) would hand them over.
func TestConsumerGracefulStop(t *testing.T) {
	t.Parallel()
	b := consSetup(t, 2)
	const session = 30 * time.Second
	entered := make(chan string, 100)
	release := make(chan struct{})
	slow := func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		entered <- string(rec.Value)
		<-release
		return consEffectHandler("A")(ctx, tx, rec)
	}
	opts := func(cfg *kafka.ConsumerConfig) {
		cfg.ClientOpts = []kgo.Opt{kgo.SessionTimeout(session)}
	}
	a, err := kafka.NewConsumer(b.db.Pool, slow, b.consConfig(opts))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	b.consProduce(t, 0, 40)
	inHand := <-entered

	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		stopped <- a.Stop(ctx)
	}()
	// Stop must be waiting for the record in hand.
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned (%v) while a record was in hand", err)
	case <-time.After(100 * time.Millisecond): // a bounded look for a wrong early return
	}
	close(release)
	if err := <-stopped; err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := a.Stop(context.Background()); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	var n int
	if err := b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM cons_effect WHERE value = $1`, inHand).Scan(&n); err != nil || n != 1 {
		t.Fatalf("record in hand %s: %d effects (%v), want 1", inHand, n, err)
	}
	var effects int
	_ = b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM cons_effect`).Scan(&effects)
	if c := b.consCommitted(t); c != int64(effects) {
		t.Fatalf("committed offsets %d, effects %d: Stop did not commit what it finished", c, effects)
	}

	// A second member takes over from the committed offsets at once: A left
	// the group instead of letting its session expire.
	start := time.Now()
	b.consStart(t, consEffectHandler("B"), opts)
	b.consWaitEffects(t, 40, session/2)
	b.consAssertExactlyOnce(t, 40)
	t.Logf("takeover after stop: %v", time.Since(start))
}

// TestConsumerHardStop: when Stop's ctx ends before the handler finishes,
// Stop returns ctx.Err() and the handler goes on; HardStop then cancels
// the handler's ctx, its transaction rolls back, and the record is handled
// by the next member. (Before the consumer moved onto internal/startstop,
// an ended Stop ctx was itself the hard stop; now HardStop is, as for
// every component.)
func TestConsumerHardStop(t *testing.T) {
	t.Parallel()
	b := consSetup(t, 1)
	entered := make(chan struct{}, 10)
	stuck := func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		if _, err := tx.Exec(ctx, `INSERT INTO cons_effect (event_id, member) VALUES ($1, 'stuck')`, kafka.EventIDFromContext(ctx)); err != nil {
			return err
		}
		entered <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	}
	a, err := kafka.NewConsumer(b.db.Pool, stuck, b.consConfig(nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	b.consProduce(t, 0, 3)
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := a.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop = %v, want deadline exceeded", err)
	}
	hctx, hcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer hcancel()
	if err := a.HardStop(hctx); err != nil {
		t.Fatalf("HardStop: %v", err)
	}
	b.consStart(t, consEffectHandler("B"), nil)
	b.consWaitEffects(t, 3, 30*time.Second)
	b.consAssertExactlyOnce(t, 3)
	// The goroutine of a finishes on its own (goleak in TestMain checks).
	if err := a.Stop(context.Background()); err != nil {
		t.Fatalf("Stop after hard stop: %v", err)
	}
}

func TestConsumerLifecycleAndConfig(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	h := consEffectHandler("A")
	ok := func() *kafka.ConsumerConfig {
		return &kafka.ConsumerConfig{Brokers: []string{"127.0.0.1:1"}, Group: "g", Topics: []string{"t"}}
	}
	testCases := []struct {
		name   string
		mutate func(*kafka.ConsumerConfig)
		want   string
	}{
		{"no brokers", func(c *kafka.ConsumerConfig) { c.Brokers = nil }, "Brokers"},
		{"no group", func(c *kafka.ConsumerConfig) { c.Group = "" }, "Group"},
		{"no topics", func(c *kafka.ConsumerConfig) { c.Topics = nil }, "Topics"},
		{"empty topic", func(c *kafka.ConsumerConfig) { c.Topics = []string{""} }, "Topics"},
		{"negative attempts", func(c *kafka.ConsumerConfig) { c.MaxAttempts = -1 }, "MaxAttempts"},
		{"negative backoff", func(c *kafka.ConsumerConfig) { c.BackoffMin = -1 }, "BackoffMin"},
		{"backoff max below min", func(c *kafka.ConsumerConfig) { c.BackoffMin, c.BackoffMax = time.Second, time.Millisecond }, "BackoffMax"},
		{"negative dead-letter attempts", func(c *kafka.ConsumerConfig) { c.DeadLetterAttempts = -1 }, "DeadLetterAttempts"},
		{"negative commit timeout", func(c *kafka.ConsumerConfig) { c.CommitTimeout = -1 }, "CommitTimeout"},
		{"bad form", func(c *kafka.ConsumerConfig) { c.InboxForm = "sideways" }, "InboxForm"},
	}
	for _, tt := range testCases {
		cfg := ok()
		tt.mutate(cfg)
		_, err := kafka.NewConsumer(db.Pool, h, cfg)
		if !errors.Is(err, kafka.ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err = %v, want ErrInvalidConfig naming %s", tt.name, err, tt.want)
		}
	}
	if _, err := kafka.NewConsumer(db.Pool, nil, ok()); !errors.Is(err, kafka.ErrInvalidConfig) {
		t.Errorf("nil handler: %v", err)
	}
	if _, err := kafka.NewConsumer(db.Pool, h, nil); !errors.Is(err, kafka.ErrInvalidConfig) {
		t.Errorf("nil config: %v", err)
	}

	c, err := kafka.NewConsumer(db.Pool, h, ok())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for range 2 {
		if err := c.Stop(ctx); err != nil {
			t.Fatalf("Stop before Start: %v", err)
		}
		if err := c.HardStop(ctx); err != nil {
			t.Fatalf("HardStop before Start: %v", err)
		}
	}

	// Start twice, Stop twice, against an unreachable broker: Stop still
	// returns promptly.
	c, _ = kafka.NewConsumer(db.Pool, h, ok())
	for range 2 {
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		if err := c.Stop(sctx); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		cancel()
	}
	if got := kafka.RecordEventID(&kgo.Record{Topic: "t", Partition: 2, Offset: 7}); got != "t/2/7" {
		t.Errorf("RecordEventID without header = %q", got)
	}
	if kafka.Permanent(nil) != nil || !kafka.IsPermanent(fmt.Errorf("x: %w", kafka.Permanent(io.EOF))) {
		t.Error("Permanent/IsPermanent")
	}
}

// TestConsumerStopHandsPartitionsToLiveMember: A and B share the topic;
// A stops gracefully; the records that keep arriving on A's partitions are
// handled by B well within the 30s session timeout, which only happens if
// A left the group rather than vanished.
func TestConsumerStopHandsPartitionsToLiveMember(t *testing.T) {
	t.Parallel()
	b := consSetup(t, 2)
	const session = 30 * time.Second
	var handledA, handledB atomic.Int64
	opts := func(n *atomic.Int64) func(*kafka.ConsumerConfig) {
		return func(cfg *kafka.ConsumerConfig) {
			cfg.ClientOpts = []kgo.Opt{kgo.SessionTimeout(session), kgo.HeartbeatInterval(200 * time.Millisecond)}
			cfg.Hook = onOutcome(func(context.Context, consume.Kind) { n.Add(1) })
		}
	}
	a, err := kafka.NewConsumer(b.db.Pool, consEffectHandler("A"), b.consConfig(opts(&handledA)))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	b.consStart(t, consEffectHandler("B"), opts(&handledB))
	total := 0
	deadline := time.Now().Add(30 * time.Second)
	for handledA.Load() == 0 || handledB.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("members never shared the topic: A %d, B %d", handledA.Load(), handledB.Load())
		}
		b.consProduce(t, total, total+10)
		total += 10
		b.consWaitEffects(t, total, 30*time.Second)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := a.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	doneA := handledA.Load()
	b.consProduce(t, total, total+40) // lands on both partitions
	total += 40
	b.consWaitEffects(t, total, session/2)
	b.consAssertExactlyOnce(t, total)
	if handledA.Load() != doneA {
		t.Fatalf("A handled records after Stop returned")
	}
}

// TestConsumerDeadLetterErrorHeaderCut: a handler error of 5000 bytes
// reaches the dead-letter topic cut to consume.DeadLetterErrorMaxBytes, so
// that the copy of a record stays close to the record's size; the hook
// sees the whole error.
func TestConsumerDeadLetterErrorHeaderCut(t *testing.T) {
	t.Parallel()
	b := consSetup(t, 1)
	long := "invalid: " + strings.Repeat("ü", 2500)
	var hookErr atomic.Value
	b.consStart(t, func(context.Context, pgx.Tx, *kgo.Record) error {
		return kafka.Permanent(errors.New(long))
	}, func(cfg *kafka.ConsumerConfig) {
		cfg.Hook = func(ctx context.Context, e kafka.ConsumerEvent) context.Context {
			if e.Kind == consume.KindDeadLettered {
				hookErr.Store(e.Err.Error())
				if kafka.RecordOf(e) == nil || string(kafka.RecordOf(e).Value) != "0" {
					t.Errorf("RecordOf(dead-lettered event) = %v", kafka.RecordOf(e))
				}
			}
			return ctx
		}
	})
	b.consProduce(t, 0, 1)
	dl := b.kc.ReadAll(t, b.topic+kafka.DeadLetterSuffixDefault, 1, 30*time.Second)
	var got string
	for _, h := range dl[0].Headers {
		if h.Key == kafka.HeaderDeadLetterError {
			got = string(h.Value)
		}
	}
	if len(got) > consume.DeadLetterErrorMaxBytes || !strings.HasPrefix(long, strings.TrimSuffix(got, "…")) || !strings.HasSuffix(got, "…") {
		t.Errorf("dlq-error header: %d bytes, %q…", len(got), got[:min(40, len(got))])
	}
	// The hook runs right after the produce returned: poll for it.
	deadline := time.Now().Add(30 * time.Second)
	for hookErr.Load() == nil && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // polling interval
	}
	if s, _ := hookErr.Load().(string); s != long {
		t.Errorf("hook error: %d bytes, want the whole %d", len(s), len(long))
	}
}

// TestConsumerStuckDeadLetter is the stuck case through kafka's own API
// (the kit runs it on the bare driver): the dead-letter topic is missing
// (kfake does not create topics), so the poison on partition 0 is reported
// stuck through the hook after DeadLetterAttempts, partition 1 goes on,
// and Stop returns.
func TestConsumerStuckDeadLetter(t *testing.T) {
	t.Parallel()
	b := consSetup(t, 2)
	prod := b.kc.Client(t, kgo.DefaultProduceTopic(b.topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	var stuck, failed atomic.Int64
	h := func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		if string(rec.Value) == "poison" {
			return kafka.Permanent(errors.New("poison"))
		}
		return consEffectHandler("A")(ctx, tx, rec)
	}
	c, err := kafka.NewConsumer(b.db.Pool, h, b.consConfig(func(cfg *kafka.ConsumerConfig) {
		cfg.DeadLetterTopic = "missing.dlq"
		cfg.SkipDeadLetterTopicCheck = true // the topic is missing on purpose
		cfg.DeadLetterAttempts, cfg.DeadLetterTimeout, cfg.BackoffMax = 2, 2*time.Second, 100*time.Millisecond
		cfg.Hook = func(ctx context.Context, e kafka.ConsumerEvent) context.Context {
			switch e.Kind {
			case consume.KindStuck:
				stuck.Add(1)
			case consume.KindDeadLetterFailed:
				failed.Add(1)
			}
			return ctx
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	rec := func(p int32, id, v string) *kgo.Record {
		return &kgo.Record{Partition: p, Value: []byte(v), Headers: []kgo.RecordHeader{{Key: kafka.HeaderEventID, Value: []byte(id)}}}
	}
	if err := prod.ProduceSync(context.Background(), rec(0, "poison", "poison"), rec(0, "ev-after", "after")).FirstErr(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for stuck.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no stuck event in 60s (%d dead-letter failures)", failed.Load())
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
	if err := prod.ProduceSync(context.Background(), rec(1, "ev-0", "p1")).FirstErr(); err != nil {
		t.Fatal(err)
	}
	b.consWaitEffects(t, 1, 30*time.Second)
	var after int
	_ = b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM cons_effect WHERE event_id = 'ev-after'`).Scan(&after)
	if after != 0 || stuck.Load() != 1 || failed.Load() < 2 {
		t.Errorf("ev-after handled %d times (want 0), %d stuck events (want 1), %d dead-letter failures (want >= 2)", after, stuck.Load(), failed.Load())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		t.Fatalf("Stop with a stuck record: %v", err)
	}
}

// The consumer is a lifecycle component as it is: no adapter.
var (
	_ lifecycle.Component   = (*kafka.Consumer)(nil)
	_ lifecycle.HardStopper = (*kafka.Consumer)(nil)
)
