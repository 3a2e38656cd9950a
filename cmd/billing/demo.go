package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/idemkit/idem/examples/billing/chaos"
	"github.com/idemkit/idem/internal/cli"
)

func init() {
	register(&cli.Command{Name: "demo", Summary: "one-minute proof: chaos with friendly defaults, no setup needed", Run: runDemo})
}

const demoUsage = `Usage: billing demo [flags]

The proof in about a minute, on a fresh machine: billing chaos with friendly
defaults (60 orders, 30 payments, 3 billing instances, 2 SIGKILLs, 1 SIGTERM,
1 broker restart, paysim dropping 20% of answers after charging, failing
10% before and declining 5% of keys) and embedded infrastructure:

  PostgreSQL  DATABASE_URL, else the local server on 127.0.0.1:5432, else a
              throwaway cluster started from the local PostgreSQL binaries
              (as the postgres user when run as root)
  Kafka       KAFKA_BROKERS, else an idem devkafka child with a data directory
  idem        --idem-bin, IDEM_BIN, idem beside billing, else 'go build'

  go run ./cmd/billing demo

It ends with PASS (exit 0) or FAIL and the violations (exit 1), and the path
of its HTML report (--report, by default billing-demo-SEED.html in the
temporary directory). Every flag of billing chaos works here too.`

func runDemo(ctx context.Context, args []string) error {
	h, err := parseHarness("demo", demoUsage, chaos.Config{
		Orders: 60, Payments: 30, Instances: 3, Kills: 2, Terms: 1, BrokerRestarts: 1,
		DropRate: 0.2, FailRate: 0.1, DeclineRate: 0.05,
	}, args)
	if err != nil {
		return err
	}
	if h.report == "" {
		if h.cfg.Seed == 0 {
			// The seed the run would take from the clock, chosen here so
			// that the file is named after it.
			h.cfg.Seed = time.Now().UnixNano() & (1<<48 - 1)
		}
		h.report = filepath.Join(os.TempDir(), fmt.Sprintf("billing-demo-%d.html", h.cfg.Seed))
	}
	return runHarness(ctx, h, true)
}
