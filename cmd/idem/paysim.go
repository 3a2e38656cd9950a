package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/idemkit/idem/internal/cli"
	"github.com/idemkit/idem/paysim"
)

func init() {
	register(&cli.Command{Name: "paysim", Summary: "run the payment-provider simulator (Idempotency-Key, faults, ledger)", Run: runPaysim})
}

const paysimUsage = `Usage: idem paysim [--addr ADDR] [--fail-rate P] [--drop-rate P] [--decline-rate P] [--latency D] [--seed N] [-v]

Runs a payment provider that honours Idempotency-Key:

  POST /charges  Idempotency-Key, {"order_id","customer_id","amount_kopecks"}
                 → 201 {"charge_id"}, or 402 CARD_DECLINED (problem+json)
  GET  /ledger   → {"charges":[{"charge_id","idempotency_key","order_id","customer_id",
                    "principal","amount_kopecks","created_at"}…],
                    "declines":[{"decline_id","idempotency_key","order_id","customer_id",
                    "principal","amount_kopecks","code","created_at"}…]}
  GET  /metrics  → Prometheus text (paysim_charges_total, paysim_declines_total, ...)

The same key and body replay the first answer (Idempotent-Replayed: true) and
never charge twice; the ledger holds at most one entry, a charge or a decline,
per key. Faults, each drawn reproducibly from --seed and the key: --fail-rate
answers 500 before charging (a retry may succeed), --drop-rate charges and then
closes the connection without an answer, --latency delays every charge.
--decline-rate declines that share of keys for good: a 402 CARD_DECLINED that
charges nothing, is recorded in the ledger's declines, and is the key's answer
on every retry (it depends on the seed and the key only). -v logs every charge
step to stderr. The principal scoping keys is the Authorization header value
(or "paysim" without one); it is shown in GET /ledger, so never send paysim a
real credential.

Prints "paysim listening on HOST:PORT" once it accepts connections (--addr
127.0.0.1:0 picks a free port). SIGTERM or SIGINT stops it gracefully within
SHUTDOWN_TIMEOUT (default 25s).

Every flag defaults to its environment variable: PAYSIM_ADDR (default :8090),
PAYSIM_FAIL_RATE, PAYSIM_DROP_RATE, PAYSIM_DECLINE_RATE, PAYSIM_LATENCY,
PAYSIM_SEED.`

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
	shutdown, err := cli.DurationEnv("SHUTDOWN_TIMEOUT", 25*time.Second)
	if err != nil {
		return err
	}

	fs := cli.FlagSet("paysim", paysimUsage)
	addr := fs.String("addr", cli.Env("PAYSIM_ADDR", ":8090"), "listen address (env PAYSIM_ADDR)")
	failRate := fs.Float64("fail-rate", failEnv, "share of charges failing with 500 before charging, 0..1 (env PAYSIM_FAIL_RATE)")
	dropRate := fs.Float64("drop-rate", dropEnv, "share of 201s dropped after charging, 0..1 (env PAYSIM_DROP_RATE)")
	declineRate := fs.Float64("decline-rate", declineEnv, "share of keys declined for good with 402 CARD_DECLINED, 0..1 (env PAYSIM_DECLINE_RATE)")
	latency := fs.Duration("latency", latencyEnv, "added to every charge (env PAYSIM_LATENCY)")
	seed := fs.Uint64("seed", seedEnv, "seed of the fault draws (env PAYSIM_SEED)")
	verbose := fs.Bool("v", false, "log every charge step to stderr")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.Usagef("unexpected argument %q", fs.Arg(0))
	}
	cfg := &paysim.Config{FailRate: *failRate, DropRate: *dropRate, DeclineRate: *declineRate, Latency: *latency, Seed: *seed}
	if *verbose {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	sim, err := paysim.New(cfg)
	if err != nil {
		// Only flag values can make the config invalid.
		return cli.Usagef("%v", err)
	}

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", *addr, err)
	}
	srv := &http.Server{Handler: sim, ReadHeaderTimeout: 10 * time.Second}
	if err := sim.Start(ctx); err != nil {
		ln.Close()
		return err
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
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
	err = srv.Shutdown(sctx)
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
