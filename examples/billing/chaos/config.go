package chaos

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/idemkit/idem/examples/billing/consumer"
	"github.com/idemkit/idem/outbox"
)

// Unsafe layers: each switches off one protection, and the audit must then
// find double charges.
const (
	// UnsafeKey makes the driver mint a fresh Idempotency-Key for every
	// retry and duplicate (the client bug the HTTP key layer cannot see).
	UnsafeKey = "key"
	// UnsafeInbox asks billing to skip its processed_event dedup and to
	// derive the charge key per delivery (BILLING_UNSAFE=inbox): a
	// redelivered event or command, after a SIGKILL, is charged again. It
	// needs Kills to show.
	UnsafeInbox = "inbox"
	// UnsafeFingerprint asks billing to leave the body out of the request
	// fingerprint (BILLING_UNSAFE=fingerprint): the driver's reuse probe
	// gets the first answer replayed (key-reuse-accepted).
	UnsafeFingerprint = "fingerprint"
	// UnsafeLease asks billing to run without in-flight protection
	// (BILLING_UNSAFE=lease: two-step claims whose lease is zero): a
	// concurrent duplicate of a POST executes again. It needs
	// DuplicateRate to show.
	UnsafeLease = "lease"
	// UnsafePublish asks billing's relay to skip one event
	// (BILLING_UNSAFE=publish: the first OrderConfirmed each relay sees is
	// reported published without being produced): the Kafka audit must name
	// it lost.
	UnsafePublish = "publish"
)

// unsafeLayers lists the Unsafe values, for messages.
// The values of Config.OutboxMode.
const (
	OutboxTable = "table"
	OutboxWAL   = "wal"
)

// The values of Config.DataLayer.
const (
	DataLayerPGX = "pgx"
	DataLayerSQL = "sql"
)

const unsafeLayers = "key, inbox, fingerprint, lease or publish"

// Defaults of Config.
const (
	OrdersDefault          = 60
	PaymentsDefault        = 30
	InstancesDefault       = 3
	ConcurrencyDefault     = 8
	LoadDurationDefault    = 20 * time.Second
	DuplicateRateDefault   = 0.1
	ClientDropRateDefault  = 0.1
	RequestTimeoutDefault  = 5 * time.Second
	OpTimeoutDefault       = 90 * time.Second
	QuiescenceDefault      = 3 * time.Minute
	ShutdownTimeoutDefault = 10 * time.Second
	// OutboxLeaseTTLMin is billing's OUTBOX_LEASE_TTL in a chaos run with
	// the default ShutdownTimeout; see outboxLeaseTTL.
	OutboxLeaseTTLMin = 5 * time.Second
	// SessionTimeoutDefault is billing's KAFKA_SESSION_TIMEOUT in a chaos
	// run: the broker's minimum, so that the partitions of a SIGKILLed
	// instance move to a live one within seconds and a run's quiescence is
	// not mostly waiting for dead sessions.
	SessionTimeoutDefault = 6 * time.Second
	TokenDefault          = "chaos-token"
	PrincipalDefault      = "chaos"
)

// ErrConfig is an invalid Config; the message names the field.
var ErrConfig = errors.New("chaos: invalid config")

