package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/internal/cli"
	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/kafkago"
	"github.com/idemkit/idem/migrate"
	"github.com/idemkit/idem/natsjs"
	"github.com/idemkit/idem/outbox"
)

// The publisher variants of `idem bench relay`: the same relay
// (at-least-once, one publisher call per batch) draining the same seeded
// events through each of idem's three publishers, batches interleaved so
// that a shared machine's load falls on all three alike:
//
//   - publisher-franz: package kafka (franz-go, idempotent producer), to
//     an in-process kfake broker;
//   - publisher-kafkago: package kafkago (segmentio/kafka-go's Writer), to
//     the same kfake broker;
//   - publisher-nats: package natsjs (JetStream, Nats-Msg-Id = event id),
//     to NATS_URL when set, else a nats-server -js child in a scratch
//     directory.
//
// They live in this file, added to the relay scenario by init (which runs
// after bench_relay.go's, file order), so that the relay's own variants
// stay as they are.
func init() {
	sc := benchScenarios["relay"]
	if sc == nil {
		panic("bench_relay_brokers.go: the relay scenario is not registered")
	}
	flags, run := sc.Flags, sc.Run
	sc.Summary += "\nThen publisher-franz, publisher-kafkago and publisher-nats: the at-least-once\n" +
		"relay draining --publisher-events events through each publisher (franz-go and\n" +
		"kafka-go to kfake; JetStream to NATS_URL, else a nats-server -js child)."
	sc.Flags = func(fs *benchFlags) {
		if flags != nil {
			flags(fs)
		}
		fs.Int("publisher-events", 20_000, "events drained through each publisher by the publisher-* variants (0: none)")
	}
	sc.Run = func(ctx context.Context, env *benchEnv) ([]benchResult, error) {
		n := *env.Ints["publisher-events"]
		if n < 0 {
			return nil, cli.Usagef("--publisher-events must not be negative")
		}
		results, err := run(ctx, env)
		if err != nil || n == 0 {
			return results, err
		}
		more, err := benchRelayPublishers(ctx, env, n, *env.Ints["aggregates"], *env.Ints["batch-size"])
		if err != nil {
			return nil, err
		}
		return append(results, more...), nil
	}
}

