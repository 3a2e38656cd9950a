// Package app wires billing: configuration, roles, migrations, topics, and
// every long-running part under one lifecycle.Group in the stop order of
// docs/architecture.md.
package app

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx", for DataLayerSQL
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/examples/billing/adapters/in/httpapi"
	"github.com/idemkit/idem/examples/billing/adapters/out/postgres"
	"github.com/idemkit/idem/examples/billing/consumer"
	"github.com/idemkit/idem/examples/billing/scheduler"
	"github.com/idemkit/idem/examples/billing/usecase"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/httpserver"
	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/lifecycle"
	idemotel "github.com/idemkit/idem/otel"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/wal"
)

// Roles select the parts one process runs; several processes (or several
// instances of each) against one database and one Kafka share the work.
type Roles struct {
	HTTP, Relay, Consumer, Charger bool
}

// String lists the roles as --roles takes them.
func (r Roles) String() string {
	var out []string
	for _, x := range []struct {
		on   bool
		name string
	}{{r.HTTP, "http"}, {r.Relay, "relay"}, {r.Consumer, "consumer"}, {r.Charger, "charger"}} {
		if x.on {
			out = append(out, x.name)
		}
	}
	return strings.Join(out, ",")
}

// AllRoles is the default: everything in one process.
const AllRoles = "http,relay,consumer,charger"

// ErrBadRoles is a --roles value with an unknown or no role.
var ErrBadRoles = errors.New("billing: --roles must list http, relay, consumer, charger")

// ParseRoles parses "http,relay,consumer,charger" (any non-empty subset).
func ParseRoles(s string) (Roles, error) {
	var r Roles
	for _, name := range strings.Split(s, ",") {
		switch strings.TrimSpace(name) {
		case "http":
			r.HTTP = true
		case "relay":
			r.Relay = true
		case "consumer":
			r.Consumer = true
		case "charger":
			r.Charger = true
		default:
			return Roles{}, fmt.Errorf("%w: unknown role %q", ErrBadRoles, name)
		}
	}
	return r, nil
}

// Unsafe layers (Config.Unsafe, BILLING_UNSAFE): each switches one
// protection off, so that the chaos harness can prove its audit catches the
// double charges that follow. Never for production.
const (
	// UnsafeInbox: the consumers skip their processed_event dedup and
	// derive the charge key per delivery (see consumer.DeliveryEventID).
	UnsafeInbox = "inbox"
	// UnsafeFingerprint: the idempotency middleware ignores the request
	// body, so a key reused with another amount replays the first answer.
	UnsafeFingerprint = "fingerprint"
	// UnsafeLease: a duplicate arriving while the first request runs
	// executes again (two-step claims with a zero lease; see httpapi's
	// Config.UnsafeNoLease).
	UnsafeLease = "lease"
	// UnsafePublish: the relay loses one event, the first OrderConfirmed
	// it publishes, reporting it published without producing it (see
	// dropOnePublisher).
	UnsafePublish = "publish"
)

// ErrBadUnsafe is an unknown BILLING_UNSAFE layer.
var ErrBadUnsafe = errors.New("billing: BILLING_UNSAFE must be inbox, fingerprint, lease or publish")

// ParseUnsafe checks a BILLING_UNSAFE value ("" means safe).
func ParseUnsafe(s string) (string, error) {
	switch s {
	case "", UnsafeInbox, UnsafeFingerprint, UnsafeLease, UnsafePublish:
		return s, nil
	}
	return "", fmt.Errorf("%w, got %q", ErrBadUnsafe, s)
}

