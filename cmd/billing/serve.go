package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"

	"github.com/idemkit/idem/cmd/internal/otelenv"
	"github.com/idemkit/idem/examples/billing/adapters/in/httpapi"
	"github.com/idemkit/idem/examples/billing/app"
	"github.com/idemkit/idem/internal/cli"
	"github.com/idemkit/idem/internal/httpserver"
)

func init() {
	register(&cli.Command{
		Name:    "serve",
		Summary: "run the billing service (HTTP API, outbox relay, consumer, charge worker)",
		Run:     serve,
	})
}

const serveUsage = `Usage: billing serve [--roles http,relay,consumer,charger] [--partitions N] [--drain-delay D]

Runs the reference billing service (docs/architecture.md). Migrations are
applied and missing topics created on start. The bound HTTP address is printed
as "billing: listening on HOST:PORT". SIGTERM or SIGINT stops it in order
(readiness off, HTTP, consumer, relay, charge worker, Kafka clients, pool)
within SHUTDOWN_TIMEOUT; a second signal stops it at once. A signal before it
is ready (while it migrates, say) stops it too: the migration in hand rolls
back whole.

Exit status: 0 after a clean stop, also one before ready; 1 when a stage was
cut off at its budget (stderr names it: 'lifecycle: stage "NAME" cut off at
its budget'), after a second signal, or on any failure; 2 for a bad flag or
environment variable.

Environment:
  DATABASE_URL        PostgreSQL (default: the local server)
  KAFKA_BROKERS       comma-separated seed brokers (required with BROKER=kafka)
  PAYMENT_URL         payment provider base URL, e.g. http://127.0.0.1:8090 (charger role)
  HTTP_ADDR           listen address (default :8080)
  SHUTDOWN_TIMEOUT    bound of the whole stop (default 25s)
  BILLING_API_TOKENS  token:principal[,token:principal...]; one secret may not
                      appear twice. Unset: the public demo tokens (` + httpapi.DefaultTokens + `),
                      accepted on a loopback HTTP_ADDR only, with a warning; on
                      any other address every secret needs 16 bytes or more (MinTokenLength)
  ADMIN_ADDR          admin listener for GET /metrics, /healthz, /readyz (default:
                      none, /metrics is on HTTP_ADDR); one that is not loopback
                      needs BILLING_METRICS_TOKEN
  BILLING_METRICS_TOKEN  bearer token GET /metrics requires (default: none:
                      anonymous on a loopback listener, refused elsewhere)
  METRICS_REFRESH_INTERVAL  how often the outbox and consumer-lag gauges are
                      recomputed in the background (default 5s)
  HTTP_READ_HEADER_TIMEOUT  bound on reading a request's headers (default 5s)
  HTTP_READ_TIMEOUT   bound on reading a whole request, body included (default 15s)
  HTTP_WRITE_TIMEOUT  bound from the end of the headers to the end of the
                      response; above HTTP_READ_TIMEOUT (default 60s)
  HTTP_IDLE_TIMEOUT   an idle keep-alive connection is closed after it (default 60s)
  HTTP_MAX_HEADER_BYTES  bound on the request line and headers (default 65536)
  HTTP_MAX_CONNS      open connections per listener; beyond it a connection is
                      answered 503 at once and closed (default 512); near
                      full, the longest idle keep-alive is closed to make room
  HTTP_MAX_CONNS_PER_CLIENT  open connections of one client address (default
                      half of HTTP_MAX_CONNS; behind a load balancer, raise
                      it to HTTP_MAX_CONNS)
  HTTP_MAX_REQUESTS_PER_CONN  a keep-alive connection is closed after that
                      many requests (default 1000)
  HTTP_MAX_CONN_AGE   a connection is closed after its first request past
                      that age (default 10m)
  KAFKA_SESSION_TIMEOUT     consumer group session timeout: how long a killed
                            instance keeps its partitions (default 10s; the
                            broker allows 6s..30m by default)
  KAFKA_HEARTBEAT_INTERVAL  consumer group heartbeat interval, below the
                            session timeout (default 1s)
  KAFKA_REBALANCE_TIMEOUT   how long a member may take to rejoin a rebalance
                            (default 30s)
  OUTBOX_LEASE_TTL          how long the outbox rows of a relay killed mid-batch
                            wait before the reaper returns them (default 60s;
                            must exceed twice the relay's batch timeout, which
                            is min(10s, about 15% of SHUTDOWN_TIMEOUT))
  OUTBOX_MODE               table (the outbox table, relayed by SKIP LOCKED
                            batches) or wal (events written to the WAL with
                            pg_logical_emit_message, relayed from a logical
                            replication slot; needs wal_level=logical)
                            (default table)
  OUTBOX_SLOT               the replication slot (and publication) of
                            OUTBOX_MODE=wal, created if missing; one relay
                            instance reads it, the others stand by
                            (default billing_outbox)
  BILLING_DATA_LAYER        pgx (default) or sql: the transactions of the
                            repositories, outbox events, inbox marks,
                            consumers and idempotency records are pgx.Tx on
                            the pool, or *sql.Tx of database/sql on pgx's
                            stdlib driver (a second pool, opened from
                            DATABASE_URL); the relay, purges and status
                            poller stay on pgx either way
  BILLING_LOG_LEVEL         info (default), debug, warn or error; debug adds
                            every consumer event, the kafkago driver's offset
                            commits and kafka-go's reader logs
  IDEMPOTENCY_STORE         where the HTTP API keeps its idempotency records:
                            postgres (default: DATABASE_URL, transactional mode),
                            redis (REDIS_URL, default redis://127.0.0.1:6379/0)
                            or a redis:// URL (two-step mode; keys under
                            {billing}: unless ?prefix= says otherwise; what
                            Redis must keep: the redisstore package doc)
  BILLING_UNSAFE            inbox, fingerprint, lease or publish: switch that protection
                            off so that billing chaos can prove its audit
                            catches the double charges (default: none; never
                            in production; a loud warning is logged)
  OTEL_TRACES_EXPORTER      otlp, console (one JSON span a line on stdout) or
                            none (default): the spans of every component, one
                            trace from a request's traceparent through the
                            outbox and Kafka to the provider call; spans still
                            buffered at the stop are flushed for at most 2s
                            after it
  OTEL_METRICS_EXPORTER     otlp, console, prometheus or none (default): idem's
                            metrics as OpenTelemetry instruments (/metrics serves
                            them either way); the exporters read the other
                            standard OTEL_* variables (OTEL_EXPORTER_OTLP_ENDPOINT,
                            OTEL_SERVICE_NAME, ...)` + brokerUsage

