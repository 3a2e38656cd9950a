package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/idemkit/idem/examples/billing/chaos"
	"github.com/idemkit/idem/internal/cli"
)

func init() {
	register(&cli.Command{Name: "chaos", Summary: "crash billing at random under load and audit every charge", Run: runChaos})
}

const chaosUsage = `Usage: billing chaos [flags]

Runs everything as child processes: a devkafka broker with a data directory
(or KAFKA_BROKERS; billing's Kafka client is KAFKA_CLIENT=franz|kafkago), or
with --broker nats a nats-server -js with a store directory, paysim with faults, and --instances billing servers on
DATABASE_URL (else the local server), each run in a fresh schema. A load
driver creates and confirms orders and creates payments, retrying every POST
with the same Idempotency-Key on timeouts, 5xx and 409 in-progress, and
sometimes sending a duplicate at once. At seeded random moments billing
instances are SIGKILLed or SIGTERMed and restarted, the broker restarted,
and with --pg-restarts, --net-cuts and --produce-fail-rate the database
crashed, the network cut and produce requests partly failed:

  --produce-fail-rate P  devkafka answers that share of produce partitions
                         with a non-retriable error (INVALID_RECORD)
  --pg-restarts N        billing runs on a throwaway PostgreSQL cluster of its
                         own, crashed (pg_ctl stop -m immediate) and restarted
                         N times; paysim stays on DATABASE_URL
  --net-cuts N           billing reaches PostgreSQL and Kafka through TCP
                         fault proxies that reset every open connection N
                         times, every other one after a stall

  --outbox-mode MODE     billing's OUTBOX_MODE: table (default) or wal (events
                         in the WAL, relayed from a replication slot; needs
                         wal_level=logical on billing's database, which the
                         cluster of --pg-restarts has). The Kafka audit then
                         checks the topics against the events decoded from
                         an audit slot of the harness, in commit order

  --data-layer LAYER     billing's BILLING_DATA_LAYER: pgx (default) or sql
                         (its repositories, outbox, inbox and idempotency
                         calls through database/sql on pgx's stdlib driver;
                         the relay, purges and status poller stay on pgx):
                         the same audit proves the database/sql seams

  --decline-rate P       paysim declines that share of charge keys for good
                         (402, recorded): the only FAILED the audit accepts
  --failpoints           one instance at a time runs with IDEM_FAILPOINTS
                         arming a kill at every crash window of
                         internal/failpoint not yet hit --failpoint-hits
                         times; the report counts hits per window and names
                         the windows it missed

Then it waits until every order and payment is final, the outbox is
drained, both consumer groups have no lag and no idempotency claim is live,
watches the ledger for longer than the longest redelivery timer, and audits
paysim's ledger (every confirmed order and accepted payment charged exactly
once, with its order, customer, amount, principal and command key; a FAILED
only with paysim's decline for it; no charge or decline without one; every
replayed answer identical to the first in status, allow-listed headers and
bytes) and the broker (every outbox event on its topic at least once, the first
deliveries of each aggregate in sequence order). Exit status 1 on any
violation.

--profile short (the default sizes) or long (over 10,000 POSTs, failpoints
hit three times each, 30 kills; see docs/proof.md for its wall time) sets
the sizes; flags given override it.

--report FILE.html also writes the report as one self-contained page: the
verdict and every violation linked to its moment on a timeline of the run
(POSTs, latency, failed answers, outbox backlog, consumer lag, charges, a mark
at every fault), the linearizability verdict of the model-based audit (with
porcupine's view of the smallest failing key history beside it) and the
configuration that repeats the run.

--unsafe=LAYER switches one protection off to prove the audit can fail:
key (the driver sends a fresh key on every retry), inbox, fingerprint,
lease or publish (the relay loses an event; passed to billing as
BILLING_UNSAFE). An --unsafe run whose audit finds nothing exits 3
(inconclusive), not 0.

The idem binary (devkafka, paysim) is --idem-bin, else IDEM_BIN, else idem
beside this binary, else built with 'go build' when run inside the idem
module, else idem on PATH.`

// harnessFlags are the flags billing chaos and billing demo share.
type harnessFlags struct {
	cfg     chaos.Config
	jsonOut bool
	idemBin string
	keep    bool
	profile string
	report  string
	// matrix runs every combination of broker, outbox and store
	// (matrixRows narrows it).
	matrix     bool
	matrixRows string
}

