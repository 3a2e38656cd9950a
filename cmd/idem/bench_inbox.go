package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/consume"
	"github.com/idemkit/idem/internal/cli"
	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/migrate"
)

func init() {
	registerBench(&benchScenario{
		Name: "inbox",
		Summary: "Kafka consumer runner: one transaction per record (per-record) against one\n" +
			"transaction per fetched partition batch (batch). Every record is deduplicated\n" +
			"through processed_event and its handler writes one row; offsets are committed\n" +
			"after the database. In-process kfake broker, scratch schema (dropped after).\n" +
			"ops_per_sec: records from the first transaction to the last commit;\n" +
			"p50/p99: a record's time from the start of its transaction to its commit.",
		Flags: func(fs *benchFlags) {
			fs.Int("records", 50000, "records consumed by each variant")
			fs.Int("partitions", 4, "partitions of the topic")
		},
		Run: runBenchInbox,
	})
}

func runBenchInbox(ctx context.Context, env *benchEnv) ([]benchResult, error) {
	records, partitions := *env.Ints["records"], *env.Ints["partitions"]
	if records < 1 {
		return nil, cli.Usagef("--records must be at least 1")
	}
	if partitions < 1 {
		return nil, cli.Usagef("--partitions must be at least 1")
	}

	urls, drop, err := scratchSchemas(ctx, env.DatabaseURL, "bench_inbox", 1, nil)
	if err != nil {
		return nil, err
	}
	defer drop()
	pool, err := cli.Connect(ctx, urls[0])
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if _, err := migrate.Up(ctx, pool); err != nil {
		return nil, fmt.Errorf("migrate scratch schema: %w", err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE bench_effect (event_id text NOT NULL, value bytea)`); err != nil {
		return nil, err
	}

	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		return nil, fmt.Errorf("start kfake: %w", err)
	}
	defer cluster.Close()
	const topic = "bench.events"
	if err := benchInboxProduce(ctx, cluster.ListenAddrs(), topic, partitions, records); err != nil {
		return nil, err
	}
	fmt.Fprintf(env.Log, "inbox: produced %d records over %d partitions\n", records, partitions)

	var results []benchResult
	for _, v := range []struct {
		name  string
		batch bool
	}{{"per-record", false}, {"batch", true}} {
		r, err := benchInboxRun(ctx, pool, cluster.ListenAddrs(), topic, v.name, v.batch, records)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", v.name, err)
		}
		fmt.Fprintf(env.Log, "inbox: %s: %.0f records/s\n", v.name, r.OpsPerSec)
		results = append(results, r)
	}
	return results, nil
}

func benchInboxProduce(ctx context.Context, addrs []string, topic string, partitions, n int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		return err
	}
	defer cl.Close()
	// The dead-letter topic too: the consumer checks it at Start.
	if err := kafka.EnsureTopics(ctx, cl, int32(partitions), topic, topic+kafka.DeadLetterSuffixDefault); err != nil {
		return err
	}
	const chunk = 5000
	for from := 0; from < n; from += chunk {
		var recs []*kgo.Record
		for i := from; i < min(from+chunk, n); i++ {
			recs = append(recs, &kgo.Record{
				Key:     []byte("order-" + strconv.Itoa(i%1000)),
				Value:   []byte(`{"order_id":"` + strconv.Itoa(i) + `","total_kopecks":1000}`),
				Headers: []kgo.RecordHeader{{Key: kafka.HeaderEventID, Value: []byte("ev-" + strconv.Itoa(i))}},
			})
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			return fmt.Errorf("produce: %w", err)
		}
	}
	return nil
}

// benchBeginner remembers when the current transaction began, so that each
// record's latency is the life of the transaction that committed it (the
// runner processes on one goroutine, so there is one current transaction).
type benchBeginner struct {
	consume.DB
	begun atomic.Int64
}

func (b *benchBeginner) Begin(ctx context.Context) (pgx.Tx, error) {
	b.begun.Store(time.Now().UnixNano())
	return b.DB.Begin(ctx)
}

// benchInboxRun consumes the whole topic with a fresh group and consumer id
// and returns the figures from the first transaction to the last record.
func benchInboxRun(ctx context.Context, db consume.DB, addrs []string, topic, name string, batch bool, n int) (benchResult, error) {
	bb := &benchBeginner{DB: db}
	var (
		mu        sync.Mutex
		latencies = make([]float64, 0, n)
		done      = make(chan struct{})
		count     int
		end       time.Time
	)
	var first atomic.Int64
	c, err := kafka.NewConsumer(bb, func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		first.CompareAndSwap(0, bb.begun.Load())
		_, err := tx.Exec(ctx, `INSERT INTO bench_effect (event_id, value) VALUES ($1, $2)`, kafka.EventIDFromContext(ctx), rec.Value)
		return err
	}, &kafka.ConsumerConfig{
		Brokers:    addrs,
		Group:      "bench-" + name,
		ConsumerID: "bench-" + name,
		Topics:     []string{topic},
		Batch:      batch,
		Logger:     slog.New(slog.DiscardHandler),
		Hook: func(ctx context.Context, e kafka.ConsumerEvent) context.Context {
			if e.Kind != consume.KindProcessed && e.Kind != consume.KindDuplicate && e.Kind != consume.KindDeadLettered {
				return ctx
			}
			now := time.Now()
			mu.Lock()
			defer mu.Unlock()
			latencies = append(latencies, float64(now.UnixNano()-bb.begun.Load())/1e6)
			if count++; count == n {
				end = now
				close(done)
			}
			return ctx
		},
	})
	if err != nil {
		return benchResult{}, err
	}
	if err := c.Start(ctx); err != nil {
		return benchResult{}, err
	}
	stop := func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = c.Stop(sctx)
	}
	select {
	case <-done:
	case <-ctx.Done():
		stop()
		return benchResult{}, ctx.Err()
	case <-time.After(30 * time.Minute):
		stop()
		return benchResult{}, errors.New("did not finish in 30 minutes")
	}
	stop()
	mu.Lock()
	defer mu.Unlock()
	return latencyResult(name, latencies, n, end.Sub(time.Unix(0, first.Load()))), nil
}
