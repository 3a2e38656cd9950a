// Command waltest runs one WAL outbox relay (package outbox/wal) for the
// process tests of that package: SIGKILL of the active relay while a
// standby waits. It reads the database URL from WALTEST_DB (it may carry a
// password: never on the command line) and prints one line per slot
// event on stdout: "ACQUIRED", "BUSY". SIGTERM is a soft stop; exit status
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
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/wal"
)

func main() {
	brokers := flag.String("brokers", "", "Kafka brokers")
	slot := flag.String("slot", "", "slot")
	pubName := flag.String("publication", "", "publication")
	prefix := flag.String("prefix", "", "message prefix")
	batchSize := flag.Int("batch-size", 100, "batch size")
	delay := flag.Duration("publish-delay", 0, "wait before each publish (a slow broker): events read and not yet delivered pile up")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	cl, err := kgo.NewClient(append(kafka.ProducerOpts(), kgo.SeedBrokers(strings.Split(*brokers, ",")...))...)
	if err != nil {
		fail(err)
	}
	defer cl.Close()
	pub, err := kafka.NewPublisher(cl, nil)
	if err != nil {
		fail(err)
	}
	var p outbox.Publisher = pub
	if *delay > 0 {
		p = slow{pub, *delay}
	}
	r, err := wal.NewRelay(os.Getenv("WALTEST_DB"), p, &wal.Config{
		Slot: *slot, Publication: *pubName, Prefix: *prefix, BatchSize: *batchSize,
		StatusInterval: 50 * time.Millisecond, AcquireInterval: 50 * time.Millisecond,
		BackoffMin: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond, Logger: log,
		Hook: func(ctx context.Context, e outbox.RelayEvent) context.Context {
			switch e.Kind {
			case outbox.RelaySlotAcquired:
				fmt.Println("ACQUIRED")
			case outbox.RelaySlotBusy:
				fmt.Println("BUSY")
			}
			return ctx
		},
	})
	if err != nil {
		fail(err)
	}
	if err := r.Start(ctx); err != nil {
		fail(err)
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := r.Stop(sctx); err != nil {
		fail(err)
	}
}

type slow struct {
	next  outbox.Publisher
	delay time.Duration
}

func (s slow) Publish(ctx context.Context, events []outbox.Event) error {
	t := time.NewTimer(s.delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.next.Publish(ctx, events)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "waltest:", err)
	os.Exit(1)
}
