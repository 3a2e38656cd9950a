// Command relaytest runs one outbox relay against a database and a Kafka
// broker, for the process-level tests in package kafka (SIGTERM and
// SIGKILL mid-batch, failpoint kills through IDEM_FAILPOINTS). It is not
// part of the toolkit's CLI.
//
// With -hold, the publisher announces each batch on stdout ("IN-FLIGHT n")
// and then waits before producing: "term" waits until the process has
// received SIGTERM (so the signal lands mid-batch, deterministically),
// "forever" waits until the batch context ends (for SIGKILL). Exit status
// 0 means Stop returned cleanly.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/outbox"
)

type holdPublisher struct {
	next outbox.Publisher
	hold string
	term chan struct{}
	once sync.Once
}

func (p *holdPublisher) Publish(ctx context.Context, events []outbox.Event) error {
	if p.hold != "" {
		first := false
		p.once.Do(func() { first = true })
		if first { // only the first batch is held
			fmt.Printf("IN-FLIGHT %d\n", len(events))
			switch p.hold {
			case "term":
				select {
				case <-p.term:
				case <-ctx.Done():
					return ctx.Err()
				}
			case "forever":
				<-ctx.Done()
				return ctx.Err()
			}
		}
	}
	return p.next.Publish(ctx, events)
}

func main() {
	dbURL := flag.String("db", "", "database URL")
	brokers := flag.String("brokers", "", "Kafka brokers")
	mode := flag.String("mode", "at-least-once", "at-least-once|two-phase")
	hold := flag.String("hold", "", "term|forever: hold the first batch")
	leaseTTL := flag.Duration("lease-ttl", 3*time.Second, "lease TTL")
	batchTimeout := flag.Duration("batch-timeout", time.Second, "batch timeout")
	batchSize := flag.Int("batch-size", 100, "batch size")
	retention := flag.Duration("retention", -1, "retention of PUBLISHED rows (negative: no purge)")
	purgeBatch := flag.Int("purge-batch-size", 1000, "rows per purge statement")
	flag.Parse()

	// The hold waits for SIGTERM on its own channel; the relay's context
	// is cancelled by the same signal.
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	termed := make(chan struct{})
	go func() { <-term; close(termed) }()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	cfg := outbox.RelayConfig{
		LeaseTTL: *leaseTTL, BatchTimeout: *batchTimeout, BatchSize: *batchSize,
		ReapInterval: 100 * time.Millisecond, PollInterval: 100 * time.Millisecond,
		Retention: *retention, PurgeInterval: 100 * time.Millisecond, PurgeBatchSize: *purgeBatch,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)),
	}
	if *mode == "two-phase" {
		cfg.Mode = outbox.TwoPhase
	}
	if err := run(ctx, *dbURL, *brokers, *hold, cfg, termed); err != nil {
		fmt.Fprintln(os.Stderr, "relaytest:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dbURL, brokers, hold string, cfg outbox.RelayConfig, termed chan struct{}) error {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	cl, err := kgo.NewClient(append(kafka.ProducerOpts(), kgo.SeedBrokers(strings.Split(brokers, ",")...))...)
	if err != nil {
		return err
	}
	defer cl.Close()
	pub, err := kafka.NewPublisher(cl, nil)
	if err != nil {
		return err
	}
	relay, err := outbox.NewRelay(pool, &holdPublisher{next: pub, hold: hold, term: termed}, &cfg)
	if err != nil {
		return err
	}
	if err := relay.Start(ctx); err != nil {
		return err
	}
	fmt.Println("STARTED")
	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := relay.Stop(stopCtx); err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	fmt.Println("STOPPED")
	return nil
}