// addHarnessFlags defines the harness's flags on fs with def's values as
// defaults (a zero field takes the chaos package's default).
func addHarnessFlags(fs *flag.FlagSet, def chaos.Config) *harnessFlags {
	or := func(v, d int) int {
		if v == 0 {
			return d
		}
		return v
	}
	ord := func(v, d time.Duration) time.Duration {
		if v == 0 {
			return d
		}
		return v
	}
	or2 := func(v, d string) string {
		if v == "" {
			return d
		}
		return v
	}
	h := &harnessFlags{}
	fs.StringVar(&h.profile, "profile", "", "start from a named size: "+chaos.ProfileNames+" (flags given override it)")
	fs.IntVar(&h.cfg.Orders, "orders", def.Orders, "orders to create and confirm")
	fs.IntVar(&h.cfg.Payments, "payments", def.Payments, "payments to create (each on its own order)")
	fs.IntVar(&h.cfg.Instances, "instances", def.Instances, "billing serve instances")
	fs.IntVar(&h.cfg.Kills, "kills", def.Kills, "billing instances to SIGKILL (and restart)")
	fs.IntVar(&h.cfg.Terms, "terms", def.Terms, "billing instances to SIGTERM (and restart)")
	fs.IntVar(&h.cfg.BrokerRestarts, "broker-restarts", def.BrokerRestarts, "broker restarts (needs the devkafka child: KAFKA_BROKERS empty)")
	fs.Float64Var(&h.cfg.DropRate, "drop-rate", def.DropRate, "paysim: share of charges whose response is dropped after charging")
	fs.Float64Var(&h.cfg.FailRate, "fail-rate", def.FailRate, "paysim: share of charges that fail before charging")
	fs.Float64Var(&h.cfg.DeclineRate, "decline-rate", def.DeclineRate, "paysim: share of charge keys declined for good (402 CARD_DECLINED, recorded)")
	fs.Float64Var(&h.cfg.ProduceFailRate, "produce-fail-rate", def.ProduceFailRate, "devkafka: share of produce partitions failed with a non-retriable error (needs the embedded broker)")
	fs.StringVar(&h.cfg.Broker, "broker", or2(def.Broker, chaos.BrokerKafka), "kafka (a devkafka child, or KAFKA_BROKERS; KAFKA_CLIENT picks billing's client) or nats (a nats-server -js child)")
	fs.IntVar(&h.cfg.PGRestarts, "pg-restarts", def.PGRestarts, "crash and restart billing's own PostgreSQL cluster this many times")
	fs.IntVar(&h.cfg.NetCuts, "net-cuts", def.NetCuts, "reset every connection from billing to PostgreSQL and Kafka this many times (needs the embedded broker)")
	fs.StringVar(&h.cfg.OutboxMode, "outbox-mode", chaos.OutboxTable, "billing's OUTBOX_MODE: table or wal")
	fs.StringVar(&h.cfg.DataLayer, "data-layer", chaos.DataLayerPGX, "billing's BILLING_DATA_LAYER: pgx or sql (database/sql on pgx's stdlib driver)")
	fs.BoolVar(&h.cfg.Failpoints, "failpoints", def.Failpoints, "arm the crash windows of internal/failpoint (kill) in one instance until each is hit")
	fs.IntVar(&h.cfg.FailpointHits, "failpoint-hits", or(def.FailpointHits, chaos.FailpointHitsDefault), "with --failpoints: hits per window before it is disarmed")
	fs.Func("failpoint-windows", "with --failpoints: comma-separated windows to arm (default: every one)", func(v string) error {
		h.cfg.FailpointWindows = nil
		for _, w := range strings.Split(v, ",") {
			if w = strings.TrimSpace(w); w != "" {
				h.cfg.FailpointWindows = append(h.cfg.FailpointWindows, w)
			}
		}
		return nil
	})
	fs.Int64Var(&h.cfg.Seed, "seed", 0, "seed of every random choice (0: from the clock; the report prints it)")
	fs.StringVar(&h.cfg.Unsafe, "unsafe", "", "switch one protection off: key, inbox, fingerprint, lease or publish")
	fs.IntVar(&h.cfg.Concurrency, "concurrency", or(def.Concurrency, chaos.ConcurrencyDefault), "driver workers")
	fs.DurationVar(&h.cfg.LoadDuration, "duration", ord(def.LoadDuration, chaos.LoadDurationDefault), "spread the start of the orders and payments over this time")
	fs.DurationVar(&h.cfg.Quiescence, "quiescence", ord(def.Quiescence, chaos.QuiescenceDefault), "how long to wait, after the load, for every order and payment to be final")
	fs.BoolVar(&h.jsonOut, "json", false, "print the report as one JSON object")
	fs.BoolVar(&h.matrix, "matrix", false, "run once per combination of broker (kafka franz-go, kafka kafka-go, nats), outbox (table, wal) and idempotency store (postgres, redis) and print one table")
	fs.StringVar(&h.matrixRows, "matrix-rows", "", "with --matrix: only these comma-separated rows (as the table names them: franz/table/postgres, nats/wal/redis, ...)")
	fs.StringVar(&h.report, "report", "", "also write the report as one self-contained HTML page to this file (verdict, violations, timeline, configuration)")
	fs.StringVar(&h.idemBin, "idem-bin", os.Getenv("IDEM_BIN"), "idem binary (default: beside billing, else go build, else PATH)")
	fs.BoolVar(&h.keep, "keep", false, "keep the work directory (logs, broker data) and the database schema")
	return h
}

