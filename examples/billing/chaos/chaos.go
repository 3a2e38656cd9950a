package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/examples/billing/consumer"
	"github.com/idemkit/idem/examples/billing/usecase"
	"github.com/idemkit/idem/internal/failpoint"
	"github.com/idemkit/idem/internal/faultproxy"
	"github.com/idemkit/idem/internal/pgtemp"
	idemprom "github.com/idemkit/idem/prom"
)

// Metric names read from billing's /metrics (examples/billing) and
// paysim's. A metric no process exports is reported as n/a, not as zero.
const (
	// MetricIdempotencyEvents is billing's idempotency middleware events by
	// kind; kind="replay" is a stored answer replayed (the HTTP key layer,
	// as the server saw it).
	MetricIdempotencyEvents = "billing_idempotency_events_total"
	// MetricInboxDuplicates counts redelivered events billing's inbox
	// skipped as already processed.
	MetricInboxDuplicates = "billing_inbox_duplicates_total"
	// MetricProviderReplays counts charges the provider answered from its
	// idempotency store (Idempotent-Replayed: true), as billing saw them.
	MetricProviderReplays = "billing_provider_replays_total"
	// MetricCharges is billing's settled charges by target and outcome; an
	// outcome="replayed" series, if billing has one, is the provider key
	// layer too.
	MetricCharges = "billing_charges_total"
	// MetricIdemReplays, MetricIdemRequests, MetricIdemDuplicates and
	// MetricIdemRecords are idem's collector's (package idemprom), which
	// billing's /metrics serves: the server-side replays and the inbox's
	// skipped redeliveries are read from them first.
	MetricIdemReplays    = idemprom.MetricReplays
	MetricIdemRequests   = idemprom.MetricRequests
	MetricIdemDuplicates = idemprom.MetricConsumerDuplicates
	MetricIdemRecords    = idemprom.MetricConsumerRecords
	// MetricPaysimReplays is paysim's own count of replayed charges, read
	// from paysim's /metrics when it has one (preferred).
	MetricPaysimReplays = "paysim_replays_total"
)

// run is the state of one chaos run.
type run struct {
	cfg Config
	rep *Report
	tl  *timeline
	// failAt is the first call of the smallest failing key history, on
	// the driver's clock.
	failAt time.Duration
	logDir string

	broker *proc
	paysim *proc
	// pg is billing's own cluster (PGRestarts); pgProxy and kafkaProxy
	// stand between billing and PostgreSQL and Kafka (NetCuts).
	pg                  *pgtemp.Cluster
	pgProxy, kafkaProxy *faultproxy.Proxy
	// billingDB is billing's database as the harness reaches it (never
	// through a proxy); brokers likewise for Kafka.
	billingDB string
	// walSlot is billing's slot (and publication) with OutboxWAL, and
	// walSlot+"_audit" the harness's; walMark is the WAL position billing's
	// slot must have confirmed for the relay to owe nothing (see walBehind).
	walSlot string
	walMark string
	brokers []string
	// natsURL is the nats-server child's (Config.Broker nats), else "".
	natsURL   string
	pgLog     *os.File
	instances []*proc
	drv       *driver
	scr       *scraper
	mem       *memSampler
	hc        *http.Client

	vmu        sync.Mutex
	violations []Violation

	kills, terms, unclean, restarts, brokerRestarts atomic.Int64
	// relayKills: kills aimed at the WAL outbox relay's reader.
	relayKills                                     atomic.Int64
	pgRestarts, netCuts, netCutConns, startRetries atomic.Int64
	selfExits, selfRestarts                        atomic.Int64
	progress                                       *progress

	// fp arms the failpoints of one instance (Config.Failpoints); nil
	// without.
	fp *failpoints
	// migrated is set once billing's schema exists (the first instance
	// is up).
	migrated atomic.Bool
	// instMu serialises stopping and starting instances between the chaos
	// lane and the supervisor that restarts instances that died on their
	// own.
	instMu sync.Mutex
	// supCtx ends the supervisor's restarts; closing refuses new ones.
	supCtx    context.Context
	supCancel context.CancelFunc
	supMu     sync.Mutex
	supWG     sync.WaitGroup
	closing   bool
	runID     string
}

// Run starts the children, drives the load while killing and restarting
// them, waits for quiescence and audits. The error is for a run that could
// not be carried out (a child that does not start); violations are in the
// report (Pass false). ctx cancels the run; children are stopped on return.
func Run(ctx context.Context, cfg *Config) (*Report, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	r := &run{cfg: c, rep: &Report{
		Seed: c.Seed, Unsafe: c.Unsafe, Orders: c.Orders, Payments: c.Payments,
		Instances: c.Instances, DropRate: c.DropRate, FailRate: c.FailRate,
		ProduceFailRate: c.ProduceFailRate, DeclineRate: c.DeclineRate, Broker: c.brokerName(),
		Config: runConfig(&c),
	}}
	tempWork := c.WorkDir == ""
	if tempWork {
		d, err := os.MkdirTemp("", "billing-chaos-")
		if err != nil {
			return nil, fmt.Errorf("chaos: %w", err)
		}
		r.cfg.WorkDir = d
	}
	r.logDir = filepath.Join(r.cfg.WorkDir, "logs")
	if err := os.MkdirAll(r.logDir, 0o755); err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	r.hc = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
	defer r.hc.CloseIdleConnections()
	r.scr = newScraper(r.hc)
	r.mem = newMemSampler()
	r.tl = newTimeline()
	r.progress = newProgress(c.Progress, c.ProgressTTY)
	r.supCtx, r.supCancel = context.WithCancel(ctx)
	defer r.supCancel()

	err := r.execute(ctx)
	r.stopAll()
	r.rep.Violations = r.violations
	if r.rep.Violations == nil {
		r.rep.Violations = []Violation{}
	}
	if r.drv != nil {
		r.rep.Timeline = r.tl.build(r.drv)
		r.placeViolations()
	}
	r.rep.Pass = err == nil && len(r.violations) == 0
	switch {
	case tempWork && r.rep.Pass:
		_ = os.RemoveAll(r.cfg.WorkDir)
	case !r.rep.Pass:
		// Kept for the post-mortem: the children's logs, the broker's data.
		r.rep.WorkDir = r.cfg.WorkDir
	}
	return r.rep, err
}