// Config is one chaos run. A zero field takes its default; fields without
// a default are required.
type Config struct {
	// IdemBin is the idem binary (devkafka, paysim). Required.
	IdemBin string
	// BillingBin is the billing binary (serve). Required.
	BillingBin string
	// DatabaseURL is billing's (and paysim's) DATABASE_URL. Required. Give
	// each run a fresh database or schema (search_path in the URL).
	DatabaseURL string
	// KafkaBrokers is a comma list of brokers. Defaults to a devkafka
	// child with a data directory, which BrokerRestarts restarts.
	KafkaBrokers string
	// Broker is BrokerKafka or BrokerNATS: with BrokerNATS the harness
	// runs a nats-server -js child instead of devkafka (BrokerRestarts
	// restart it), billing runs with BROKER=nats, and the broker audit
	// reads the JetStream streams. Defaults to BrokerKafka.
	Broker string
	// NATSServerBin is the nats-server binary for BrokerNATS. Defaults to
	// nats-server on PATH.
	NATSServerBin string

	// Orders to create and confirm. Defaults to OrdersDefault.
	Orders int
	// Payments to create, each on its own new order. Defaults to
	// PaymentsDefault.
	Payments int
	// Instances of billing serve. Defaults to InstancesDefault.
	Instances int
	// Kills: billing instances SIGKILLed and restarted. Defaults to 0.
	Kills int
	// Terms: billing instances SIGTERMed and restarted. Defaults to 0.
	Terms int
	// BrokerRestarts: devkafka restarts (SIGKILL, then SIGTERM,
	// alternating). Defaults to 0; must be 0 with KafkaBrokers.
	BrokerRestarts int
	// DropRate: paysim charges, then drops the response. Defaults to 0.
	DropRate float64
	// FailRate: paysim fails before charging. Defaults to 0.
	FailRate float64
	// ProduceFailRate: the devkafka child answers this share of produce
	// partition-requests with a non-retriable error (a partial produce
	// failure when a batch spans partitions). Defaults to 0; needs the
	// devkafka child.
	ProduceFailRate float64
	// PGRestarts: billing runs on a throwaway PostgreSQL cluster of its own
	// (package pgtemp; paysim stays on DatabaseURL), crashed with pg_ctl
	// stop -m immediate and restarted this many times during the load.
	// Defaults to 0 (billing on DatabaseURL).
	PGRestarts int
	// NetCuts: billing reaches PostgreSQL and Kafka through TCP fault
	// proxies (internal/faultproxy; devkafka advertises its proxy), and
	// every open connection of both is reset this many times during the
	// load, every other time after a stall of up to 2s. Defaults to 0;
	// needs the devkafka child.
	NetCuts int
	// DeclineRate: paysim declines this share of charge keys for good
	// (402 CARD_DECLINED, recorded in its ledger); the only FAILED the
	// audit accepts is one that matches such a decline. Defaults to 0.
	DeclineRate float64
	// OutboxMode is billing's OUTBOX_MODE: "table" (the outbox table) or
	// "wal" (package outbox/wal: events in the WAL, relayed from a
	// replication slot; billing's database needs wal_level=logical). In
	// wal mode the harness creates an audit slot of its own before
	// billing starts, and audits the topics against the events it
	// decodes from it, in commit order, instead of the outbox table; the
	// slots and the publication are dropped at the end. Defaults to
	// "table".
	OutboxMode string
	// DataLayer is billing's BILLING_DATA_LAYER, given to every instance:
	// "pgx" (its repositories, outbox, inbox and idempotency calls on
	// pgx) or "sql" (the same through database/sql on pgx's stdlib
	// driver: EnqueueSQLTx, MarkProcessedSQLTx, consume.NewSQL,
	// NewSQLStore). Defaults to "pgx".
	DataLayer string
	// Failpoints arms the crash windows of internal/failpoint (kill
	// actions) in one billing instance at a time, until each window has
	// been hit FailpointHits times; see failpoints.go. Defaults to false.
	Failpoints bool
	// FailpointHits is the hits per window after which it is disarmed.
	// Defaults to FailpointHitsDefault (1).
	FailpointHits int
	// FailpointWindows are the windows to arm (a run aimed at some).
	// Defaults to every window of failpoint.Names.
	FailpointWindows []string
	// FailpointOdds overrides the kill probability of the windows it
	// names (a run aimed at one window raises its odds). Defaults to
	// none: KillProbability's values.
	FailpointOdds map[string]float64
	// Seed drives every random choice: the driver's, the chaos schedule's,
	// paysim's and devkafka's produce failures. Defaults to a seed from the
	// clock (reported).
	Seed int64
	// Unsafe switches off one protection: "", UnsafeKey, UnsafeInbox,
	// UnsafeFingerprint, UnsafeLease or UnsafePublish. Defaults to "" (all
	// on).
	Unsafe string

	// Concurrency is the number of driver workers. Defaults to
	// ConcurrencyDefault.
	Concurrency int
	// LoadDuration spreads the start of the orders and payments evenly
	// over this time (a negative value: all at once, as fast as
	// Concurrency allows). Defaults to LoadDurationDefault.
	LoadDuration time.Duration
	// DuplicateRate is the share of POSTs sent twice at once. Defaults to
	// DuplicateRateDefault; negative means 0.
	DuplicateRate float64
	// ClientDropRate is the share of answers the driver throws away, as if
	// lost on the network, and retries. Defaults to ClientDropRateDefault;
	// negative means 0.
	ClientDropRate float64
	// RequestTimeout bounds one HTTP attempt. Defaults to
	// RequestTimeoutDefault.
	RequestTimeout time.Duration
	// OpTimeout bounds one POST with all its retries. Defaults to
	// OpTimeoutDefault.
	OpTimeout time.Duration
	// Quiescence bounds the wait for all work to be final. Defaults to
	// QuiescenceDefault.
	Quiescence time.Duration
	// ShutdownTimeout is billing's SHUTDOWN_TIMEOUT. Defaults to
	// ShutdownTimeoutDefault.
	ShutdownTimeout time.Duration
	// SessionTimeout is billing's KAFKA_SESSION_TIMEOUT; its heartbeat
	// interval is a sixth of it and its KAFKA_REBALANCE_TIMEOUT the same.
	// The rebalance timeout matters as much: an instance restarted after a
	// SIGKILL rejoins at once, and the broker (kfake) then waits up to the
	// rebalance timeout for the dead member to rejoin too, while nobody
	// consumes. A live member slower than that to finish its poll is
	// dropped and its uncommitted records redelivered, which the inbox
	// makes harmless. Defaults to SessionTimeoutDefault (6s).
	SessionTimeout time.Duration
	// Token is the bearer token the driver sends; billing gets
	// BILLING_API_TOKENS=Token:chaos. Defaults to TokenDefault.
	Token string
	// Env is added to every billing instance's environment (tuning knobs).
	// Defaults to none.
	Env []string
	// WorkDir holds the logs and the broker's data. Defaults to a new
	// temporary directory, removed after a passing run.
	WorkDir string
	// Progress receives progress: a live bar when ProgressTTY, else plain
	// lines. Defaults to none.
	Progress io.Writer
	// ProgressTTY draws a bar that rewrites itself. Defaults to false.
	ProgressTTY bool
}