// parseHarness parses args over def, then, when they name a --profile,
// again over that profile's values, so that the flags given override the
// profile and the profile the defaults.
func parseHarness(name, usage string, def chaos.Config, args []string) (*harnessFlags, error) {
	fs := cli.FlagSet(name, usage)
	h := addHarnessFlags(fs, def)
	if err := cli.Parse(fs, args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, cli.Usagef("unexpected argument %q", fs.Arg(0))
	}
	if h.profile == "" {
		return h, nil
	}
	p, ok := chaos.Profiles[h.profile]
	if !ok {
		return nil, cli.Usagef("--profile %q: want %s", h.profile, chaos.ProfileNames)
	}
	fs = cli.FlagSet(name, usage)
	h = addHarnessFlags(fs, p)
	if err := cli.Parse(fs, args); err != nil {
		return nil, err
	}
	return h, nil
}

func runChaos(ctx context.Context, args []string) error {
	h, err := parseHarness("chaos", chaosUsage, chaos.Profiles["short"], args)
	if err != nil {
		return err
	}
	return runHarness(ctx, h, false)
}

// runHarness resolves the binaries, the database and the broker, runs the
// chaos and prints the report. pgtempFallback allows a throwaway cluster
// when neither DATABASE_URL nor the local server is there (billing demo).
func runHarness(ctx context.Context, h *harnessFlags, pgtempFallback bool) error {
	if h.matrix {
		return runMatrix(ctx, h, pgtempFallback)
	}
	_, err := runOne(ctx, h, pgtempFallback)
	return err
}

