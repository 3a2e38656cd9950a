package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/cmd/internal/otelenv"
	"github.com/idemkit/idem/internal/cli"
	"github.com/idemkit/idem/internal/httpserver"
	"github.com/idemkit/idem/paysim"
)

func init() {
	register(&cli.Command{Name: "paysim", Summary: "run the payment-provider simulator (Idempotency-Key, faults, ledger)", Run: runPaysim})
}

const paysimUsage = `Usage: idem paysim [--addr ADDR] [--fail-rate P] [--drop-rate P] [--decline-rate P] [--latency D] [--seed N]
                   [--max-ledger-entries N] [--max-ledger-bytes SIZE] [--max-conns N] [--max-header-bytes N]
                   [--read-header-timeout D] [--read-timeout D] [--write-timeout D] [--idle-timeout D]
                   [--store memory|postgres|URL] [-v]

Runs a payment provider that honours Idempotency-Key:

  POST /charges  Idempotency-Key, {"order_id","customer_id","amount_kopecks"}
                 → 201 {"charge_id"}, or 402 CARD_DECLINED (problem+json)
  GET  /ledger   [?after=CURSOR&limit=N]
                 → {"charges":[{"charge_id","idempotency_key","order_id","customer_id",
                    "principal","amount_kopecks","created_at"}…],
                    "declines":[{"decline_id","idempotency_key","order_id","customer_id",
                    "principal","amount_kopecks","code","created_at"}…], "next":CURSOR}
  GET  /metrics  → Prometheus text (paysim_charges_total, paysim_declines_total, ...)

The same key and body replay the first answer (Idempotent-Replayed: true) and
never charge twice; the ledger holds at most one entry, a charge or a decline,
per key. Faults, each drawn reproducibly from --seed and the key: --fail-rate
answers 500 before charging (a retry may succeed), --drop-rate charges and then
closes the connection without an answer, --latency delays every charge.
--decline-rate declines that share of keys for good: a 402 CARD_DECLINED that
charges nothing, is recorded in the ledger's declines, and is the key's answer
on every retry (it depends on the seed and the key only). -v logs every charge
step to stderr.

The principal scoping keys is the Authorization header value (or "paysim"
without one); paysim authenticates nobody, so never send it a real
credential. GET /ledger shows the caller's own principal's entries, all of
them or a page (limit 1..10000, after = the previous page's "next"; no "next"
on the last page). With PAYSIM_LEDGER_TOKEN set (at least 16 characters; an
environment variable only, since a command line is visible to every local
user), "Authorization: Bearer <token>" sees every principal's entries.

Bounds: order_id and customer_id at most 255 bytes, the principal 1024 (400
FIELD_TOO_LONG); the ledger remembers at most --max-ledger-entries keys and
--max-ledger-bytes of them (SIZE as 1048576, 64KiB, 256MiB, 1GiB), beyond
which a new key is 507 LEDGER_FULL, nothing charged, while known keys are still
answered; at most --max-conns connections, one more gets 503
TOO_MANY_CONNECTIONS. A request's line and header are at most
--max-header-bytes (431 beyond) and must arrive within --read-header-timeout,
the whole request within --read-timeout, its answer within --write-timeout
(plus --latency), which must therefore exceed --read-timeout; a keep-alive
connection idle for --idle-timeout is closed.

--store keeps the idempotency records of POST /charges in memory (the
default), in PostgreSQL (postgres: DATABASE_URL, or a postgres:// URL; idem's
tables are migrated up) or in Redis (redis: REDIS_URL, else
127.0.0.1:6379/0, or a redis:// URL; keys under {paysim}: unless the URL has
?prefix=). The ledger stays in memory: a shared store makes restarted or
several simulators answer a known key alike. A Redis whose settings void the guarantee (no AOF, eviction) is
warned about on stderr; one that cannot be reached is an error.

It listens on 127.0.0.1:8090 by default. Any address that is not loopback is
an explicit choice, and paysim warns about it on stderr. Prints "paysim
listening on HOST:PORT" once it accepts connections (--addr 127.0.0.1:0 picks
a free port). SIGTERM or SIGINT stops it gracefully within SHUTDOWN_TIMEOUT
(default 25s).

Every flag defaults to its environment variable: PAYSIM_ADDR (default
127.0.0.1:8090), PAYSIM_FAIL_RATE, PAYSIM_DROP_RATE, PAYSIM_DECLINE_RATE,
PAYSIM_LATENCY, PAYSIM_SEED, PAYSIM_MAX_LEDGER_ENTRIES (1000000),
PAYSIM_MAX_LEDGER_BYTES (256MiB), PAYSIM_MAX_CONNS (256),
PAYSIM_MAX_HEADER_BYTES (32768), PAYSIM_READ_HEADER_TIMEOUT (5s),
PAYSIM_READ_TIMEOUT (10s), PAYSIM_WRITE_TIMEOUT (30s), PAYSIM_IDLE_TIMEOUT
(60s).

OTEL_TRACES_EXPORTER=otlp|console|none (default none) exports a span per
charge request, continuing the caller's traceparent (billing's charge worker
sends its attempt's); console prints one JSON span a line on stdout. The
exporters read the other standard OTEL_* variables (OTEL_SERVICE_NAME,
OTEL_EXPORTER_OTLP_ENDPOINT, ...).`