// benchRelayPublishers runs the three publisher variants.
func benchRelayPublishers(ctx context.Context, env *benchEnv, events, aggregates, batchSize int) ([]benchResult, error) {
	names := []string{"publisher-franz", "publisher-kafkago", "publisher-nats"}
	urls, drop, err := scratchSchemas(ctx, env.DatabaseURL, "bench_relay_pub", len(names), nil)
	if err != nil {
		return nil, err
	}
	defer drop()

	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		return nil, fmt.Errorf("start kfake: %w", err)
	}
	defer cluster.Close()
	addrs := cluster.ListenAddrs()
	cl, err := kgo.NewClient(append(kafka.ProducerOpts(), kgo.SeedBrokers(addrs...),
		kgo.ProducerBatchCompression(kgo.NoCompression()))...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, 8, 1, nil, "bench.relay")
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		return nil, fmt.Errorf("create topic: %w", err)
	}
	franz, err := kafka.NewPublisher(cl, nil)
	if err != nil {
		return nil, err
	}
	w := kafkago.NewWriter(addrs...)
	defer w.Close()
	kgoPub, err := kafkago.NewPublisher(w)
	if err != nil {
		return nil, err
	}
	natsURL, stopNATS, err := benchNATS(ctx, env)
	if err != nil {
		return nil, err
	}
	defer stopNATS()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		return nil, fmt.Errorf("nats connect %s: %w", cli.Redact(natsURL), err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	// A stream of its own under a random prefix: NATS_URL may be a shared
	// server.
	var b [4]byte
	_, _ = rand.Read(b[:])
	prefix := "bench" + hex.EncodeToString(b[:])
	scfg := natsjs.StreamConfig(natsjs.WithPrefix(prefix, "bench.relay"))
	if _, err := js.CreateStream(ctx, scfg); err != nil {
		return nil, fmt.Errorf("create stream: %w", err)
	}
	defer func() { _ = js.DeleteStream(context.WithoutCancel(ctx), scfg.Name) }()
	natsPub, err := natsjs.NewPublisher(js, &natsjs.PublisherConfig{Prefix: prefix})
	if err != nil {
		return nil, err
	}

	quiet := slog.New(slog.DiscardHandler)
	type variant struct {
		name    string
		pool    *pgxpool.Pool
		batch   func(context.Context) (int, error)
		lat     []float64
		elapsed time.Duration
		total   int
		done    bool
	}
	var vs []*variant
	for i, p := range []outbox.Publisher{franz, kgoPub, natsPub} {
		u, _ := url.Parse(urls[i])
		q := u.Query()
		q.Set("pool_max_conns", "4")
		u.RawQuery = q.Encode()
		pool, err := cli.Connect(ctx, u.String())
		if err != nil {
			return nil, err
		}
		defer pool.Close()
		if _, err := migrate.Up(ctx, pool); err != nil {
			return nil, fmt.Errorf("migrate scratch schema: %w", err)
		}
		r, err := outbox.NewRelay(pool, p, &outbox.RelayConfig{Mode: outbox.AtLeastOnce, BatchSize: batchSize, DisableNotify: true, Logger: quiet})
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(env.Log, "relay: %s: seeding %d events...\n", names[i], events)
		if err := benchRelaySeed(ctx, pool, "agg-", events, aggregates, 0); err != nil {
			return nil, fmt.Errorf("%s: seed: %w", names[i], err)
		}
		vs = append(vs, &variant{name: names[i], pool: pool, batch: r.RunBatch})
	}
	fmt.Fprintf(env.Log, "relay: draining %d events through each publisher, batches interleaved...\n", events)
	for active := len(vs); active > 0; {
		for _, v := range vs {
			if v.done {
				continue
			}
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			t0 := time.Now()
			k, err := v.batch(ctx)
			d := time.Since(t0)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", v.name, err)
			}
			v.elapsed += d
			if k == 0 {
				v.done = true
				active--
				continue
			}
			v.lat = append(v.lat, float64(d.Microseconds())/1000)
			v.total += k
		}
	}
	var results []benchResult
	for _, v := range vs {
		var published int
		if err := v.pool.QueryRow(ctx, "SELECT count(*) FROM outbox_event WHERE status = 'PUBLISHED'").Scan(&published); err != nil {
			return nil, err
		}
		if published != events || v.total != events {
			return nil, fmt.Errorf("%s: published %d (claimed %d) of %d events", v.name, published, v.total, events)
		}
		results = append(results, latencyResult(v.name, v.lat, events, v.elapsed))
	}
	// What reached the broker: every event at least once.
	info, err := js.Stream(ctx, scfg.Name)
	if err != nil {
		return nil, err
	}
	si, err := info.Info(ctx)
	if err != nil {
		return nil, err
	}
	if si.State.Msgs < uint64(events) {
		return nil, fmt.Errorf("publisher-nats: %d messages on the stream for %d events", si.State.Msgs, events)
	}
	return results, nil
}

// errNoNATS: neither NATS_URL nor nats-server.
var errNoNATS = errors.New("publisher-nats needs a NATS server: set NATS_URL (JetStream enabled) or put nats-server on PATH; --publisher-events 0 skips the publisher variants")

// benchNATS returns NATS_URL, else starts nats-server -js on a free
// loopback port with a scratch store directory, and returns its URL and
// what stops it.
func benchNATS(ctx context.Context, env *benchEnv) (string, func(), error) {
	if u := os.Getenv("NATS_URL"); u != "" {
		return u, func() {}, nil
	}
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		return "", nil, errNoNATS
	}
	dir, err := os.MkdirTemp("", "idem-bench-nats-")
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	cmd := exec.Command(bin, "-js", "-sd", dir, "-a", "127.0.0.1", "-p", strconv.Itoa(port))
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, fmt.Errorf("start nats-server: %w", err)
	}
	stop := func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = os.RemoveAll(dir)
	}
	u := "nats://127.0.0.1:" + strconv.Itoa(port)
	fmt.Fprintf(env.Log, "relay: started nats-server -js on %s\n", u)
	// Ready once JetStream answers.
	deadline := time.Now().Add(15 * time.Second)
	for {
		nc, err := nats.Connect(u, nats.Timeout(time.Second))
		if err == nil {
			js, _ := jetstream.New(nc)
			actx, cancel := context.WithTimeout(ctx, time.Second)
			_, err = js.AccountInfo(actx)
			cancel()
			nc.Close()
			if err == nil {
				return u, stop, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			stop()
			return "", nil, fmt.Errorf("nats-server on %s did not answer: %v", u, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