func (c *Config) withDefaults() Config {
	out := *c
	def := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	def(&out.Orders, OrdersDefault)
	def(&out.Payments, PaymentsDefault)
	def(&out.Instances, InstancesDefault)
	def(&out.Concurrency, ConcurrencyDefault)
	def(&out.FailpointHits, FailpointHitsDefault)
	if out.OutboxMode == "" {
		out.OutboxMode = OutboxTable
	}
	if out.DataLayer == "" {
		out.DataLayer = DataLayerPGX
	}
	if out.DuplicateRate == 0 {
		out.DuplicateRate = DuplicateRateDefault
	}
	out.DuplicateRate = max(out.DuplicateRate, 0)
	if out.ClientDropRate == 0 {
		out.ClientDropRate = ClientDropRateDefault
	}
	out.ClientDropRate = max(out.ClientDropRate, 0)
	durDef := func(p *time.Duration, v time.Duration) {
		if *p == 0 {
			*p = v
		}
	}
	durDef(&out.LoadDuration, LoadDurationDefault)
	out.LoadDuration = max(out.LoadDuration, 0)
	durDef(&out.RequestTimeout, RequestTimeoutDefault)
	durDef(&out.OpTimeout, OpTimeoutDefault)
	durDef(&out.Quiescence, QuiescenceDefault)
	durDef(&out.ShutdownTimeout, ShutdownTimeoutDefault)
	durDef(&out.SessionTimeout, SessionTimeoutDefault)
	if out.Token == "" {
		out.Token = TokenDefault
	}
	if out.Seed == 0 {
		out.Seed = time.Now().UnixNano() & (1<<48 - 1)
	}
	return out
}