// runOne is one run of the harness; it returns the report (nil when the
// run did not start) and the error billing chaos exits with.
func runOne(ctx context.Context, h *harnessFlags, pgtempFallback bool) (*chaos.Report, error) {
	logf := func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, "%s %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, a...))
	}
	cfg := h.cfg
	if cfg.Orders < 0 || cfg.Payments < 0 || cfg.Instances < 1 || cfg.Kills < 0 || cfg.Terms < 0 || cfg.BrokerRestarts < 0 || cfg.PGRestarts < 0 || cfg.NetCuts < 0 {
		return nil, cli.Usagef("--orders, --payments, --kills, --terms, --broker-restarts, --pg-restarts and --net-cuts must not be negative, --instances at least 1")
	}
	if cfg.ProduceFailRate < 0 || cfg.ProduceFailRate >= 1 {
		return nil, cli.Usagef("--produce-fail-rate must be in [0, 1)")
	}
	if cfg.Quiescence <= 0 || cfg.LoadDuration <= 0 {
		return nil, cli.Usagef("--quiescence and --duration must be positive")
	}
	if cfg.Orders+cfg.Payments == 0 {
		return nil, cli.Usagef("--orders and --payments are both 0: nothing to do")
	}
	if cfg.OutboxMode != chaos.OutboxTable && cfg.OutboxMode != chaos.OutboxWAL {
		return nil, cli.Usagef("--outbox-mode %q: want table or wal", cfg.OutboxMode)
	}
	if cfg.DataLayer != chaos.DataLayerPGX && cfg.DataLayer != chaos.DataLayerSQL {
		return nil, cli.Usagef("--data-layer %q: want pgx or sql", cfg.DataLayer)
	}
	if cfg.DropRate < 0 || cfg.DropRate >= 1 || cfg.FailRate < 0 || cfg.FailRate >= 1 || cfg.DeclineRate < 0 || cfg.DeclineRate >= 1 {
		return nil, cli.Usagef("--drop-rate, --fail-rate and --decline-rate must be in [0, 1)")
	}
	if cfg.FailpointHits < 1 {
		return nil, cli.Usagef("--failpoint-hits must be at least 1")
	}
	switch cfg.Unsafe {
	case "", chaos.UnsafeKey, chaos.UnsafeInbox, chaos.UnsafeFingerprint, chaos.UnsafeLease, chaos.UnsafePublish:
	default:
		return nil, cli.Usagef("--unsafe %q: want key, inbox, fingerprint, lease or publish", cfg.Unsafe)
	}
	if (cfg.Kills > 0 || cfg.Terms > 0) && cfg.Instances < 2 {
		return nil, cli.Usagef("--kills and --terms need --instances 2 or more (one instance always serves)")
	}
	switch cfg.Broker {
	case chaos.BrokerKafka:
		cfg.KafkaBrokers = os.Getenv("KAFKA_BROKERS")
	case chaos.BrokerNATS:
		if cfg.NetCuts > 0 || cfg.ProduceFailRate > 0 {
			return nil, cli.Usagef("--net-cuts and --produce-fail-rate are Kafka's: not with --broker nats")
		}
	default:
		return nil, cli.Usagef("--broker %q: want kafka or nats", cfg.Broker)
	}
	if cfg.KafkaBrokers != "" && cfg.BrokerRestarts > 0 {
		if !pgtempFallback {
			return nil, cli.Usagef("--broker-restarts needs the embedded broker: unset KAFKA_BROKERS or pass --broker-restarts 0")
		}
		logf("KAFKA_BROKERS is set: no broker restarts")
		cfg.BrokerRestarts = 0
	}
	if cfg.KafkaBrokers != "" && (cfg.NetCuts > 0 || cfg.ProduceFailRate > 0) {
		if !pgtempFallback {
			return nil, cli.Usagef("--net-cuts and --produce-fail-rate need the embedded broker: unset KAFKA_BROKERS")
		}
		logf("KAFKA_BROKERS is set: no network cuts, no produce failures")
		cfg.NetCuts, cfg.ProduceFailRate = 0, 0
	}

	work, err := os.MkdirTemp("", "billing-chaos-")
	if err != nil {
		return nil, err
	}
	passed := false
	defer func() {
		if passed && !h.keep {
			_ = os.RemoveAll(work)
		}
	}()
	cfg.WorkDir = work

	if cfg.IdemBin, err = chaos.LocateIdem(ctx, h.idemBin, work, logf); err != nil {
		return nil, err
	}
	if cfg.BillingBin, err = os.Executable(); err != nil {
		return nil, fmt.Errorf("locate the billing binary: %w", err)
	}

	base, stopDB, err := chaos.ResolveDatabase(ctx, os.Getenv("DATABASE_URL"), cli.DefaultDatabaseURL, pgtempFallback, logf)
	if errors.Is(err, chaos.ErrNoDatabase) {
		return nil, fmt.Errorf("no DATABASE_URL and no PostgreSQL on 127.0.0.1:5432 (billing demo starts a throwaway one)")
	}
	if err != nil {
		return nil, err
	}
	defer stopDB()
	dbURL, drop, err := chaos.FreshSchema(ctx, base)
	if err != nil {
		return nil, err
	}
	defer func() {
		if !h.keep {
			_ = drop(context.Background())
		}
	}()
	cfg.DatabaseURL = dbURL
	logf("database %s", cli.Redact(dbURL))

	cfg.Progress = os.Stderr
	if st, err := os.Stderr.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
		cfg.ProgressTTY = true
	}
	rep, err := chaos.Run(ctx, &cfg)
	if errors.Is(err, chaos.ErrConfig) {
		return rep, cli.Usagef("%v", err)
	}
	if rep != nil {
		if h.jsonOut {
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			_ = enc.Encode(rep)
		} else {
			rep.WriteText(os.Stdout)
		}
	}
	if rep != nil && h.report != "" {
		if werr := writeHTMLReport(rep, h.report); werr != nil {
			logf("report: %v", werr)
		} else if h.jsonOut {
			logf("report: %s", h.report)
		} else {
			fmt.Printf("report: %s\n", h.report)
		}
	}
	if err != nil {
		return rep, fmt.Errorf("run failed: %v (logs in %s)", err, work)
	}
	if !rep.Pass {
		return rep, fmt.Errorf("%d violations (logs in %s)", len(rep.Violations), work)
	}
	if cfg.Unsafe != "" {
		// A protection was off and nothing broke: the run did not show
		// the audit can catch it, which is no pass. The logs are kept.
		return rep, &cli.ExitError{Code: exitInconclusive, Err: fmt.Errorf("inconclusive: with --unsafe=%s the audit found no violation; this run did not exercise that protection (logs in %s)", cfg.Unsafe, work)}
	}
	passed = true
	return rep, nil
}

// exitInconclusive is billing chaos's exit status for an --unsafe run
// whose audit found nothing.
const exitInconclusive = 3

// writeHTMLReport writes rep's HTML page to path and, when the
// linearizability check failed, porcupine's visualization of the smallest
// failing key history beside it, linked from the page.
func writeHTMLReport(rep *chaos.Report, path string) error {
	lin := ""
	if l := rep.Linearizability; l != nil && len(l.HTML) > 0 {
		lin = chaos.LinearizabilityFile(path)
		if err := os.WriteFile(filepath.Join(filepath.Dir(path), lin), l.HTML, 0o644); err != nil {
			return err
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := rep.WriteHTML(f, lin); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