// Defaults of Config.
const (
	HTTPAddrDefault        = ":8080"
	ShutdownTimeoutDefault = 25 * time.Second
	PartitionsDefault      = 4
	// SessionTimeoutDefault is the consumer groups' session timeout: how
	// long a member that stopped heartbeating (SIGKILL, a frozen host)
	// keeps its partitions before the others take them over. kgo's own
	// default (45s) makes a killed instance stall its partitions for most
	// of a minute; 10s is still far above a healthy member's heartbeat gap.
	SessionTimeoutDefault = 10 * time.Second
	// HeartbeatIntervalDefault is the consumer groups' heartbeat interval:
	// also how soon a live member hears of a rebalance.
	HeartbeatIntervalDefault = time.Second
	// RebalanceTimeoutDefault bounds how long a member may take to rejoin
	// a rebalance (it first finishes the poll in hand). A member that is
	// later is dropped from the group; its records are redelivered, which
	// the inbox makes harmless. It also bounds how long a rebalance waits
	// for a member that died without leaving (SIGKILL) when the broker
	// does not expire it sooner: kfake waits the whole timeout, during
	// which the group consumes nothing.
	RebalanceTimeoutDefault = 30 * time.Second
	// OutboxLeaseTTLDefault is how long the outbox rows of a relay that
	// died mid-batch stay PUBLISHING before the reaper returns them.
	OutboxLeaseTTLDefault = outbox.LeaseTTLDefault
	// OutboxSlotDefault is Config.OutboxSlot's default.
	OutboxSlotDefault = "billing_outbox"
)

// The values of Config.DataLayer (BILLING_DATA_LAYER).
const (
	// DataLayerPGX: billing's repositories, outbox, inbox and
	// idempotency calls run on pgx, in pgx.Tx of Config.Pool. The default.
	DataLayerPGX = postgres.LayerPGX
	// DataLayerSQL: they run on database/sql, in *sql.Tx of a *sql.DB
	// opened with pgx's stdlib driver (sql.Open("pgx", url)) from Pool's
	// URL, through idem's database/sql entry points (EnqueueSQLTx,
	// MarkProcessedSQLTx, consume.NewSQL, NewSQLStore and
	// SQLTxFromContext). The relay, the purges, the status poller and the
	// gauges keep Pool (docs/databasesql.md).
	DataLayerSQL = postgres.LayerSQL
)

// ErrBadDataLayer is a BILLING_DATA_LAYER value other than pgx or sql.
var ErrBadDataLayer = errors.New("billing: BILLING_DATA_LAYER must be pgx or sql")

// ParseDataLayer checks a BILLING_DATA_LAYER value ("" means DataLayerPGX).
func ParseDataLayer(s string) (string, error) {
	switch s {
	case "":
		return DataLayerPGX, nil
	case DataLayerPGX, DataLayerSQL:
		return s, nil
	}
	return "", fmt.Errorf("%w, got %q", ErrBadDataLayer, s)
}

// The values of Config.OutboxMode (OUTBOX_MODE).
const (
	OutboxTable = "table"
	OutboxWAL   = "wal"
)

// OutboxWALPrefix is the message prefix billing's events carry in the WAL
// on slot.
func OutboxWALPrefix(slot string) string { return "billing.outbox." + slot }

func walPrefixOf(mode, slot string) string {
	if mode == OutboxWAL {
		return OutboxWALPrefix(slot)
	}
	return ""
}