func (c *Config) validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, a...))
	}
	switch {
	case c.IdemBin == "":
		return bad("IdemBin is empty")
	case c.BillingBin == "":
		return bad("BillingBin is empty")
	case c.DatabaseURL == "":
		return bad("DatabaseURL is empty")
	case c.Orders < 0, c.Orders > 1_000_000:
		return bad("Orders %d out of range 0..1000000", c.Orders)
	case c.Payments < 0, c.Payments > 1_000_000:
		return bad("Payments %d out of range 0..1000000", c.Payments)
	case c.Orders+c.Payments == 0:
		return bad("Orders and Payments are both 0")
	case c.Instances < 1, c.Instances > 32:
		return bad("Instances %d out of range 1..32", c.Instances)
	case c.OutboxMode != OutboxTable && c.OutboxMode != OutboxWAL:
		return bad("OutboxMode %q: want %s or %s", c.OutboxMode, OutboxTable, OutboxWAL)
	case c.DataLayer != DataLayerPGX && c.DataLayer != DataLayerSQL:
		return bad("DataLayer %q: want %s or %s", c.DataLayer, DataLayerPGX, DataLayerSQL)
	case c.Kills < 0, c.Terms < 0, c.BrokerRestarts < 0, c.PGRestarts < 0, c.NetCuts < 0:
		return bad("Kills, Terms, BrokerRestarts, PGRestarts and NetCuts must not be negative")
	case (c.Kills > 0 || c.Terms > 0) && c.Instances < 2:
		return bad("Kills and Terms need Instances >= 2 (one always serves)")
	case c.BrokerRestarts > 0 && c.KafkaBrokers != "":
		return bad("BrokerRestarts needs the devkafka child (KafkaBrokers empty)")
	case c.NetCuts > 0 && c.KafkaBrokers != "":
		return bad("NetCuts needs the devkafka child (KafkaBrokers empty): the broker must advertise the proxy")
	case c.ProduceFailRate > 0 && c.KafkaBrokers != "":
		return bad("ProduceFailRate needs the devkafka child (KafkaBrokers empty)")
	case c.Broker != "" && c.Broker != BrokerKafka && c.Broker != BrokerNATS:
		return bad("Broker %q: want kafka or nats", c.Broker)
	case c.Broker == BrokerNATS && (c.NetCuts > 0 || c.ProduceFailRate > 0 || c.KafkaBrokers != ""):
		return bad("Broker nats runs its own nats-server: NetCuts, ProduceFailRate and KafkaBrokers are Kafka's")
	case c.ProduceFailRate < 0, c.ProduceFailRate >= 1:
		return bad("ProduceFailRate %v out of range [0,1)", c.ProduceFailRate)
	case c.DropRate < 0, c.DropRate >= 1:
		return bad("DropRate %v out of range [0,1)", c.DropRate)
	case c.FailRate < 0, c.FailRate >= 1:
		return bad("FailRate %v out of range [0,1)", c.FailRate)
	case c.DeclineRate < 0, c.DeclineRate >= 1:
		return bad("DeclineRate %v out of range [0,1)", c.DeclineRate)
	case c.FailpointHits < 1:
		return bad("FailpointHits %d < 1", c.FailpointHits)
	case badWindows(c.FailpointWindows) != "":
		return bad("FailpointWindows: %s", badWindows(c.FailpointWindows))
	case badOdds(c.FailpointOdds) != "":
		return bad("FailpointOdds: %s", badOdds(c.FailpointOdds))
	case c.DuplicateRate > 1, c.ClientDropRate >= 1:
		return bad("DuplicateRate must be <= 1 and ClientDropRate < 1")
	case c.SessionTimeout < 0:
		return bad("SessionTimeout %v is negative", c.SessionTimeout)
	case c.Concurrency < 1:
		return bad("Concurrency %d < 1", c.Concurrency)
	}
	switch c.Unsafe {
	case "", UnsafeKey, UnsafeInbox, UnsafeFingerprint, UnsafeLease, UnsafePublish:
	default:
		return bad("Unsafe %q: want %s", c.Unsafe, unsafeLayers)
	}
	return nil
}

