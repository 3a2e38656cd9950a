// Command consumertest runs a kafka.Consumer for the crash tests: a real
// process that the test SIGKILLs at an exact point, then restarts.
//
// Environment: DATABASE_URL, KAFKA_BROKERS, CONS_GROUP, CONS_TOPIC,
// CONS_BATCH=1 for batch mode, CONS_KILL_AFTER=N to SIGKILL itself right
// after the database transaction that handled its N-th record committed and
// before any offset commit. The handler inserts one cons_effect row per
// event (no unique constraint, so a second effect would show).
//
// On SIGTERM it stops gracefully and prints "handled=H duplicates=D".
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/kafka"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "consumertest:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	defer pool.Close()
	killAfter, _ := strconv.Atoi(os.Getenv("CONS_KILL_AFTER"))
	var handled, duplicates atomic.Int64
	c, err := kafka.NewConsumer(pool, func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		_, err := tx.Exec(ctx, `INSERT INTO cons_effect (event_id, member) VALUES ($1, 'proc')`, kafka.EventIDFromContext(ctx))
		return err
	}, &kafka.ConsumerConfig{
		Brokers:       []string{os.Getenv("KAFKA_BROKERS")},
		Group:         os.Getenv("CONS_GROUP"),
		Topics:        []string{os.Getenv("CONS_TOPIC")},
		Batch:         os.Getenv("CONS_BATCH") == "1",
		CommitTimeout: 5 * time.Second,
		// A SIGKILLed member stays in the group until its session times
		// out; a short session lets the restarted process in sooner.
		ClientOpts: []kgo.Opt{kgo.SessionTimeout(6 * time.Second), kgo.HeartbeatInterval(500 * time.Millisecond)},
		OnProcessed: func(_ context.Context, _ *kgo.Record, o kafka.Outcome) {
			switch o {
			case kafka.OutcomeHandled:
				// The transaction with this record's effect and its
				// processed_event row has committed; its offset has not
				// (offsets are committed after the whole poll). Dying
				// here is the window under test.
				if n := handled.Add(1); killAfter > 0 && n == int64(killAfter) {
					_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
					select {} // the signal is on its way
				}
			case kafka.OutcomeDuplicate:
				duplicates.Add(1)
			}
		},
	})
	if err != nil {
		return err
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	if err := c.Start(ctx); err != nil {
		return err
	}
	fmt.Println("started")
	<-sig
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := c.Stop(sctx); err != nil {
		return err
	}
	fmt.Printf("handled=%d duplicates=%d\n", handled.Load(), duplicates.Load())
	return nil
}
