package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idem/idemgrpc"
	"github.com/idemkit/idem/idemgrpc/testsvc"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/cli"
	"github.com/idemkit/idem/migrate"
)

func init() {
	registerBench(&benchScenario{
		Name: "grpc",
		Summary: "idemgrpc's unary interceptor over PostgreSQL, concurrent clients over loopback gRPC.\n" +
			"grpc-plain: the same unary method with no interceptor, its handler writing the\n" +
			"  same one row through the pool (the baseline); grpc-tx: the interceptor in\n" +
			"  ModeTransactional, the row, the claim and the stored response in one commit;\n" +
			"  grpc-replay: repeats of completed keys. grpc-tx's ratio is over grpc-plain\n" +
			"  in the same run (target >= 0.8). Interleaved rounds. Scratch schema (dropped after).",
		Flags: func(fs *benchFlags) {
			fs.Int("seconds", 10, "measured seconds per variant, split over the rounds")
			fs.Int("rounds", 5, "interleaved rounds: every round runs every variant once")
			fs.Int("clients", 32, "concurrent clients")
			fs.Int("conns", 0, "pool connections, shared by every variant (0: one per client, so no call waits for a connection)")
		},
		Run: runBenchGRPC,
	})
}

func runBenchGRPC(ctx context.Context, env *benchEnv) ([]benchResult, error) {
	seconds, clients, rounds := *env.Ints["seconds"], *env.Ints["clients"], *env.Ints["rounds"]
	if rounds < 1 || seconds < 1 || clients < 1 {
		return nil, cli.Usagef("--seconds, --rounds and --clients must be at least 1")
	}
	conns := clients
	if p := env.Ints["conns"]; p != nil && *p != 0 {
		conns = *p
	}
	if conns < 1 {
		return nil, cli.Usagef("--conns must be at least 1 (or 0: one per client)")
	}
	urls, drop, err := scratchSchemas(ctx, env.DatabaseURL, "bench_grpc", 1, nil)
	if err != nil {
		return nil, err
	}
	defer drop()
	pcfg, err := pgxpool.ParseConfig(urls[0])
	if err != nil {
		return nil, cli.Usagef("database URL is malformed")
	}
	// One connection per client by default, as bench http: a
	// transactional call holds its connection for the whole call (three
	// round trips) where grpc-plain holds one for its one INSERT, and a
	// pool smaller than the clients (pgxpool's default is max(4, NumCPU))
	// makes both queue for connections: it measures the pool, not the
	// interceptor (4 connections throttle grpc-plain the most, which
	// flatters the ratio; see docs/benchmarks.md).
	pcfg.MaxConns, pcfg.MinConns = int32(conns), int32(conns)
	// Named, so that the CPU meter finds the pool's backends.
	appName := "idem-bench-grpc-" + uniqueRun()
	pcfg.ConnConfig.RuntimeParams["application_name"] = appName
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("pool: %w", err)
	}
	defer pool.Close()
	if _, err := migrate.Up(ctx, pool); err != nil {
		return nil, fmt.Errorf("migrate scratch schema: %w", err)
	}
	// Open every connection now, so that no measured call waits for a
	// dial and the CPU meter finds every backend.
	held := make([]*pgxpool.Conn, 0, conns)
	for range conns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			for _, h := range held {
				h.Release()
			}
			return nil, fmt.Errorf("pool: %w", err)
		}
		held = append(held, c)
	}
	for _, h := range held {
		h.Release()
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE bench_grpc_row (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, body text NOT NULL)`); err != nil {
		return nil, err
	}
	// Every handler run writes one row: through the call's transaction
	// under the interceptor, else through the pool.
	svc := &testsvc.Service{Effect: func(ctx context.Context, _ string, _ *structpb.Struct) (int64, error) {
		const insert = `INSERT INTO bench_grpc_row (body) VALUES ($1) RETURNING id`
		var id int64
		if tx, ok := idemgrpc.Tx(ctx); ok {
			return id, tx.QueryRow(ctx, insert, benchHTTPBody).Scan(&id)
		}
		return id, pool.QueryRow(ctx, insert, benchHTTPBody).Scan(&id)
	}}
	ic, err := idemgrpc.New(idempotency.NewPostgresStore(pool), &idemgrpc.Config{
		Scope:       func(context.Context) (string, error) { return "bench", nil },
		Idempotency: idempotency.Config{Mode: idempotency.ModeTransactional},
	})
	if err != nil {
		return nil, err
	}
	plain, stopPlain, err := benchGRPCServer(svc)
	if err != nil {
		return nil, err
	}
	defer stopPlain()
	guarded, stopGuarded, err := benchGRPCServer(svc, grpc.ChainUnaryInterceptor(ic.Unary))
	if err != nil {
		return nil, err
	}
	defer stopGuarded()

	req, err := structpb.NewStruct(map[string]any{"amount_kopecks": 1000.0, "customer_id": "c1", "note": "bench"})
	if err != nil {
		return nil, err
	}
	run := uniqueRun()
	var seq atomic.Int64
	invoke := func(ctx context.Context, conn *grpc.ClientConn, key string) error {
		if key != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, key)
		}
		return conn.Invoke(ctx, testsvc.MethodCharge, req, &structpb.Struct{})
	}
	const replayKeys = 256
	variants := []benchVariant{
		{name: "grpc-plain", op: func(ctx context.Context) error { return invoke(ctx, plain, "") }},
		{name: "grpc-tx", op: func(ctx context.Context) error {
			return invoke(ctx, guarded, "bench-"+run+"-"+strconv.FormatInt(seq.Add(1), 10))
		}},
		{name: "grpc-replay", prep: func(ctx context.Context) error {
			for i := range replayKeys {
				if err := invoke(ctx, guarded, "replay-"+run+"-"+strconv.Itoa(i)); err != nil {
					return err
				}
			}
			return nil
		}, op: func(ctx context.Context) error {
			return invoke(ctx, guarded, "replay-"+run+"-"+strconv.Itoa(rand.IntN(replayKeys)))
		}},
	}
	meter := func() *cpuMeter { return newCPUMeter(ctx, pool, appName) }
	results, err := runBenchVariants(ctx, env, "grpc", variants, seconds, rounds, clients, meter)
	if err != nil {
		return nil, err
	}
	if base := results[0].OpsPerSec; base > 0 {
		results[1].Ratio = results[1].OpsPerSec / base
		fmt.Fprintf(env.Log, "grpc: grpc-tx/grpc-plain: %.3f (target >= 0.8)\n", results[1].Ratio)
	}
	return results, nil
}

// benchGRPCServer serves svc on a loopback port and returns a client
// connection to it (HTTP/2 multiplexes every client's calls on it).
func benchGRPCServer(svc *testsvc.Service, opts ...grpc.ServerOption) (*grpc.ClientConn, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	s := grpc.NewServer(opts...)
	testsvc.Register(s, svc)
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		s.Stop()
		<-done
		return nil, nil, err
	}
	return conn, func() { _ = conn.Close(); s.Stop(); <-done }, nil
}

// runBenchVariants runs variants interleaved in rounds, as bench http
// does (a drift of the shared machine hits every variant alike), and
// returns their results in order. newMeter, when not nil, is called once
// the variants are prepared (the pool full): the log then says each
// variant's CPU per operation, here and in the pool's backends.
func runBenchVariants(ctx context.Context, env *benchEnv, scenario string, variants []benchVariant, seconds, rounds, clients int, newMeter func() *cpuMeter) ([]benchResult, error) {
	for _, v := range variants {
		if v.prep != nil {
			if err := v.prep(ctx); err != nil {
				return nil, fmt.Errorf("%s: prepare: %w", v.name, err)
			}
		}
	}
	slice := time.Duration(seconds) * time.Second / time.Duration(rounds)
	samples := make([]benchSamples, len(variants))
	var meter *cpuMeter
	if newMeter != nil {
		meter = newMeter()
		for i := range samples {
			samples[i].meter = meter
		}
	}
	for round := range rounds {
		for i, v := range variants {
			warm := 200 * time.Millisecond
			if round == 0 {
				warm = time.Second
			}
			if err := benchLoad(ctx, clients, warm, slice, v.op, &samples[i]); err != nil {
				return nil, fmt.Errorf("%s: %w", v.name, err)
			}
		}
	}
	results := make([]benchResult, len(variants))
	for i, v := range variants {
		results[i] = samples[i].result(v.name)
		fmt.Fprintf(env.Log, "%s: %s: %.0f ops/s, p50 %.2f ms, p99 %.2f ms\n", scenario, v.name, results[i].OpsPerSec, results[i].P50Ms, results[i].P99Ms)
		if s := samples[i]; s.cpuSelf > 0 && len(s.lat) > 0 {
			n := float64(len(s.lat))
			fmt.Fprintf(env.Log, "%s: %s: CPU per op %.0f µs in this process (server and clients), %.0f µs in the pool's %d PostgreSQL backends; %d of %d pool acquires waited for a connection\n",
				scenario, v.name, float64(s.cpuSelf.Microseconds())/n, float64(s.cpuDB.Microseconds())/n, len(meter.backends), s.waited, s.acquires)
		}
	}
	return results, nil
}