// Config configures Run.
type Config struct {
	// Pool is the database. Required; closed by Run at the end.
	Pool *pgxpool.Pool
	// Brokers are the Kafka seed brokers. Required with BrokerKafka.
	Brokers []string
	// Broker is BrokerKafka or BrokerNATS (BROKER). Defaults to
	// BrokerKafka.
	Broker string
	// KafkaClient is the Kafka client library, KafkaClientFranz or
	// KafkaClientKafkaGo (KAFKA_CLIENT). Defaults to KafkaClientFranz.
	KafkaClient string
	// NATSURL is the NATS server (NATS_URL). Required with BrokerNATS.
	NATSURL string
	// NATSAckWait is the durable consumers' AckWait with BrokerNATS: how
	// soon the messages of a killed instance are delivered again.
	// Defaults to NATSAckWaitDefault (30s).
	NATSAckWait time.Duration
	// PaymentURL is the provider's base URL. Required with the charger role.
	PaymentURL string
	// HTTPAddr is the listen address. Defaults to HTTPAddrDefault (":8080").
	HTTPAddr string
	// HTTP bounds the API listener's resources: timeouts, header size,
	// open connections. Defaults to nil: httpserver's defaults (see
	// httpserver.Config).
	HTTP *httpserver.Config
	// Tokens are the bearer tokens. Required with the http role. On a
	// listener that is not loopback, Run refuses the demo tokens and
	// secrets shorter than httpapi.MinTokenLength (httpapi.CheckTokens);
	// on loopback it logs a warning for each.
	Tokens []httpapi.Token
	// AdminAddr is the admin listener's address (ADMIN_ADDR), run with
	// the http role: GET /metrics, /healthz and /readyz, with its own
	// connection limit, so that scrapes never take the API's connections.
	// When set, /metrics leaves the API listener. Defaults to "" (no admin
	// listener: /metrics is on the API listener).
	AdminAddr string
	// MetricsToken is the bearer token /metrics requires
	// (BILLING_METRICS_TOKEN), on whichever listener serves it. Without it
	// /metrics is anonymous on a loopback listener, refused with 401 on the
	// API listener elsewhere, and an admin listener that is not loopback is
	// an error. Defaults to "".
	MetricsToken string
	// MetricsRefresh is the interval of the background refresh of the
	// gauges that cost a query (outbox counts, consumer lag). Defaults to
	// httpapi.RefreshIntervalDefault (5s).
	MetricsRefresh time.Duration
	// Roles to run. Defaults to all.
	Roles *Roles
	// ShutdownTimeout bounds the whole stop. Defaults to
	// ShutdownTimeoutDefault (25s).
	ShutdownTimeout time.Duration
	// DrainDelay is how long /readyz answers 503 before the listener
	// closes; the stages share the rest of ShutdownTimeout. Must be below
	// half of ShutdownTimeout. Defaults to 4% of ShutdownTimeout (1s of
	// 25s).
	DrainDelay time.Duration
	// Partitions of the topics created when missing. Defaults to
	// PartitionsDefault (4).
	Partitions int32
	// SessionTimeout is the consumer groups' session timeout (Kafka's
	// session.timeout.ms): how long a killed instance keeps its partitions.
	// It must lie within the broker's group.min/max.session.timeout.ms
	// (6s..30m on Kafka and kfake by default). Defaults to
	// SessionTimeoutDefault (10s).
	SessionTimeout time.Duration
	// HeartbeatInterval is the consumer groups' heartbeat interval; it must
	// be below SessionTimeout (a third or less is the usual rule). Defaults
	// to HeartbeatIntervalDefault (1s).
	HeartbeatInterval time.Duration
	// RebalanceTimeout is how long a member may take to rejoin a
	// rebalance. Defaults to RebalanceTimeoutDefault (30s).
	RebalanceTimeout time.Duration
	// OutboxLeaseTTL is how long the outbox rows of a relay that died
	// mid-batch (SIGKILL) stay PUBLISHING before the reaper returns them to
	// PENDING; it must exceed twice the relay's batch timeout (at most
	// 10s, less with a short ShutdownTimeout). Defaults to
	// OutboxLeaseTTLDefault (60s).
	OutboxLeaseTTL time.Duration
	// DataLayer is DataLayerPGX or DataLayerSQL (BILLING_DATA_LAYER): the
	// transactions billing's own writes, outbox events, inbox marks and
	// idempotency records commit in. Defaults to DataLayerPGX.
	DataLayer string
	// OutboxMode is OutboxTable (the outbox table and its two-phase
	// relay) or OutboxWAL (package outbox/wal: events in the WAL, relayed
	// from the logical replication slot OutboxSlot; needs
	// wal_level=logical). Defaults to OutboxTable.
	OutboxMode string
	// OutboxSlot names the slot (and publication) of OutboxWAL, and the
	// message prefix is derived from it, so that two deployments sharing
	// a database stay apart. Defaults to OutboxSlotDefault.
	OutboxSlot string
	// IdempotencyStore holds the HTTP API's idempotency records
	// (IDEMPOTENCY_STORE): nil for PostgreSQL (Pool) in transactional
	// mode, else that store (Redis) in two-step mode, see
	// httpapi.Config.Store. The caller closes it after Run. Defaults to
	// nil.
	IdempotencyStore idempotency.Store
	// Unsafe switches one protection off: UnsafeInbox, UnsafeFingerprint,
	// UnsafeLease or UnsafePublish; for the chaos harness only. Defaults to "" (every
	// protection on).
	Unsafe string
	// OnListening is called with the bound HTTP address. Defaults to nil.
	OnListening func(addr net.Addr)
	// OnAdminListening is called with the bound admin address. Defaults to
	// nil.
	OnAdminListening func(addr net.Addr)
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Telemetry traces every component (package idemotel): the API's
	// requests continue the caller's traceparent, the events they enqueue
	// carry it through the outbox and Kafka to the consumers, and the
	// charge worker's calls carry it to the provider. Defaults to nil: no
	// spans. idem's Prometheus metrics (package idemprom) are on /metrics
	// either way.
	Telemetry *idemotel.Instrumentation
	// TelemetryMetrics runs Telemetry's outbox backlog gauges too: set it
	// when Telemetry's MeterProvider exports (OTEL_METRICS_EXPORTER).
	// Defaults to false.
	TelemetryMetrics bool
}