func serve(ctx context.Context, args []string) (err error) {
	fs := cli.FlagSet("serve", serveUsage)
	roles := fs.String("roles", app.AllRoles, "comma-separated roles to run: http, relay, consumer, charger")
	partitions := fs.Int("partitions", app.PartitionsDefault, "partitions of the topics created when missing")
	drain := fs.Duration("drain-delay", 0, "how long /readyz answers 503 before the listener closes (0: 4% of SHUTDOWN_TIMEOUT)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.Usagef("unexpected argument %q", fs.Arg(0))
	}
	r, err := app.ParseRoles(*roles)
	if err != nil {
		return cli.Usagef("%v", err)
	}
	if *partitions < 1 || *partitions > 1000 {
		return cli.Usagef("--partitions %d must be in 1..1000", *partitions)
	}
	timeout, err := cli.DurationEnv("SHUTDOWN_TIMEOUT", app.ShutdownTimeoutDefault)
	if err != nil {
		return err
	}
	if *drain < 0 || *drain >= timeout/2 {
		return cli.Usagef("--drain-delay %s must be in [0, SHUTDOWN_TIMEOUT/2)", *drain)
	}
	session, err := cli.DurationEnv("KAFKA_SESSION_TIMEOUT", app.SessionTimeoutDefault)
	if err != nil {
		return err
	}
	heartbeat, err := cli.DurationEnv("KAFKA_HEARTBEAT_INTERVAL", app.HeartbeatIntervalDefault)
	if err != nil {
		return err
	}
	rebalance, err := cli.DurationEnv("KAFKA_REBALANCE_TIMEOUT", app.RebalanceTimeoutDefault)
	if err != nil {
		return err
	}
	leaseTTL, err := cli.DurationEnv("OUTBOX_LEASE_TTL", app.OutboxLeaseTTLDefault)
	if err != nil {
		return err
	}
	if heartbeat >= session {
		return cli.Usagef("KAFKA_HEARTBEAT_INTERVAL %s must be below KAFKA_SESSION_TIMEOUT %s", heartbeat, session)
	}
	outboxMode := cli.Env("OUTBOX_MODE", app.OutboxTable)
	if outboxMode != app.OutboxTable && outboxMode != app.OutboxWAL {
		return cli.Usagef("OUTBOX_MODE %q: want table or wal", outboxMode)
	}
	outboxSlot := cli.Env("OUTBOX_SLOT", app.OutboxSlotDefault)
	if outboxSlot == "" || len(outboxSlot) > 63 || strings.Trim(outboxSlot, "abcdefghijklmnopqrstuvwxyz0123456789_") != "" {
		return cli.Usagef("OUTBOX_SLOT %q: want 1 to 63 of a-z, 0-9 and _", outboxSlot)
	}
	unsafe, err := app.ParseUnsafe(os.Getenv("BILLING_UNSAFE"))
	if err != nil {
		return cli.Usagef("%v", err)
	}
	dataLayer, err := app.ParseDataLayer(os.Getenv("BILLING_DATA_LAYER"))
	if err != nil {
		return cli.Usagef("%v", err)
	}
	tokens, err := httpapi.ParseTokens(cli.Env("BILLING_API_TOKENS", httpapi.DefaultTokens))
	if err != nil {
		return cli.Usagef("%v", err)
	}
	httpCfg, err := httpserver.FromEnv("HTTP_")
	if err != nil {
		return err
	}
	refresh, err := cli.DurationEnv("METRICS_REFRESH_INTERVAL", httpapi.RefreshIntervalDefault)
	if err != nil {
		return err
	}
	var bcfg app.Config
	if err := brokerEnv(&bcfg); err != nil {
		return err
	}
	paymentURL := os.Getenv("PAYMENT_URL")
	if r.Charger && paymentURL == "" {
		return cli.Usagef("PAYMENT_URL is empty: the charger role needs the payment provider (for a simulator run 'idem paysim')")
	}
	level, err := logLevel(os.Getenv("BILLING_LOG_LEVEL"))
	if err != nil {
		return cli.Usagef("%v", err)
	}
	tel, err := otelenv.FromEnv(ctx, "billing")
	if err != nil {
		return cli.Usagef("%v", err)
	}
	defer func() {
		if ferr := tel.Shutdown(context.WithoutCancel(ctx)); ferr != nil {
			err = errors.Join(err, fmt.Errorf("billing: flushing telemetry: %w", ferr))
		}
	}()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	istore, closeStore, err := idempotencyStore(ctx, log)
	if err != nil {
		return err
	}
	defer closeStore()
	pool, err := cli.Connect(ctx, cli.DatabaseURL())
	if err != nil {
		return err
	}
	return app.Run(ctx, app.Config{
		Telemetry:         tel.Tel,
		TelemetryMetrics:  tel.Metrics,
		IdempotencyStore:  istore,
		Pool:              pool,
		Brokers:           bcfg.Brokers,
		Broker:            bcfg.Broker,
		KafkaClient:       bcfg.KafkaClient,
		NATSURL:           bcfg.NATSURL,
		NATSAckWait:       bcfg.NATSAckWait,
		PaymentURL:        paymentURL,
		HTTPAddr:          cli.Env("HTTP_ADDR", app.HTTPAddrDefault),
		HTTP:              &httpCfg,
		Tokens:            tokens,
		AdminAddr:         os.Getenv("ADMIN_ADDR"),
		MetricsToken:      os.Getenv("BILLING_METRICS_TOKEN"),
		MetricsRefresh:    refresh,
		Roles:             &r,
		ShutdownTimeout:   timeout,
		DrainDelay:        *drain,
		Partitions:        int32(*partitions),
		SessionTimeout:    session,
		HeartbeatInterval: heartbeat,
		RebalanceTimeout:  rebalance,
		OutboxLeaseTTL:    leaseTTL,
		OutboxMode:        outboxMode,
		OutboxSlot:        outboxSlot,
		DataLayer:         dataLayer,
		Unsafe:            unsafe,
		Logger:            log,
		OnListening: func(a net.Addr) {
			fmt.Printf("billing: listening on %s\n", a)
		},
		OnAdminListening: func(a net.Addr) {
			fmt.Printf("billing: admin listening on %s\n", a)
		},
	})
}

// logLevel is BILLING_LOG_LEVEL: unset or "info" (the default), "debug"
// (also kafka-go's reader logs, every consumer event and every offset
// commit of the kafkago driver), "warn" or "error".
func logLevel(v string) (slog.Level, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "", "info":
		return slog.LevelInfo, nil
	case "debug":
		return slog.LevelDebug, nil
	case "warn":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("BILLING_LOG_LEVEL=%q: want debug, info, warn or error", v)
}