// paysimAddrDefault is loopback: paysim authenticates nobody, so listening
// on every interface must be asked for.
const paysimAddrDefault = "127.0.0.1:8090"

func runPaysim(ctx context.Context, args []string) error {
	failEnv, err := floatEnv("PAYSIM_FAIL_RATE")
	if err != nil {
		return err
	}
	dropEnv, err := floatEnv("PAYSIM_DROP_RATE")
	if err != nil {
		return err
	}
	declineEnv, err := floatEnv("PAYSIM_DECLINE_RATE")
	if err != nil {
		return err
	}
	latencyEnv := time.Duration(0)
	if os.Getenv("PAYSIM_LATENCY") != "0" {
		if latencyEnv, err = cli.DurationEnv("PAYSIM_LATENCY", 0); err != nil {
			return err
		}
	}
	var seedEnv uint64
	if v := os.Getenv("PAYSIM_SEED"); v != "" {
		if seedEnv, err = strconv.ParseUint(v, 10, 64); err != nil {
			return cli.Usagef("PAYSIM_SEED=%q is not a non-negative integer", v)
		}
	}
	entriesEnv, err := intEnv("PAYSIM_MAX_LEDGER_ENTRIES", paysim.MaxLedgerEntriesDefault)
	if err != nil {
		return err
	}
	bytesEnv := byteSize(paysim.MaxLedgerBytesDefault)
	if v := os.Getenv("PAYSIM_MAX_LEDGER_BYTES"); v != "" {
		if err := bytesEnv.Set(v); err != nil {
			return cli.Usagef("PAYSIM_MAX_LEDGER_BYTES=%q: %v", v, err)
		}
	}
	// The HTTP bounds are read as billing's HTTP_* are, from paysim's
	// defaults.
	hc := httpserver.Config{
		ReadHeaderTimeout: paysim.ReadHeaderTimeoutDefault, ReadTimeout: paysim.ReadTimeoutDefault,
		WriteTimeout: paysim.WriteTimeoutDefault, IdleTimeout: paysim.IdleTimeoutDefault,
		MaxHeaderBytes: paysim.MaxHeaderBytesDefault, MaxConns: paysim.MaxConnsDefault,
	}
	if err := hc.ReadEnv("PAYSIM_"); err != nil {
		return err
	}
	shutdown, err := cli.DurationEnv("SHUTDOWN_TIMEOUT", 25*time.Second)
	if err != nil {
		return err
	}

	fs := cli.FlagSet("paysim", paysimUsage)
	addr := fs.String("addr", cli.Env("PAYSIM_ADDR", paysimAddrDefault), "listen address; anything but loopback is warned about (env PAYSIM_ADDR)")
	failRate := fs.Float64("fail-rate", failEnv, "share of charges failing with 500 before charging, 0..1 (env PAYSIM_FAIL_RATE)")
	dropRate := fs.Float64("drop-rate", dropEnv, "share of 201s dropped after charging, 0..1 (env PAYSIM_DROP_RATE)")
	declineRate := fs.Float64("decline-rate", declineEnv, "share of keys declined for good with 402 CARD_DECLINED, 0..1 (env PAYSIM_DECLINE_RATE)")
	latency := fs.Duration("latency", latencyEnv, "added to every charge (env PAYSIM_LATENCY)")
	seed := fs.Uint64("seed", seedEnv, "seed of the fault draws (env PAYSIM_SEED)")
	maxEntries := fs.Int("max-ledger-entries", entriesEnv, "keys the ledger remembers before a new one is 507 LEDGER_FULL (env PAYSIM_MAX_LEDGER_ENTRIES)")
	maxBytes := bytesEnv
	fs.Var(&maxBytes, "max-ledger-bytes", "`SIZE` of the ledger's memory budget, e.g. 256MiB (env PAYSIM_MAX_LEDGER_BYTES)")
	maxConns := fs.Int("max-conns", hc.MaxConns, "connections served at once; one more gets 503 TOO_MANY_CONNECTIONS (env PAYSIM_MAX_CONNS)")
	maxHeader := fs.Int("max-header-bytes", hc.MaxHeaderBytes, "bound of a request's line and header; a larger one gets 431 (env PAYSIM_MAX_HEADER_BYTES)")
	readHeader := fs.Duration("read-header-timeout", hc.ReadHeaderTimeout, "bound of a request's header (env PAYSIM_READ_HEADER_TIMEOUT)")
	read := fs.Duration("read-timeout", hc.ReadTimeout, "bound of a whole request, body included (env PAYSIM_READ_TIMEOUT)")
	write := fs.Duration("write-timeout", hc.WriteTimeout, "bound of an answer from the end of the request's header, plus --latency (env PAYSIM_WRITE_TIMEOUT)")
	idle := fs.Duration("idle-timeout", hc.IdleTimeout, "a keep-alive connection idle this long is closed (env PAYSIM_IDLE_TIMEOUT)")
	storeSpec := fs.String("store", cli.Env("PAYSIM_STORE", "memory"), "where POST /charges keeps its idempotency records: memory, postgres (DATABASE_URL), a postgres:// URL, redis (REDIS_URL, else 127.0.0.1:6379/0) or a redis:// URL (env PAYSIM_STORE)")
	verbose := fs.Bool("v", false, "log every charge step to stderr")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.Usagef("unexpected argument %q", fs.Arg(0))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"--read-header-timeout", *readHeader}, {"--read-timeout", *read}, {"--write-timeout", *write}, {"--idle-timeout", *idle}} {
		if d.v <= 0 {
			// 0 would mean "no timeout" to net/http: exactly what these
			// flags exist to prevent.
			return cli.Usagef("%s %v must be positive", d.name, d.v)
		}
	}
	if *maxEntries <= 0 || *maxConns <= 0 || maxBytes <= 0 || *maxHeader <= 0 {
		return cli.Usagef("--max-ledger-entries, --max-ledger-bytes, --max-conns and --max-header-bytes must be positive")
	}
	cfg := &paysim.Config{
		FailRate: *failRate, DropRate: *dropRate, DeclineRate: *declineRate, Latency: *latency, Seed: *seed,
		MaxLedgerEntries: *maxEntries, MaxLedgerBytes: int64(maxBytes), LedgerToken: os.Getenv("PAYSIM_LEDGER_TOKEN"),
		ReadHeaderTimeout: *readHeader, ReadTimeout: *read, WriteTimeout: *write, IdleTimeout: *idle,
		MaxConns: *maxConns, MaxHeaderBytes: *maxHeader,
	}
	if *verbose {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	tel, err := otelenv.FromEnv(ctx, "paysim")
	if err != nil {
		return cli.Usagef("%v", err)
	}
	defer func() {
		if ferr := tel.Shutdown(context.WithoutCancel(ctx)); ferr != nil {
			fmt.Fprintf(os.Stderr, "paysim: flushing telemetry: %v\n", ferr)
		}
	}()
	if tel.Tel != nil {
		cfg.Hook, cfg.Wrap = tel.Tel.RequestHook(), tel.Tel.Handler
	}
	istore, err := openStore(ctx, *storeSpec, cli.DatabaseURL(), "{paysim}:", slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err != nil {
		return err
	}
	defer istore.close()
	cfg.Store = istore.store
	sim, err := paysim.New(cfg)
	if err != nil {
		// Only flag values and PAYSIM_LEDGER_TOKEN can make the config
		// invalid.
		return cli.Usagef("%v", err)
	}

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", *addr, err)
	}
	if a, ok := ln.Addr().(*net.TCPAddr); ok && !a.IP.IsLoopback() {
		fmt.Fprintf(os.Stderr, "paysim: warning: %s is not a loopback address: any host that reaches it can charge, "+
			"and read the ledger of the principal it sends (paysim authenticates nobody)\n", ln.Addr())
	}
	if err := sim.Start(ctx); err != nil {
		ln.Close()
		return err
	}
	served := make(chan error, 1)
	go func() { served <- sim.Serve(ln) }()
	fmt.Printf("paysim listening on %s\n", ln.Addr())

	select {
	case err := <-served:
		_ = sim.Stop(context.Background())
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	// Graceful: stop accepting, let in-flight charges finish (each one is
	// either charged and answered, or not charged), bounded by
	// SHUTDOWN_TIMEOUT. Dropped connections were hijacked and are already
	// closed.
	sctx, cancel := context.WithTimeout(context.Background(), shutdown)
	defer cancel()
	err = sim.Shutdown(sctx)
	<-served
	_ = sim.Stop(sctx)
	st := sim.Stats()
	fmt.Printf("paysim stopped: %d charges, %d declines, %d injected failures, %d dropped responses\n", st.Charged, st.Declined, st.Failed, st.Dropped)
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}

func floatEnv(key string) (float64, error) {
	v := os.Getenv(key)
	if v == "" {
		return 0, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0, cli.Usagef("%s=%q is not a number", key, v)
	}
	return f, nil
}

func intEnv(key string, def int) (int, error) {
	v := os.Getenv(key)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, cli.Usagef("%s=%q is not an integer", key, v)
	}
	return n, nil
}

// byteSize is a flag value of bytes: an integer, optionally with a KiB,
// MiB or GiB suffix.
type byteSize int64

func (b *byteSize) String() string { return strconv.FormatInt(int64(*b), 10) }

func (b *byteSize) Set(s string) error {
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = n, u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/mult {
		return errors.New("not a size: an integer of bytes, optionally with KiB, MiB or GiB")
	}
	*b = byteSize(n * mult)
	return nil
}