// Run applies the migrations, creates missing topics, starts the roles and
// blocks until SIGTERM/SIGINT (or ctx's end), then stops everything in the
// order of docs/architecture.md: readiness off → HTTP → consumer → relay →
// charge worker → Kafka clients → pool, each stage on its share of
// ShutdownTimeout.
func Run(ctx context.Context, cfg Config) (err error) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	roles := Roles{true, true, true, true}
	if cfg.Roles != nil {
		roles = *cfg.Roles
	}
	timeout := cfg.ShutdownTimeout
	if timeout == 0 {
		timeout = ShutdownTimeoutDefault
	}
	drain := cfg.DrainDelay
	if drain == 0 {
		drain = timeout * 4 / 100
	}
	if drain < 0 || drain >= timeout/2 {
		return fmt.Errorf("billing: DrainDelay %s must be in [0, ShutdownTimeout/2)", drain)
	}
	// The stages share what the drain leaves, in stop order (HTTP gets the
	// most: its requests are the ones a client is waiting on); 4% stays
	// unreserved for hard stops.
	rest := timeout - drain
	share := func(pct int) time.Duration { return rest * time.Duration(pct) / 100 }
	addr := cfg.HTTPAddr
	if addr == "" {
		addr = HTTPAddrDefault
	}
	partitions := cfg.Partitions
	if partitions == 0 {
		partitions = PartitionsDefault
	}
	session, heartbeat, rebalance := cfg.SessionTimeout, cfg.HeartbeatInterval, cfg.RebalanceTimeout
	if session == 0 {
		session = SessionTimeoutDefault
	}
	if heartbeat == 0 {
		heartbeat = HeartbeatIntervalDefault
	}
	if rebalance == 0 {
		rebalance = RebalanceTimeoutDefault
	}
	switch {
	case session < 0 || heartbeat < 0 || rebalance < 0 || cfg.OutboxLeaseTTL < 0:
		return errors.New("billing: SessionTimeout, HeartbeatInterval, RebalanceTimeout and OutboxLeaseTTL must not be negative")
	case heartbeat >= session:
		return fmt.Errorf("billing: HeartbeatInterval %s must be below SessionTimeout %s", heartbeat, session)
	}
	// Both consumer groups use these: they decide how soon the partitions
	// of a killed instance move to a live one.
	groupOpts := []kgo.Opt{kgo.SessionTimeout(session), kgo.HeartbeatInterval(heartbeat), kgo.RebalanceTimeout(rebalance)}
	if _, err := ParseUnsafe(cfg.Unsafe); err != nil {
		return err
	}
	layer, err := ParseDataLayer(cfg.DataLayer)
	if err != nil {
		return err
	}
	outboxSlot := cfg.OutboxSlot
	if outboxSlot == "" {
		outboxSlot = OutboxSlotDefault
	}
	switch cfg.OutboxMode {
	case "", OutboxTable:
	case OutboxWAL:
		// Every context the handlers run under (HTTP requests through the
		// handler, the consumers' runs through their Start) carries it.
		ctx = postgres.ContextWithWALOutbox(ctx, OutboxWALPrefix(outboxSlot))
	default:
		return fmt.Errorf("billing: OutboxMode %q: want table or wal", cfg.OutboxMode)
	}
	bk, err := newBroker(&cfg, log, session, heartbeat, rebalance)
	if err != nil {
		return err
	}
	switch {
	case cfg.Pool == nil:
		return errors.New("billing: Config.Pool is nil")
	case bk.kind == BrokerKafka && len(cfg.Brokers) == 0:
		return errors.New("billing: Config.Brokers is empty (set KAFKA_BROKERS)")
	case bk.kind == BrokerNATS && cfg.NATSURL == "":
		return errors.New("billing: Config.NATSURL is empty (set NATS_URL)")
	case roles.Charger && cfg.PaymentURL == "":
		return errors.New("billing: the charger role needs PAYMENT_URL")
	case roles.HTTP && len(cfg.Tokens) == 0:
		return errors.New("billing: the http role needs tokens")
	}
	srvCfg, err := cfg.HTTP.WithDefaults()
	if err != nil {
		return err
	}
	if roles.HTTP {
		// Refuse unsafe tokens before migrating when the address alone
		// tells; the bound address decides again below.
		if loopback, known := addrLoopback(addr); known {
			if _, err := httpapi.CheckTokens(cfg.Tokens, !loopback); err != nil {
				return fmt.Errorf("%w (HTTP_ADDR %s)", err, addr)
			}
			if cfg.AdminAddr == "" {
				if err := checkMetricsToken(cfg.MetricsToken, !loopback); err != nil {
					return fmt.Errorf("%w (HTTP_ADDR %s)", err, addr)
				}
			}
		}
		if loopback, known := addrLoopback(cfg.AdminAddr); cfg.AdminAddr != "" && known {
			if err := checkMetricsToken(cfg.MetricsToken, !loopback); err != nil {
				return fmt.Errorf("%w (ADMIN_ADDR %s)", err, cfg.AdminAddr)
			}
		}
	}
	pool := cfg.Pool
	if cfg.Unsafe != "" {
		log.Error("UNSAFE MODE: BILLING_UNSAFE=" + cfg.Unsafe + " switches off a protection; this instance WILL charge twice or replay wrong answers. For the chaos harness only, never in production.")
	}
	// Until the group owns them, close what was opened on every early
	// return.
	var closers []func()
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()
	closers = append(closers, pool.Close)
	// data is where the handlers' transactions run; idem's loops keep pool.
	data := postgres.PGX(pool)
	var sdb *sql.DB
	if layer == DataLayerSQL {
		sdb, err = sql.Open("pgx", pool.Config().ConnString())
		if err != nil {
			return fmt.Errorf("billing: BILLING_DATA_LAYER=sql: %w", err)
		}
		// As many connections as the pool: the handlers' share.
		sdb.SetMaxOpenConns(int(pool.Config().MaxConns))
		sdb.SetMaxIdleConns(int(pool.Config().MaxConns))
		closers = append(closers, func() { _ = sdb.Close() })
		data = postgres.SQL(sdb)
	}
	// franz-go's consumers are package kafka's on pgx, and consume's on
	// kafka.NewDriver on database/sql (consume.NewSQL); every other driver
	// is consume's on either layer.
	onDriver := !bk.franz() || layer == DataLayerSQL

	// A signal (ctx's end) before the group runs is a stop asked for, not a
	// failure: each migration version is one transaction with its version
	// row, so the version in hand rolls back whole when ctx cancels its
	// statement, and a later start applies it afresh. Topic creation is
	// idempotent too.
	stoppedBeforeReady := func(step string, err error) error {
		if ctx.Err() == nil {
			return err
		}
		log.Info("billing stopped before ready: the signal came while "+step+"; nothing was left half-done", "error", err)
		return nil
	}
	if err := postgres.Migrate(ctx, pool); err != nil {
		return stoppedBeforeReady("migrating", err)
	}
	if cfg.OutboxMode == OutboxWAL {
		// The slot must exist before the first event is written, whatever
		// the roles of this instance: a message written before it is never
		// decoded.
		if err := wal.CreateSlot(ctx, pool.Config().ConnString(), &wal.Config{Slot: outboxSlot, Publication: outboxSlot}); err != nil {
			return fmt.Errorf("billing: OUTBOX_MODE=wal: %w", err)
		}
	}
	if err := bk.ensure(ctx, partitions); err != nil {
		return stoppedBeforeReady("creating topics", err)
	}

	g, err := lifecycle.New(&lifecycle.Config{ShutdownTimeout: timeout, DrainDelay: drain, Logger: log})
	if err != nil {
		return err
	}
	metrics := httpapi.NewMetrics()
	tele, err := newTelemetry(cfg.Telemetry, metrics)
	if err != nil {
		return err
	}
	if log.Enabled(ctx, slog.LevelDebug) {
		tele.debug = log
	}

	var httpStage, consumerStage, relayStage, chargerStage, kafkaStage []lifecycle.Component

	if roles.HTTP {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("billing: listen %s: %w", addr, err)
		}
		closers = append(closers, func() { _ = ln.Close() })
		public := !isLoopback(ln.Addr())
		warnings, err := httpapi.CheckTokens(cfg.Tokens, public)
		if err != nil {
			return fmt.Errorf("%w (HTTP_ADDR %s)", err, ln.Addr())
		}
		for _, w := range warnings {
			log.Warn(w, "addr", ln.Addr().String())
		}

		// /metrics: on the admin listener when there is one, else on the
		// API's; anonymous only on loopback, else behind MetricsToken.
		scrape := httpapi.ScrapeConfig{Token: cfg.MetricsToken, Anonymous: !public}
		var apiMetrics http.Handler
		if cfg.AdminAddr != "" {
			aln, err := net.Listen("tcp", cfg.AdminAddr)
			if err != nil {
				return fmt.Errorf("billing: listen %s (ADMIN_ADDR): %w", cfg.AdminAddr, err)
			}
			closers = append(closers, func() { _ = aln.Close() })
			adminPublic := !isLoopback(aln.Addr())
			if adminPublic && cfg.MetricsToken == "" {
				return fmt.Errorf("billing: ADMIN_ADDR %s is not loopback: set BILLING_METRICS_TOKEN, or bind it to 127.0.0.1", aln.Addr())
			}
			if err := checkMetricsToken(cfg.MetricsToken, adminPublic); err != nil {
				return fmt.Errorf("%w (ADMIN_ADDR %s)", err, aln.Addr())
			}
			scrape.Anonymous = !adminPublic
			admin := httpserver.New(httpapi.AdminHandler(metrics.Handler(scrape), g.ReadyHandler()), srvCfg, log)
			httpStage = append(httpStage, lifecycle.NewHTTPServer(admin, adminLimit(srvCfg, aln)))
			if cfg.OnAdminListening != nil {
				cfg.OnAdminListening(aln.Addr())
			}
		} else {
			apiMetrics = metrics.Handler(scrape)
			if err := checkMetricsToken(cfg.MetricsToken, public); err != nil {
				return fmt.Errorf("%w (HTTP_ADDR %s)", err, ln.Addr())
			}
			if public && cfg.MetricsToken == "" {
				log.Warn("/metrics refuses every scrape (401): HTTP_ADDR is not loopback and BILLING_METRICS_TOKEN is unset; set it, or ADMIN_ADDR", "addr", ln.Addr().String())
			}
		}

		h, mw, err := httpapi.NewHandler(httpapi.Config{
			DB: pool, SQLDB: sdb, Store: cfg.IdempotencyStore, Tokens: cfg.Tokens, Ready: g.ReadyHandler(), Metrics: metrics, MetricsHandler: apiMetrics, Logger: log, Hook: tele.request(),
			UnsafeNoFingerprint: cfg.Unsafe == UnsafeFingerprint, UnsafeNoLease: cfg.Unsafe == UnsafeLease,
			WALOutboxPrefix: walPrefixOf(cfg.OutboxMode, outboxSlot),
		})
		if err != nil {
			return err
		}
		gcfg := httpapi.GaugesConfig{DB: pool, Groups: []string{consumer.OrderGroup, consumer.ChargeGroupDefault}, Interval: cfg.MetricsRefresh, Logger: log}
		if bk.kind == BrokerKafka {
			// The lag of a Kafka group is the broker's, whichever client
			// consumes; on NATS there is no lag gauge.
			adminCl, err := kgo.NewClient(kgo.SeedBrokers(cfg.Brokers...))
			if err != nil {
				return fmt.Errorf("billing: kafka admin client: %w", err)
			}
			closers = append(closers, adminCl.Close)
			gcfg.Lag = kadm.NewClient(adminCl)
			kafkaStage = append(kafkaStage, lifecycle.Closer(adminCl.Close))
		}
		gauges := metrics.NewGauges(gcfg)

		idemGauges, err := tele.gauges(pool, cfg.MetricsRefresh, cfg.TelemetryMetrics)
		if err != nil {
			return err
		}
		srv := httpserver.New(tele.handler(h), srvCfg, log)
		httpStage = append(httpStage, lifecycle.NewHTTPServer(srv, srvCfg.Limit(ln)))
		// The idempotency records' retention purge and the gauges' refresh
		// stop with the relay's background loops, after the last request.
		relayStage = append(relayStage, mw, lifecycle.Go("metrics-gauges", gauges.Run))
		relayStage = append(relayStage, idemGauges...)
		if cfg.OnListening != nil {
			cfg.OnListening(ln.Addr())
		}
	}
	if roles.Consumer && onDriver {
		hook := tele.consumer(consumer.OnDuplicate(metrics.InboxDuplicate(consumer.OrderGroup)))
		if cfg.Unsafe == UnsafeInbox {
			hook = tele.consumer(nil)
		}
		c, err := bk.orderConsumer(data, hook)
		if err != nil {
			return err
		}
		consumerStage = append(consumerStage, c)
	} else if roles.Consumer {
		var c *kafka.Consumer
		if cfg.Unsafe == UnsafeInbox {
			c, err = consumer.NewUnsafeOrderConsumer(pool, cfg.Brokers, log, tele.consumer(nil), groupOpts...)
		} else {
			c, err = consumer.NewOrderConsumer(pool, cfg.Brokers, log, tele.consumer(consumer.OnDuplicate(metrics.InboxDuplicate(consumer.OrderGroup))), groupOpts...)
		}
		if err != nil {
			return err
		}
		consumerStage = append(consumerStage, c)
	}
	if roles.Relay {
		var pub outbox.Publisher
		var closeBroker lifecycle.Component
		if bk.franz() {
			prodCl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...)}, kafka.ProducerOpts()...)...)
			if err != nil {
				return fmt.Errorf("billing: kafka producer: %w", err)
			}
			closers = append(closers, prodCl.Close)
			kpub, err := kafka.NewPublisher(prodCl, nil)
			if err != nil {
				return err
			}
			pub, closeBroker = kpub, lifecycle.Closer(prodCl.Close)
		} else {
			bpub, closeClient, err := bk.publisher()
			if err != nil {
				return err
			}
			closers = append(closers, func() { _ = closeClient.Stop(context.Background()) })
			pub, closeBroker = bpub, closeClient
		}
		if cfg.Unsafe == UnsafePublish {
			pub = &dropOnePublisher{next: pub, log: log}
		}
		// The batch in hand must finish inside the relay's stage: its
		// timeout is below the stage's budget. OUTBOX_MODE decides the
		// relay whatever the broker (a wal instance that ran the table
		// relay would publish nothing: its events are in the WAL).
		batchTimeout := min(outbox.BatchTimeoutDefault, share(20)*3/4)
		var loops []lifecycle.Component
		var err error
		if cfg.OutboxMode == OutboxWAL {
			loops, err = scheduler.WAL(pool, pool.Config().ConnString(), pub, batchTimeout, outboxSlot, OutboxWALPrefix(outboxSlot), log, tele.loops())
		} else {
			loops, err = scheduler.New(pool, pub, batchTimeout, cfg.OutboxLeaseTTL, log, tele.loops())
		}
		if err != nil {
			return err
		}
		relayStage = append(relayStage, loops...)
		kafkaStage = append(kafkaStage, closeBroker)
	}
	if roles.Charger {
		gw, err := tele.gateway(cfg.PaymentURL, 10*time.Second)
		if err != nil {
			return err
		}
		wcfg := &consumer.ChargeWorkerConfig{
			Brokers: cfg.Brokers, Logger: log, OnSettled: metrics.ChargeSettled,
			OnDuplicate: metrics.InboxDuplicate(consumer.ChargeGroupDefault), OnProviderReplay: metrics.ProviderReplay,
			ClientOpts: groupOpts, UnsafeNoInbox: cfg.Unsafe == UnsafeInbox, Hook: tele.consumer(nil),
		}
		w, err := bk.chargeWorker(pool, data, gw, wcfg)
		if err != nil {
			return err
		}
		chargerStage = append(chargerStage, w)
		kafkaStage = append(kafkaStage, lifecycle.Closer(gw.Close))
	}

	poolStage := []lifecycle.Component{lifecycle.Closer(pool.Close)}
	if sdb != nil {
		poolStage = append(poolStage, lifecycle.Closer(func() { _ = sdb.Close() }))
	}
	stages := []lifecycle.Stage{
		{Name: "http", Budget: share(34), Components: httpStage},
		{Name: "consumer", Budget: share(16), Components: consumerStage},
		{Name: "relay", Budget: share(20), Components: relayStage},
		{Name: "charger", Budget: share(18), Components: chargerStage},
		{Name: "kafka-clients", Budget: share(4), Components: kafkaStage},
		{Name: "pool", Budget: share(4), Components: poolStage},
	}
	for _, st := range stages {
		if err := g.Add(st); err != nil {
			return err
		}
	}
	closers = nil // the group owns everything now
	log.Info("billing starting", "roles", roles.String(), "shutdown_timeout", timeout, "unsafe", cfg.Unsafe, "data_layer", layer,
		"broker", bk.kind, "kafka_client", bk.client, "kafka_session_timeout", session, "kafka_heartbeat_interval", heartbeat, "kafka_rebalance_timeout", rebalance)
	return g.Run(ctx)
}