// outboxLeaseTTL is the outbox lease for billing instances stopped within
// shutdown: short, so that a SIGKILLed relay's rows return in seconds, but
// above twice billing's relay batch timeout (about 15% of shutdown, at most
// 10s), which the relay requires.
func outboxLeaseTTL(shutdown time.Duration) time.Duration {
	return max(OutboxLeaseTTLMin, shutdown*4/10)
}

// timer is one of the system's own redelivery timers: how long after a
// crash or a failure something is done again.
type timer struct {
	name string
	d    time.Duration
}

// redeliveryTimers lists the timers of the run's billing configuration,
// Env's overrides included.
func (c *Config) redeliveryTimers() []timer {
	lease := outboxLeaseTTL(c.ShutdownTimeout)
	session, rebalance := c.SessionTimeout, c.SessionTimeout
	for _, kv := range c.Env {
		k, v, _ := strings.Cut(kv, "=")
		d, err := time.ParseDuration(v)
		if err != nil {
			continue
		}
		switch k {
		case "OUTBOX_LEASE_TTL":
			lease = d
		case "KAFKA_SESSION_TIMEOUT":
			session = d
		case "KAFKA_REBALANCE_TIMEOUT":
			rebalance = d
		}
	}
	return []timer{
		// A relay that died mid-batch leaves rows PUBLISHING: the reaper,
		// every ReapInterval, returns them after the lease.
		{"outbox lease + reaper interval", lease + outbox.ReapIntervalDefault},
		// A dead consumer keeps its partitions until its session expires;
		// a rebalance waits this long for a member to rejoin.
		{"consumer session timeout", session},
		{"consumer rebalance timeout", rebalance},
		// A charge whose outcome was unknown is retried after at most this.
		{"charger retry backoff", consumer.BackoffMaxDefault},
	}
}

// ledgerWatch is how long quiescence watches a still ledger: longer than
// the longest redelivery timer (with a quarter, at least 2s, to spare), so
// that a duplicate charge made by a late redelivery lands inside it.
func (c *Config) ledgerWatch() (time.Duration, timer) {
	var longest timer
	for _, t := range c.redeliveryTimers() {
		if t.d > longest.d {
			longest = t
		}
	}
	return longest.d + max(2*time.Second, longest.d/4), longest
}

// Profiles name the sizes of `billing chaos --profile`: "short" is the
// default run (about a minute), the one CI makes; "long" is big enough for
// rare bugs to fire: over 10,000 POSTs, with kills, terms, broker
// restarts and every failpoint window hit three times, and paysim dropping
// 40% of its answers after charging, often enough that billing's
// idemclient retries a charge two or three times over (net/http's own
// resend of a request whose reused connection broke absorbs only the first
// failure of an attempt). docs/proof.md gives its wall time.
var Profiles = map[string]Config{
	"short": {
		Orders: 100, Payments: 50, Instances: 3, Kills: 3, Terms: 2, BrokerRestarts: 1,
		DropRate: 0.2, FailRate: 0.1, DeclineRate: 0.05,
	},
	"long": {
		Orders: 3400, Payments: 1600, Instances: 3, Kills: 30, Terms: 15, BrokerRestarts: 4,
		DropRate: 0.4, FailRate: 0.1, DeclineRate: 0.05,
		Failpoints: true, FailpointHits: 3,
		Concurrency: 16, LoadDuration: 10 * time.Minute, Quiescence: 10 * time.Minute,
	},
}

// ProfileNames lists Profiles, for messages.
const ProfileNames = "short or long"

// badOdds says what is wrong with a FailpointOdds map ("" for nothing).
func badOdds(odds map[string]float64) string {
	for name, p := range odds {
		if _, ok := KillProbability[name]; !ok {
			return fmt.Sprintf("%q is no failpoint", name)
		}
		if !(p > 0 && p <= 1) {
			return fmt.Sprintf("%s: probability %v out of range (0,1]", name, p)
		}
	}
	return ""
}

// badWindows says what is wrong with a FailpointWindows list ("" for
// nothing).
func badWindows(ws []string) string {
	for _, w := range ws {
		if _, ok := KillProbability[w]; !ok {
			return fmt.Sprintf("%q is no failpoint", w)
		}
	}
	return ""
}