func (r *run) violation(v Violation) {
	v.At = r.tl.since().Seconds()
	r.vmu.Lock()
	r.violations = append(r.violations, v)
	r.vmu.Unlock()
}

func (r *run) execute(ctx context.Context) error {
	c := &r.cfg
	var b [4]byte
	_, _ = rand.Read(b[:])
	runID := "chaos" + hex.EncodeToString(b[:])
	r.runID = runID

	instanceDB, err := r.setupDatabase(ctx)
	if err != nil {
		return err
	}
	if c.OutboxMode == OutboxWAL {
		if err := r.setupWAL(ctx); err != nil {
			return err
		}
	}
	brokers := c.KafkaBrokers
	if c.Broker == BrokerNATS {
		if r.natsURL, err = r.startNATS(ctx); err != nil {
			return err
		}
	} else if brokers == "" {
		port, err := freePort()
		if err != nil {
			return err
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		args := []string{"devkafka", "--data-dir", filepath.Join(c.WorkDir, "kafka"), "--port", strconv.Itoa(port), "--partitions", "3"}
		brokers = addr
		if c.NetCuts > 0 {
			// Every client, billing's and the audit's, is seeded with the
			// proxy and told by the broker's metadata to stay on it.
			if r.kafkaProxy, err = faultproxy.Listen("127.0.0.1:0", addr); err != nil {
				return err
			}
			args = append(args, "--advertise", r.kafkaProxy.Addr())
			brokers = r.kafkaProxy.Addr()
		}
		if c.ProduceFailRate > 0 {
			args = append(args, "--produce-fail-rate", strconv.FormatFloat(c.ProduceFailRate, 'f', -1, 64),
				"--produce-fail-seed", strconv.FormatInt(c.Seed, 10))
		}
		r.broker, err = newProc("devkafka", c.IdemBin, args, []string{disarmed}, addr, r.logDir, tcpReady(addr))
		if err != nil {
			return err
		}
		r.progress.logf("starting devkafka on %s (brokers for billing: %s, produce failures %.0f%%)", addr, brokers, c.ProduceFailRate*100)
		if err := r.broker.start(ctx); err != nil {
			return err
		}
	}
	r.brokers = strings.Split(brokers, ",")

	port, err := freePort()
	if err != nil {
		return err
	}
	paddr := "127.0.0.1:" + strconv.Itoa(port)
	r.paysim, err = newProc("paysim", c.IdemBin,
		[]string{"paysim",
			"--drop-rate", strconv.FormatFloat(c.DropRate, 'f', -1, 64),
			"--fail-rate", strconv.FormatFloat(c.FailRate, 'f', -1, 64),
			"--decline-rate", strconv.FormatFloat(c.DeclineRate, 'f', -1, 64),
			"--seed", strconv.FormatInt(c.Seed, 10)},
		// paysim is the ground truth: never armed, whatever the harness's
		// own environment says.
		[]string{"PAYSIM_ADDR=" + paddr, "DATABASE_URL=" + c.DatabaseURL, disarmed}, paddr, r.logDir,
		httpReady(r.hc, "http://"+paddr+"/ledger"))
	if err != nil {
		return err
	}
	r.progress.logf("starting paysim on %s (drop %.0f%%, fail %.0f%%, decline %.0f%%)", paddr, c.DropRate*100, c.FailRate*100, c.DeclineRate*100)
	if err := r.paysim.start(ctx); err != nil {
		return err
	}

	for i := range c.Instances {
		port, err := freePort()
		if err != nil {
			return err
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		env := []string{
			"DATABASE_URL=" + instanceDB,
			"KAFKA_BROKERS=" + brokers,
			"PAYMENT_URL=http://" + paddr,
			"HTTP_ADDR=" + addr,
			"SHUTDOWN_TIMEOUT=" + c.ShutdownTimeout.String(),
			"BILLING_API_TOKENS=" + c.Token + ":" + PrincipalDefault,
			"KAFKA_SESSION_TIMEOUT=" + c.SessionTimeout.String(),
			"KAFKA_HEARTBEAT_INTERVAL=" + (c.SessionTimeout / 6).String(),
			"KAFKA_REBALANCE_TIMEOUT=" + c.SessionTimeout.String(),
			// On NATS, a killed instance's messages come back after the
			// AckWait: the session timeout's counterpart.
			"NATS_ACK_WAIT=" + c.SessionTimeout.String(),
			// The rows of a relay SIGKILLed mid-batch come back after this,
			// not after the minute a production lease waits.
			"OUTBOX_LEASE_TTL=" + outboxLeaseTTL(c.ShutdownTimeout).String(),
			"BILLING_DATA_LAYER=" + c.DataLayer,
		}
		if c.Unsafe != "" && c.Unsafe != UnsafeKey {
			env = append(env, "BILLING_UNSAFE="+c.Unsafe)
		}
		if c.OutboxMode == OutboxWAL {
			env = append(env, "OUTBOX_MODE=wal", "OUTBOX_SLOT="+r.walSlot)
		}
		if c.Broker == BrokerNATS {
			env = append(env, "BROKER=nats", "NATS_URL="+r.natsURL)
		}
		env = append(env, c.Env...)
		p, err := newProc(fmt.Sprintf("billing-%d", i+1), c.BillingBin, []string{"serve"}, env, addr, r.logDir,
			httpReady(r.hc, "http://"+addr+"/readyz"))
		if err != nil {
			return err
		}
		p.moreEnv = func() []string { return r.armEnv(p) }
		p.onCrash = r.crashed
		p.out.onMarker = func(line string) {
			if r.fp != nil && r.fp.hit(line) {
				r.tl.mark("failpoint", p.name+": "+strings.TrimPrefix(line, markerPrefix))
				r.progress.logf("%s: %s", p.name, strings.TrimPrefix(line, markerPrefix))
			}
		}
		r.instances = append(r.instances, p)
	}
	if c.Failpoints {
		h := r.instances[uint64(c.Seed)%uint64(len(r.instances))]
		if c.OutboxMode == OutboxWAL {
			// One instance reads the slot at a time, the first to start
			// (the others wait as standbys): only it reaches the relay's
			// windows, until a kill hands the slot over.
			h = r.instances[0]
		}
		r.fp = newFailpoints(c.FailpointHits, h, c.FailpointWindows, c.FailpointOdds)
		r.progress.logf("failpoints: %s is armed (kill at %s until hit %d times)", h.name, strings.Join(r.fp.windows, ", "), c.FailpointHits)
	}
	// One at a time: the first applies the migrations and creates the
	// topics, the others find them done.
	for _, p := range r.instances {
		r.progress.logf("starting %s on %s", p.name, p.addr)
		if err := r.startInstance(ctx, p); err != nil {
			return err
		}
		r.migrated.Store(true)
	}

	r.drv = newDriver(c, runID, r.instances, r.violation)
	defer r.drv.close()
	total := int64(2 * (c.Orders + c.Payments))
	r.progress.start(total, r)

	scrapeCtx, stopScrape := context.WithCancel(ctx)
	var bg sync.WaitGroup
	bg.Add(1)
	go func() {
		defer bg.Done()
		r.scrapeLoop(scrapeCtx)
	}()
	defer func() {
		stopScrape()
		bg.Wait()
	}()

	loadDone := make(chan struct{})
	chaosErr := make(chan error, 1)
	go func() { chaosErr <- r.chaos(ctx, total, loadDone) }()

	start := time.Now()
	r.tl.mu.Lock()
	r.tl.load[0] = r.tl.since()
	r.tl.mu.Unlock()
	r.drv.run(ctx)
	r.rep.LoadSeconds = time.Since(start).Seconds()
	r.tl.mu.Lock()
	r.tl.load[1] = r.tl.since()
	r.tl.mu.Unlock()
	close(loadDone)
	if err := <-chaosErr; err != nil {
		r.progress.stop()
		return err
	}
	if err := ctx.Err(); err != nil {
		r.progress.stop()
		return err
	}
	r.progress.phase("quiescence")
	if r.fp != nil {
		// The holder's later incarnations start disarmed: quiescence waits
		// for the system to settle, and the audit reads a still ledger.
		r.fp.stopArming()
	}
	qstart := time.Now()
	statuses, err := r.quiesce(ctx)
	r.rep.QuiescenceSeconds = time.Since(qstart).Seconds()
	r.tl.mu.Lock()
	r.tl.quiet = r.tl.since()
	r.tl.mu.Unlock()
	r.progress.stop()
	if err != nil {
		return err
	}
	// Last scrape of the live incarnations.
	for _, p := range r.instances {
		r.scr.scrape(ctx, p, "/metrics")
		r.mem.sample(p)
	}
	r.scr.scrape(ctx, r.paysim, "/metrics")
	r.fillReport()
	r.checkHistory(ctx)
	return r.audit(ctx, statuses)
}

// checkHistory runs the model-based audit over the driver's history; a
// key whose history is not linearizable is a violation, and porcupine's
// visualization of the smallest one goes to the work directory.
func (r *run) checkHistory(ctx context.Context) {
	lin := checkLinearizable(ctx, r.drv.hist.snapshot())
	r.rep.Linearizability = &lin
	r.rep.Linearizable = lin.Verdict
	if lin.Verdict == "yes" {
		return
	}
	if lin.Verdict == "unknown" {
		r.violation(Violation{Kind: "not-linearizable", Subject: "history", Detail: "the linearizability check did not finish on every key"})
		return
	}
	if len(lin.Failing) > 0 {
		r.failAt = time.Duration(lin.Failing[0].Call)
	}
	if len(lin.HTML) > 0 {
		path := filepath.Join(r.cfg.WorkDir, "linearizability.html")
		if err := os.WriteFile(path, lin.HTML, 0o644); err == nil {
			r.rep.Linearizability.HTMLPath = path
		}
	}
	r.violation(Violation{Kind: "not-linearizable", Subject: "key " + lin.FailingKey,
		Detail: fmt.Sprintf("%d of %d keys have no linearization in the Idempotency-Key model; the smallest: %s",
			lin.FailingKeys, lin.Keys, strings.Join(describeHistory(lin.Failing), "; "))})
}

func (r *run) scrapeLoop(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var lags *lagSampler
	if r.natsURL == "" {
		lags = newLagSampler(r.brokers)
		defer lags.close()
	}
	for {
		for _, p := range r.instances {
			if p.isUp() {
				r.scr.scrape(ctx, p, "/metrics")
			}
			// Starting or up: its memory counts either way.
			r.mem.sample(p)
		}
		if r.paysim != nil {
			r.scr.scrape(ctx, r.paysim, "/metrics")
		}
		r.sampleNow(ctx, lags)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

type event struct {
	at   int64
	kind string // "kill", "term", "broker", "pg", "net"
}

// chaos executes the seeded schedule: each event fires when the driver has
// answered a random share (10%..85%) of the POSTs; events left when the
// load ends fire at once, while billing is still draining its backlog.
//
// Two lanes run side by side: billing instances (kills and terms) and the
// infrastructure (broker restarts, PostgreSQL crashes, network cuts). In
// each lane events run one after another, so at most one billing instance
// is down at a time and the others keep serving, and at most one
// infrastructure fault is in progress; an instance may be restarting while
// the database is down, as in production, and then retries its start.
func (r *run) chaos(ctx context.Context, total int64, loadDone <-chan struct{}) error {
	c := &r.cfg
	rng := mrand.New(mrand.NewPCG(uint64(c.Seed), 0xc4a05))
	var inst, infra []event
	add := func(lane *[]event, n int, kind string) {
		for range n {
			at := int64(float64(total) * (0.10 + 0.75*rng.Float64()))
			*lane = append(*lane, event{at: at, kind: kind})
		}
	}
	add(&inst, c.Kills, "kill")
	add(&inst, c.Terms, "term")
	add(&infra, c.BrokerRestarts, "broker")
	add(&infra, c.PGRestarts, "pg")
	add(&infra, c.NetCuts, "net")
	errs := make(chan error, 2)
	// The instance lane goes on with the schedule's generator: a seed
	// without infrastructure faults then picks the same victims at the
	// same moments as before the lanes existed, which the counterfactual
	// tests' seeds rely on.
	go func() {
		errs <- r.lane(ctx, inst, rng, loadDone, r.instanceEvent)
	}()
	go func() {
		errs <- r.lane(ctx, infra, mrand.New(mrand.NewPCG(uint64(c.Seed), 0x1a7e2)), loadDone, r.infraEvent)
	}()
	return errors.Join(<-errs, <-errs)
}

// lane fires evs in order of their moment with fire.
func (r *run) lane(ctx context.Context, evs []event, rng *mrand.Rand, loadDone <-chan struct{}, fire func(context.Context, event, *mrand.Rand) error) error {
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].at < evs[j].at })
	for _, ev := range evs {
		for r.drv.ops.Load() < ev.at {
			select {
			case <-loadDone:
			case <-ctx.Done():
				return nil
			case <-time.After(20 * time.Millisecond):
				continue
			}
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		if err := fire(ctx, ev, rng); err != nil {
			return err
		}
	}
	return nil
}

func (r *run) instanceEvent(ctx context.Context, ev event, rng *mrand.Rand) error {
	c := &r.cfg
	first := rng.IntN(len(r.instances))
	// With the WAL outbox a kill goes to the instance whose relay reads
	// the slot, when one does: the standby's takeover is what it tests.
	holderPID := 0
	if c.OutboxMode == OutboxWAL && ev.kind == "kill" {
		holderPID = r.walHolderPID(ctx)
	}
	r.instMu.Lock()
	defer r.instMu.Unlock()
	// The victim is a live instance: one that exited on its own is the
	// supervisor's to restart, and stopping it again would count a kill or
	// an unclean stop that never happened. The draw stays the same whatever
	// is down, so a seed without such exits replays its schedule.
	var p *proc
	for i := range r.instances {
		if q := r.instances[(first+i)%len(r.instances)]; q.isUp() {
			p = q
			break
		}
	}
	if p == nil {
		r.progress.logf("chaos: no instance is up for a %s; skipped", ev.kind)
		return nil
	}
	if holderPID != 0 {
		for _, q := range r.instances {
			if q.isUp() && q.pid() == holderPID {
				p = q
				r.relayKills.Add(1)
				r.progress.logf("%s reads billing's WAL outbox slot", p.name)
				break
			}
		}
	}
	r.scr.scrape(ctx, p, "/metrics")
	r.scr.freeze(p)
	// The incarnation's last memory sample: VmHWM is its high-water mark
	// so far, and a SIGKILLed process leaves nothing to read afterwards.
	r.mem.sample(p)
	if ev.kind == "kill" {
		r.progress.logf("%s: SIGKILL", p.name)
		p.stop(syscall.SIGKILL, 30*time.Second)
		r.kills.Add(1)
		r.tl.mark("kill", p.name+": SIGKILL")
	} else {
		r.progress.logf("%s: SIGTERM", p.name)
		code, forced := p.stop(syscall.SIGTERM, c.ShutdownTimeout+5*time.Second)
		r.terms.Add(1)
		if code == 0 && !forced {
			r.tl.mark("term", p.name+": SIGTERM, clean exit")
		}
		if code != 0 || forced {
			r.unclean.Add(1)
			r.tl.mark("term", fmt.Sprintf("%s: SIGTERM, unclean (exit %d, killed after grace: %v)", p.name, code, forced))
			r.progress.logf("%s: SIGTERM ended with exit %d (killed after grace: %v)", p.name, code, forced)
		}
	}
	sleep(ctx, time.Duration(100+rng.IntN(700))*time.Millisecond)
	if err := r.startInstance(ctx, p); err != nil {
		return err
	}
	r.scr.thaw(p)
	r.restarts.Add(1)
	r.tl.mark("restart", p.name+": restarted")
	r.progress.logf("%s: restarted", p.name)
	return nil
}

func (r *run) infraEvent(ctx context.Context, ev event, rng *mrand.Rand) error {
	switch ev.kind {
	case "broker":
		sig := syscall.SIGKILL
		if r.brokerRestarts.Load()%2 == 1 {
			sig = syscall.SIGTERM
		}
		r.progress.logf("broker: %s and restart", signame(sig))
		r.broker.stop(sig, 30*time.Second)
		sleep(ctx, time.Duration(200+rng.IntN(600))*time.Millisecond)
		if err := r.broker.start(ctx); err != nil {
			return err
		}
		r.brokerRestarts.Add(1)
		r.tl.mark("broker", "broker: "+signame(sig)+" and restart")
	case "pg":
		r.progress.logf("postgres: pg_ctl stop -m immediate and restart")
		if err := r.pg.Restart(ctx, pgtemp.StopImmediate); err != nil {
			return fmt.Errorf("chaos: restart PostgreSQL: %w", err)
		}
		r.pgRestarts.Add(1)
		r.tl.mark("pg", "PostgreSQL: crashed (immediate stop) and restarted")
		r.progress.logf("postgres: restarted")
	case "net":
		// Every other cut comes after a stall: the connections hang first,
		// as over a partition, then are reset.
		var stall time.Duration
		if r.netCuts.Load()%2 == 1 {
			stall = time.Duration(300+rng.IntN(1700)) * time.Millisecond
			r.pgProxy.Stall(stall)
			r.kafkaProxy.Stall(stall)
			sleep(ctx, stall)
		}
		n := r.pgProxy.Cut() + r.kafkaProxy.Cut()
		r.netCuts.Add(1)
		r.netCutConns.Add(int64(n))
		r.tl.mark("net", fmt.Sprintf("network cut: %d connections reset (stall %v)", n, stall))
		if stall > 0 {
			r.progress.logf("network: reset %d connections to PostgreSQL and Kafka after a %v stall", n, stall)
		} else {
			r.progress.logf("network: reset %d connections to PostgreSQL and Kafka", n)
		}
	}
	sleep(ctx, time.Duration(200+rng.IntN(600))*time.Millisecond)
	return nil
}

// startInstance starts a billing instance, retrying when it exits during
// its start: an instance started while PostgreSQL is down or a cut drops
// its connection fails its migration or its first query and exits, and is
// started again, as a supervisor would. Every retry is counted.
func (r *run) startInstance(ctx context.Context, p *proc) error {
	var err error
	for attempt := range startAttempts {
		if attempt > 0 {
			r.startRetries.Add(1)
			r.progress.logf("%s: start failed (%v); retrying", p.name, err)
			if !sleep(ctx, time.Duration(attempt)*500*time.Millisecond) {
				return ctx.Err()
			}
		}
		if err = p.start(ctx); err == nil || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// disarmed is the environment entry that keeps a child's failpoints off
// whatever the harness's own environment holds.
const disarmed = failpoint.EnvVar + "="

// armEnv is a billing instance's failpoint environment for its next
// incarnation: the holder's armed windows, or disarmed.
func (r *run) armEnv(p *proc) []string {
	if r.fp == nil || p != r.fp.holder {
		return []string{disarmed}
	}
	if r.migrated.Load() && r.fp.wantsPurge() {
		tag := fmt.Sprintf("%s-%s-%d", r.runID, p.name, time.Now().UnixNano())
		if err := seedPurge(r.supCtx, r.billingDB, tag); err != nil {
			// The database may be down (PGRestarts): this incarnation then
			// has nothing to purge, a later one will.
			r.progress.logf("failpoints: %v", err)
		}
	}
	spec := r.fp.spec()
	if spec == "" {
		return []string{disarmed}
	}
	return []string{failpoint.EnvVar + "=" + spec}
}

// crashed is called when an instance exits on its own after it was ready:
// a failpoint's kill, or a crash. It is started again, as a supervisor
// would, within a second (as the chaos lane restarts its victims): the
// load goes on, and an armed holder must live again soon for every window
// to be hit while there is load to reach it.
func (r *run) crashed(p *proc) {
	r.supMu.Lock()
	if r.closing {
		r.supMu.Unlock()
		return
	}
	r.supWG.Add(1)
	r.supMu.Unlock()
	r.selfExits.Add(1)
	r.tl.mark("exit", p.name+": exited on its own")
	p.mu.Lock()
	gen := p.starts
	p.mu.Unlock()
	go func() {
		defer r.supWG.Done()
		ctx := r.supCtx
		wait := time.Duration(200+mrand.IntN(600)) * time.Millisecond
		r.progress.logf("%s: exited on its own; restarting after %v", p.name, wait)
		if !sleep(ctx, wait) {
			return
		}
		r.instMu.Lock()
		defer r.instMu.Unlock()
		p.mu.Lock()
		same := p.starts == gen
		p.mu.Unlock()
		// The chaos lane may have restarted it meanwhile.
		if ctx.Err() != nil || !same {
			return
		}
		p.forget()
		if err := r.startInstance(ctx, p); err != nil {
			if ctx.Err() == nil {
				r.violation(Violation{Kind: "instance-down", Subject: p.name, Detail: fmt.Sprintf("could not be restarted after it exited: %v", err)})
			}
			return
		}
		r.selfRestarts.Add(1)
		r.progress.logf("%s: restarted", p.name)
	}()
}

// startAttempts bounds startInstance: an instance that cannot start this
// many times in a row is a failed run, not a fault to ride out.
const startAttempts = 8

// setupDatabase gives billing its database: a throwaway cluster of its own
// when PostgreSQL is to be crashed, else DatabaseURL. It returns the URL
// the instances get (through the fault proxy with NetCuts) and sets
// r.billingDB to the direct one, for the audit.
func (r *run) setupDatabase(ctx context.Context) (string, error) {
	c := &r.cfg
	r.billingDB = c.DatabaseURL
	if c.PGRestarts > 0 {
		f, err := os.OpenFile(filepath.Join(r.logDir, "postgres.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return "", fmt.Errorf("chaos: %w", err)
		}
		r.pgLog = f
		r.progress.logf("starting a throwaway PostgreSQL cluster for billing")
		var settings []string
		if c.OutboxMode == OutboxWAL {
			settings = []string{"wal_level=logical", "max_replication_slots=16", "max_wal_senders=16"}
		}
		if r.pg, err = pgtemp.Start(ctx, &pgtemp.Config{Log: f, Settings: settings}); err != nil {
			return "", err
		}
		r.billingDB = r.pg.URL
	}
	if c.NetCuts == 0 {
		return r.billingDB, nil
	}
	u, err := url.Parse(r.billingDB)
	if err != nil {
		return "", fmt.Errorf("chaos: database URL: %w", err)
	}
	target := u.Host
	if u.Port() == "" {
		target = net.JoinHostPort(u.Hostname(), "5432")
	}
	if r.pgProxy, err = faultproxy.Listen("127.0.0.1:0", target); err != nil {
		return "", err
	}
	u.Host = r.pgProxy.Addr()
	r.progress.logf("billing reaches PostgreSQL through %s", r.pgProxy.Addr())
	return u.String(), nil
}

// quiesce waits until every confirmed order and accepted payment is
// CHARGED or FAILED, then until the system is idle, then watches the
// ledger: see settle.
func (r *run) quiesce(ctx context.Context) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Quiescence)
	defer cancel()
	d := r.drv
	d.mu.Lock()
	var paths []string
	for _, o := range d.orders {
		if o.Confirmed {
			paths = append(paths, "/orders/"+o.ID)
		}
	}
	for _, p := range d.payments {
		paths = append(paths, "/payments/"+p.ID)
	}
	d.mu.Unlock()
	statuses := map[string]string{}
	pending := paths
	rng := mrand.New(mrand.NewPCG(uint64(r.cfg.Seed), 0x9e7))
	for len(pending) > 0 {
		r.progress.setPending(len(pending))
		var next []string
		var mu sync.Mutex
		var wg sync.WaitGroup
		sem := make(chan struct{}, 8)
		for _, p := range pending {
			wg.Add(1)
			sem <- struct{}{}
			go func(p string, seed uint64) {
				defer wg.Done()
				defer func() { <-sem }()
				var res struct {
					Status string `json:"status"`
				}
				err := d.get(ctx, mrand.New(mrand.NewPCG(seed, 2)), p, &res)
				mu.Lock()
				defer mu.Unlock()
				statuses[p] = res.Status
				if err != nil || (res.Status != "CHARGED" && res.Status != "FAILED") {
					next = append(next, p)
				}
			}(p, rng.Uint64())
		}
		wg.Wait()
		pending = next
		if len(pending) > 0 && !sleep(ctx, 500*time.Millisecond) {
			break
		}
	}
	r.progress.setPending(len(pending))
	if why := r.settle(ctx); why != "" && len(pending) == 0 {
		// Every status is final, yet something is still in flight or the
		// ledger kept changing: whatever it is can still act after the
		// audit, so the audit cannot vouch for the run.
		r.violation(Violation{Kind: "not-idle", Subject: "quiescence",
			Detail: fmt.Sprintf("every status final, but the system did not stay idle for a %.1fs watch of the ledger within %v: %s", r.rep.LedgerWatchSeconds, r.cfg.Quiescence, why)})
	}
	return statuses, nil
}

// settle waits until nothing is left in flight anywhere billing could
// still act from, then watches the ledger for longer than the longest
// redelivery timer of the run's configuration (Config.ledgerWatch); a
// ledger that changes meanwhile starts the wait over. Idle means: the
// outbox has no PENDING or PUBLISHING row (the Kafka audit reads the topics
// next; an event still owed would be reported lost), both consumer groups
// have committed every record of their topic (no lag: a record still
// uncommitted will be redelivered), and no idempotency claim holds a live
// lease (a request still running may act). A final status alone proves
// none of this: a duplicate made by a late redelivery lands after it.
//
// It returns "" once the ledger stayed still for the whole watch, else what
// was still going on when ctx ended.
func (r *run) settle(ctx context.Context) string {
	watch, longest := r.cfg.ledgerWatch()
	r.rep.LedgerWatchSeconds = watch.Seconds()
	r.rep.LongestTimer = fmt.Sprintf("%s %v", longest.name, longest.d)
	last := "never checked"
	for ctx.Err() == nil {
		for ctx.Err() == nil {
			why, err := r.busy(ctx)
			if err == nil && why == "" {
				break
			}
			if err != nil {
				why = "checking: " + err.Error()
			}
			last = why
			r.progress.setBusy(why, nil)
			sleep(ctx, 500*time.Millisecond)
		}
		if ctx.Err() != nil {
			break
		}
		before, err := r.ledger(ctx)
		if err != nil {
			sleep(ctx, 500*time.Millisecond)
			continue
		}
		r.progress.setBusy(fmt.Sprintf("idle; watching the ledger for %v", watch.Truncate(100*time.Millisecond)), nil)
		still := true
		end := time.Now().Add(watch)
		for still && time.Now().Before(end) && sleep(ctx, 500*time.Millisecond) {
			l, err := r.ledger(ctx)
			if err == nil && (len(l.Charges) != len(before.Charges) || len(l.Declines) != len(before.Declines)) {
				still = false
				r.rep.LedgerLateChanges++
				last = fmt.Sprintf("the ledger changed while the system was idle (%d charges, %d declines; was %d, %d)",
					len(l.Charges), len(l.Declines), len(before.Charges), len(before.Declines))
				r.progress.logf("quiescence: %s: waiting again", last)
			}
		}
		if still && ctx.Err() == nil {
			return ""
		}
		if still {
			last = "the ledger watch was cut short"
		}
	}
	return last
}

// busy says what is still in flight ("" for nothing).
func (r *run) busy(ctx context.Context) (string, error) {
	ob, leases, err := inFlight(ctx, r.billingDB)
	if err != nil {
		return "", err
	}
	if r.cfg.OutboxMode == OutboxWAL {
		if behind, err := r.walBehind(ctx); err != nil {
			return "", err
		} else if behind != "" {
			return behind, nil
		}
	}
	if ob > 0 {
		return fmt.Sprintf("%d outbox events unpublished", ob), nil
	}
	if leases > 0 {
		return fmt.Sprintf("%d idempotency claims with a live lease", leases), nil
	}
	var lag string
	if r.natsURL != "" {
		lag, err = natsLag(ctx, r.natsURL)
	} else {
		lag, err = consumerLag(ctx, r.brokers)
	}
	if err != nil {
		return "", err
	}
	if lag != "" {
		return lag, nil
	}
	return "", nil
}

// consumerLag says which of billing's consumer groups has records it has
// not committed ("" when none), from the group's committed offsets and the
// topics' end offsets read from the broker.
func consumerLag(ctx context.Context, brokers []string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return "", err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	groups := []struct{ group, topic string }{
		{consumer.OrderGroup, usecase.TopicOrderEvents},
		{consumer.ChargeGroupDefault, usecase.TopicBillingCommands},
	}
	var lagging []string
	for _, g := range groups {
		ends, err := adm.ListEndOffsets(ctx, g.topic)
		if err != nil {
			return "", err
		}
		if err := ends.Error(); err != nil {
			return "", err
		}
		offs, err := adm.FetchOffsets(ctx, g.group)
		if err != nil {
			return "", err
		}
		var lag int64
		ends.Each(func(o kadm.ListedOffset) {
			var at int64
			if c, ok := offs.Lookup(o.Topic, o.Partition); ok && c.Err == nil && c.At > 0 {
				at = c.At
			}
			lag += max(o.Offset-at, 0)
		})
		if lag > 0 {
			lagging = append(lagging, fmt.Sprintf("%s %d behind on %s", g.group, lag, g.topic))
		}
	}
	return strings.Join(lagging, ", "), nil
}

// ledger reads paysim's whole ledger.
func (r *run) ledger(ctx context.Context) (ledger, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.paysim.addr+"/ledger", nil)
	if err != nil {
		return ledger{}, err
	}
	resp, err := r.hc.Do(req)
	if err != nil {
		return ledger{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return ledger{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return ledger{}, fmt.Errorf("chaos: GET /ledger: %d %s", resp.StatusCode, clip(b))
	}
	var l ledger
	if err := json.Unmarshal(b, &l); err != nil {
		return ledger{}, fmt.Errorf("chaos: GET /ledger: %w", err)
	}
	return l, nil
}

func (r *run) fillReport() {
	d, rep := r.drv, r.rep
	rep.Operations = d.ops.Load()
	rep.Requests = d.requests.Load()
	rep.ClientRetries = d.retries.Load()
	rep.ClientDrops = d.clientDrops.Load()
	rep.Duplicates = d.duplicates.Load()
	rep.TransportErrors = d.transportErr.Load()
	rep.Status5xx = d.status5xx.Load()
	rep.Kills = int(r.kills.Load())
	rep.RelayKills = int(r.relayKills.Load())
	rep.Terms = int(r.terms.Load())
	rep.UncleanTerms = int(r.unclean.Load())
	rep.Restarts = int(r.restarts.Load())
	rep.BrokerRestarts = int(r.brokerRestarts.Load())
	rep.PGRestarts = int(r.pgRestarts.Load())
	rep.NetCuts = int(r.netCuts.Load())
	rep.NetCutConns = int(r.netCutConns.Load())
	rep.StartRetries = int(r.startRetries.Load())
	rep.SelfExits = int(r.selfExits.Load())
	rep.SelfRestarts = int(r.selfRestarts.Load())
	rep.Memory = r.mem.report()
	if r.fp != nil {
		rep.Failpoints = r.fp.report()
	}
	rep.Stopped.HTTPReplays = d.replays.Load()
	rep.Stopped.HTTPInProgress = d.inProgress.Load()
	rep.Stopped.Fingerprint = d.reuseRejected.Load()
	rep.Stopped.FingerprintProbes = d.reuseProbes.Load()
	rep.Stopped.Provider = -1
	rep.Stopped.HTTPServerReplays, rep.Stopped.Inbox = r.scr.serverCounters()
	switch {
	case r.scr.has(MetricPaysimReplays):
		rep.Stopped.Provider = int64(r.scr.total(MetricPaysimReplays))
	case r.scr.has(MetricProviderReplays):
		rep.Stopped.Provider = int64(r.scr.total(MetricProviderReplays))
	case r.scr.has(MetricCharges, `outcome="replayed"`):
		rep.Stopped.Provider = int64(r.scr.total(MetricCharges, `outcome="replayed"`))
	}
	d.mu.Lock()
	rep.LatencyP50Ms = percentile(d.latencies, 0.50)
	rep.LatencyP99Ms = percentile(d.latencies, 0.99)
	d.mu.Unlock()
}

// audit checks the ledger against what the driver was promised, and the
// topics against the outbox.
func (r *run) audit(ctx context.Context, statuses map[string]string) error {
	l, err := r.ledger(ctx)
	if err != nil {
		return err
	}
	var rows []outboxRow
	if r.cfg.OutboxMode == OutboxWAL {
		rows, err = r.loadWALOutbox(ctx)
	} else {
		rows, err = loadOutbox(ctx, r.billingDB)
	}
	if err != nil {
		return err
	}
	exp := r.drv.expected(statuses)
	keys := commandKeys(rows)
	for i := range exp {
		// A target with no command gets an empty, non-nil list: any key
		// on its charge is then wrong.
		exp[i].keys = append([]string{}, keys[exp[i].what]...)
	}
	res := check(exp, l)
	r.rep.LedgerCharges, r.rep.LedgerDeclines = len(l.Charges), len(l.Declines)
	r.rep.ConfirmedOrders, r.rep.AcceptedPayments = res.orders, res.payments
	r.rep.Charged, r.rep.Failed = res.charged, res.failed
	for _, v := range res.violations {
		r.violation(v)
	}
	return r.auditKafka(ctx, rows)
}

// commandKeys maps "order ID" and "payment ID" to the idempotency keys of
// the ChargeRequested commands billing's outbox holds for that target.
func commandKeys(rows []outboxRow) map[string][]string {
	out := map[string][]string{}
	for _, row := range rows {
		if row.EventType != usecase.EventChargeRequested {
			continue
		}
		var c struct {
			Target         string `json:"target"`
			TargetID       string `json:"target_id"`
			IdempotencyKey string `json:"idempotency_key"`
		}
		if json.Unmarshal(row.Payload, &c) != nil {
			continue
		}
		out[c.Target+" "+c.TargetID] = append(out[c.Target+" "+c.TargetID], c.IdempotencyKey)
	}
	return out
}

// auditKafka checks every outbox event against the topics (checkKafka).
// The outbox table is complete: billing's relay keeps PUBLISHED rows for
// outbox.RetentionDefault (7 days) before purging them, far longer than a
// run.
func (r *run) auditKafka(ctx context.Context, rows []outboxRow) error {
	seen := map[string]bool{}
	var topics []string
	for _, row := range rows {
		if !seen[row.Topic] {
			seen[row.Topic] = true
			topics = append(topics, row.Topic)
		}
	}
	sort.Strings(topics)
	var recs []wireRecord
	var err error
	if r.natsURL != "" {
		recs, err = readStreams(ctx, r.natsURL, topics)
	} else {
		recs, err = readTopics(ctx, r.brokers, topics)
	}
	if err != nil {
		return err
	}
	res := checkKafka(rows, recs)
	r.rep.KafkaEvents, r.rep.KafkaAggregates = res.events, res.aggregates
	r.rep.KafkaRecords, r.rep.KafkaRedelivered, r.rep.KafkaRetried = res.records, res.redelivered, res.retried
	for _, v := range res.violations {
		r.violation(v)
	}
	return nil
}

func (r *run) stopAll() {
	// No restart may start a process after this: pending ones see
	// closing, the one in hand finishes under instMu first.
	r.supMu.Lock()
	r.closing = true
	r.supMu.Unlock()
	r.supCancel()
	r.supWG.Wait()
	r.instMu.Lock()
	defer r.instMu.Unlock()
	var wg sync.WaitGroup
	for _, p := range r.instances {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.close(r.cfg.ShutdownTimeout + 5*time.Second)
		}()
	}
	wg.Wait()
	if r.paysim != nil {
		r.paysim.close(10 * time.Second)
	}
	if r.broker != nil {
		r.broker.close(10 * time.Second)
	}
	for _, p := range []*faultproxy.Proxy{r.pgProxy, r.kafkaProxy} {
		if p != nil {
			_ = p.Close()
		}
	}
	if r.walSlot != "" {
		r.dropWAL()
	}
	if r.pg != nil {
		_ = r.pg.Close()
	}
	if r.pgLog != nil {
		_ = r.pgLog.Close()
	}
}

func signame(s syscall.Signal) string {
	if s == syscall.SIGKILL {
		return "SIGKILL"
	}
	return "SIGTERM"
}

// placeViolations points each violation at its moment on the timeline
// (momentOf).
func (r *run) placeViolations() {
	off := r.drv.hist.t0.Sub(r.tl.t0)
	first := map[string]time.Duration{}
	for _, op := range r.drv.hist.snapshot() {
		if d, ok := first[op.Key]; !ok || time.Duration(op.Call) < d {
			first[op.Key] = time.Duration(op.Call)
		}
	}
	for k, d := range first {
		first[k] = d + off
	}
	r.drv.mu.Lock()
	created := make(map[string]time.Duration, len(r.drv.createdAt))
	for k, d := range r.drv.createdAt {
		created[k] = d + off
	}
	r.drv.mu.Unlock()
	for i := range r.rep.Violations {
		v := &r.rep.Violations[i]
		if v.Kind == "not-linearizable" && r.failAt > 0 {
			v.At = (r.failAt + off).Seconds()
			continue
		}
		v.At = momentOf(*v, created, first, time.Duration(v.At*float64(time.Second)))
	}
}
