// Command relaytest runs one outbox relay against a database and a Kafka
// broker, for the process-level tests in package kafka (SIGTERM and
// SIGKILL mid-batch, failpoint kills through IDEM_FAILPOINTS). It is not
// part of the toolkit's CLI.
//
// With -hold, the publisher announces each batch on stdout ("IN-FLIGHT n")
// and then waits before producing: "term" waits until the process has
// received SIGTERM (so the signal lands mid-batch, deterministically),
// "forever" waits until the batch context ends (for SIGKILL). With
// -hold-published N, the Nth publish call produces its events, announces
// them ("PUBLISHED-HELD n") and then waits until the batch context ends:
// a SIGKILL then lands between the produce and the mark, mid-batch. Exit
// status 0 means Stop returned cleanly.
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
	// holdPublished, when > 0, is the publish call that is held after it
	// produced.
	holdPublished int
	calls         int
}

func (p *holdPublisher) Publish(ctx context.Context, events []outbox.Event) error {
	if p.holdPublished > 0 {
		p.calls++
		if p.calls == p.holdPublished {
			if err := p.next.Publish(ctx, events); err != nil {
				return err
			}
			fmt.Printf("PUBLISHED-HELD %d\n", len(events))
			<-ctx.Done()
			return ctx.Err()
		}
	}
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
	holdPublished := flag.Int("hold-published", 0, "hold the Nth publish call after it produced (0: none)")
	owner := flag.String("owner", "", "relay owner name")
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
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)), Owner: *owner,
	}
	if *mode == "two-phase" {
		cfg.Mode = outbox.TwoPhase
	}
	if err := run(ctx, *dbURL, *brokers, &holdPublisher{hold: *hold, term: termed, holdPublished: *holdPublished}, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "relaytest:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dbURL, brokers string, hp *holdPublisher, cfg outbox.RelayConfig) error {
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
	hp.next = pub
	relay, err := outbox.NewRelay(pool, hp, &cfg)
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