// adminMaxConns bounds the admin listener's connections: scrapers and
// probes, a handful.
const adminMaxConns = 16

// addrLoopback tells from a listen address whether it is loopback; known
// is false for a host name other than localhost (it is resolved when
// listening).
func addrLoopback(addr string) (loopback, known bool) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false, false
	}
	if host == "localhost" {
		return true, true
	}
	if host == "" {
		return false, true
	}
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback(), true
	}
	return false, false
}

// isLoopback reports whether a bound address accepts only local clients.
// An unspecified address (":8080", "0.0.0.0", "::") is every interface.
func isLoopback(a net.Addr) bool {
	t, ok := a.(*net.TCPAddr)
	return ok && t.IP.IsLoopback()
}

// ensureTopics creates the flow's topics (and each consumer's dead-letter
// topic) when missing, through kafka.EnsureTopics. Replication is the
// broker's default.
func ensureTopics(ctx context.Context, brokers []string, partitions int32) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return fmt.Errorf("billing: kafka client: %w", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := kafka.EnsureTopics(ctx, cl, partitions,
		usecase.TopicOrderEvents, usecase.TopicBillingCommands,
		usecase.TopicOrderEvents+kafka.DeadLetterSuffixDefault,
		usecase.TopicBillingCommands+kafka.DeadLetterSuffixDefault); err != nil {
		return fmt.Errorf("billing: topics on %s: %w", strings.Join(brokers, ","), err)
	}
	return nil
}

// adminLimit bounds the admin listener: adminMaxConns connections, half of
// them per client address, so that one scraper (or anyone else who
// reaches the port) cannot hold the slots /readyz needs.
func adminLimit(cfg httpserver.Config, ln net.Listener) *httpserver.Listener {
	cfg.MaxConns, cfg.MaxConnsPerClient = adminMaxConns, adminMaxConns/2
	return cfg.Limit(ln)
}

// checkMetricsToken refuses a BILLING_METRICS_TOKEN shorter than the API
// tokens' minimum (httpapi.MinTokenLength) on a listener that is not
// loopback, where anyone who can reach the port can guess at it; on
// loopback (anonymous scrapes are allowed there anyway) any length goes.
// An empty token is not its concern: /metrics then refuses every scrape
// off loopback.
func checkMetricsToken(token string, public bool) error {
	if !public || token == "" || len(token) >= httpapi.MinTokenLength {
		return nil
	}
	return fmt.Errorf("%w: BILLING_METRICS_TOKEN is %d bytes, below the minimum of %d for a listener that is not loopback; set a longer one, or listen on loopback",
		httpapi.ErrUnsafeTokens, len(token), httpapi.MinTokenLength)
}
