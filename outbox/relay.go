package outbox

import (
	"cmp"
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/outbox/internal/dbsqlc"
)

// Mode selects how the relay publishes.
type Mode int

const (
	// AtLeastOnce claims a batch with FOR UPDATE SKIP LOCKED inside a
	// transaction, publishes, marks the batch and commits: the seed
	// article's first variant. A crash after the publish and before the
	// commit republishes the batch; consumers deduplicate by event id.
	// The transaction (and a pooled connection) is held for the publish.
	AtLeastOnce Mode = iota
	// TwoPhase moves the batch PENDING → PUBLISHING under a lease (owner,
	// token, locked_at) in its own short transaction, publishes with no
	// transaction open, then marks PUBLISHED guarded by the token. A crash
	// leaves PUBLISHING rows that the reaper returns to PENDING after
	// LeaseTTL. Still at-least-once on the wire (the crash may follow the
	// produce), but no transaction spans the publish.
	TwoPhase
)

func (m Mode) String() string {
	switch m {
	case AtLeastOnce:
		return "at-least-once"
	case TwoPhase:
		return "two-phase"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// NotifyChannel is the channel the migration's trigger notifies on every
// INSERT into outbox_event, and the relay LISTENs on.
const NotifyChannel = "idem_outbox"

// Defaults of RelayConfig.
const (
	BatchSizeDefault      = 500
	BatchTimeoutDefault   = 10 * time.Second
	PollIntervalDefault   = time.Second
	LeaseTTLDefault       = 60 * time.Second
	ReapIntervalDefault   = 5 * time.Second
	MaxAttemptsDefault    = 10
	BackoffMinDefault     = time.Second
	BackoffMaxDefault     = 5 * time.Minute
	RetentionDefault      = 7 * 24 * time.Hour
	PurgeIntervalDefault  = time.Minute
	PurgeBatchSizeDefault = 1000
)

// RelayConfig configures a Relay. The zero value means all defaults.
type RelayConfig struct {
	// Mode is AtLeastOnce or TwoPhase. Defaults to AtLeastOnce.
	Mode Mode
	// BatchSize is the most events claimed and published per batch.
	// Defaults to BatchSizeDefault (500).
	BatchSize int
	// BatchTimeout bounds one batch — claim, publish and mark share one
	// context.WithTimeout(context.WithoutCancel(ctx), BatchTimeout); the
	// publisher gets a child of it that ends a quarter early, which is kept
	// for recording the outcome.
	// Defaults to BatchTimeoutDefault (10s).
	BatchTimeout time.Duration
	// PollInterval is how long an idle relay waits when no NOTIFY comes.
	// Defaults to PollIntervalDefault (1s).
	PollInterval time.Duration
	// LeaseTTL is how old a PUBLISHING lease must be before the reaper
	// returns it to PENDING. Must exceed 2 × BatchTimeout, so that a live
	// relay's batch has timed out long before its lease can be reaped.
	// Defaults to LeaseTTLDefault (60s).
	LeaseTTL time.Duration
	// ReapInterval is how often the reaper runs. Defaults to
	// ReapIntervalDefault (5s).
	ReapInterval time.Duration
	// MaxAttempts is how many publish attempts an event gets before it is
	// DEAD. Defaults to MaxAttemptsDefault (10).
	MaxAttempts int
	// BackoffMin and BackoffMax bound the delay before a failed event is
	// retried: BackoffMin × 2^(attempts-1), capped, plus up to 20% jitter.
	// Default to BackoffMinDefault (1s) and BackoffMaxDefault (5m).
	BackoffMin time.Duration
	BackoffMax time.Duration
	// Retention is how long PUBLISHED rows are kept; a negative value
	// disables the purger. Defaults to RetentionDefault (7 days).
	Retention time.Duration
	// PurgeInterval is how often the purger runs. Defaults to
	// PurgeIntervalDefault (1m).
	PurgeInterval time.Duration
	// PurgeBatchSize is how many rows one purge statement deletes.
	// Defaults to PurgeBatchSizeDefault (1000).
	PurgeBatchSize int
	// DisableNotify turns off the LISTEN connection; the relay then only
	// polls. Defaults to false.
	DisableNotify bool
	// Owner names this relay in leases and in the listener's
	// application_name. Defaults to hostname-pid-random.
	Owner string
	// Logger receives batch errors and lease losses. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

func (c *RelayConfig) withDefaults() RelayConfig {
	var out RelayConfig
	if c != nil {
		out = *c
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if out.BatchSize == 0 {
		out.BatchSize = BatchSizeDefault
	}
	def(&out.BatchTimeout, BatchTimeoutDefault)
	def(&out.PollInterval, PollIntervalDefault)
	def(&out.LeaseTTL, LeaseTTLDefault)
	def(&out.ReapInterval, ReapIntervalDefault)
	def(&out.BackoffMin, BackoffMinDefault)
	def(&out.BackoffMax, BackoffMaxDefault)
	def(&out.Retention, RetentionDefault)
	def(&out.PurgeInterval, PurgeIntervalDefault)
	if out.MaxAttempts == 0 {
		out.MaxAttempts = MaxAttemptsDefault
	}
	if out.PurgeBatchSize == 0 {
		out.PurgeBatchSize = PurgeBatchSizeDefault
	}
	if out.Owner == "" {
		host, _ := os.Hostname()
		var b [3]byte
		_, _ = crand.Read(b[:])
		out.Owner = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out
}

func (c *RelayConfig) validate() error {
	bad := func(field, why string) error { return fmt.Errorf("%w: %s %s", ErrInvalidConfig, field, why) }
	switch {
	case c.Mode != AtLeastOnce && c.Mode != TwoPhase:
		return bad("Mode", "is neither AtLeastOnce nor TwoPhase")
	case c.BatchSize < 1 || c.BatchSize > 100_000:
		return bad("BatchSize", "must be in 1..100000")
	case c.BatchTimeout < 0:
		return bad("BatchTimeout", "must be positive")
	case c.PollInterval < 0:
		return bad("PollInterval", "must be positive")
	case c.LeaseTTL <= 2*c.BatchTimeout:
		return bad("LeaseTTL", "must exceed 2 × BatchTimeout")
	case c.ReapInterval < 0:
		return bad("ReapInterval", "must be positive")
	case c.MaxAttempts < 1:
		return bad("MaxAttempts", "must be at least 1")
	case c.BackoffMin < 0 || c.BackoffMax < c.BackoffMin:
		return bad("BackoffMin/BackoffMax", "must satisfy 0 < BackoffMin <= BackoffMax")
	case c.PurgeInterval < 0:
		return bad("PurgeInterval", "must be positive")
	case c.PurgeBatchSize < 1:
		return bad("PurgeBatchSize", "must be at least 1")
	case len(c.Owner) > 40:
		return bad("Owner", "must be at most 40 bytes")
	}
	return nil
}

// DB is what a Relay needs: transactions, statements, and a connection of
// its own for LISTEN (taken from the pool with Acquire and hijacked, so it
// never returns to the pool). *pgxpool.Pool satisfies it.
type DB interface {
	DBTX
	Begin(ctx context.Context) (pgx.Tx, error)
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// Relay drives outbox rows to a Publisher. Several relays (in one process
// or many) may share a table: FOR UPDATE SKIP LOCKED splits the work and
// the head-of-line claim keeps per-aggregate order (see package doc).
type Relay struct {
	db  DB
	q   *dbsqlc.Queries
	pub Publisher
	cfg RelayConfig
	log *slog.Logger

	wake chan struct{}

	// hardCtx is cancelled by StopAndCancel: it aborts the batch in hand.
	hardCtx    context.Context
	hardCancel context.CancelFunc

	mu        sync.Mutex
	started   bool
	cancelRun context.CancelFunc
	done      chan struct{}
}

// NewRelay returns a relay over db publishing through pub. A nil cfg
// means all defaults.
func NewRelay(db DB, pub Publisher, cfg *RelayConfig) (*Relay, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: db is nil", ErrInvalidConfig)
	}
	if pub == nil {
		return nil, fmt.Errorf("%w: publisher is nil", ErrInvalidConfig)
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	hardCtx, hardCancel := context.WithCancel(context.Background())
	return &Relay{
		db: db, q: dbsqlc.New(db), pub: pub, cfg: c, log: c.Logger,
		wake:    make(chan struct{}, 1),
		hardCtx: hardCtx, hardCancel: hardCancel,
	}, nil
}

// Start launches the relay loop, the LISTEN connection, the lease reaper
// and the retention purger, and returns at once. ctx governs their
// lifetime: cancelling it is a soft stop (like Stop), and its values reach
// every batch context. Calling Start again is a no-op.
func (r *Relay) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		return nil
	}
	r.started = true
	runCtx, cancel := context.WithCancel(ctx)
	r.cancelRun = cancel
	r.done = make(chan struct{})
	var wg sync.WaitGroup
	run := func(f func(context.Context)) {
		wg.Add(1)
		go func() { defer wg.Done(); f(runCtx) }()
	}
	run(r.loop)
	if !r.cfg.DisableNotify {
		run(r.listen)
	}
	run(r.reapLoop)
	if r.cfg.Retention > 0 {
		run(r.purgeLoop)
	}
	go func() { wg.Wait(); close(r.done) }()
	return nil
}

// Stop is the soft stop: no new batch starts, the batch in hand finishes
// (publish and mark, bounded by BatchTimeout), and Stop returns when every
// goroutine has exited, or with ctx's error when ctx ends first (the batch
// then still finishes in the background). Safe to call twice and before
// Start.
func (r *Relay) Stop(ctx context.Context) error {
	r.mu.Lock()
	if !r.started {
		r.mu.Unlock()
		return nil
	}
	r.cancelRun()
	done := r.done
	r.mu.Unlock()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// StopAndCancel is the hard stop: it also cancels the batch in hand. In
// AtLeastOnce mode its transaction rolls back (the batch may have been
// published: it will be again); in TwoPhase mode its rows stay PUBLISHING
// until the reaper returns them. Safe to call twice and before Start.
func (r *Relay) StopAndCancel(ctx context.Context) error {
	r.hardCancel()
	return r.Stop(ctx)
}

func (r *Relay) wakeUp() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// loop runs batches until ctx is cancelled. Cancellation is checked only
// between batches: a batch that has begun runs to its end on its own
// context.
func (r *Relay) loop(ctx context.Context) {
	poll := time.NewTimer(0)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		default:
		}
		n, err := r.RunBatch(ctx)
		if err != nil && !errors.Is(err, ErrLeaseLost) {
			r.log.WarnContext(ctx, "outbox relay batch", "error", err, "owner", r.cfg.Owner)
		}
		if err == nil && n == r.cfg.BatchSize {
			continue // likely more behind it
		}
		poll.Reset(r.cfg.PollInterval)
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		case <-poll.C:
		}
		if !poll.Stop() {
			select {
			case <-poll.C:
			default:
			}
		}
	}
}

// RunBatch claims, publishes and marks one batch, and returns how many
// events it claimed. It runs on context.WithTimeout(context.WithoutCancel(ctx),
// BatchTimeout): cancelling ctx does not interrupt it (StopAndCancel
// does). The relay loop calls it; tests and benchmarks may too.
func (r *Relay) RunBatch(ctx context.Context) (int, error) {
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.BatchTimeout)
	defer cancel()
	stop := context.AfterFunc(r.hardCtx, cancel)
	defer stop()
	if r.cfg.Mode == TwoPhase {
		return r.batchTwoPhase(bctx)
	}
	return r.batchAtLeastOnce(bctx)
}

// publish runs the publisher on a child of the batch context that ends a
// quarter of BatchTimeout early. A publish that cannot finish (a broker
// down, say) then still leaves the batch the time to record the failure:
//  1. the events get their attempt counted, last_error and a backoff, and
//     go back to PENDING (two-phase) or stay PENDING (at-least-once);
//  2. without the reserve, the mark would fail on the same expired
//     context, and in two-phase mode the rows would stay PUBLISHING until
//     the reaper took them after LeaseTTL — a minute of silence for the
//     aggregates involved.
func (r *Relay) publish(ctx context.Context, events []Event) error {
	if dl, ok := ctx.Deadline(); ok {
		pctx, cancel := context.WithDeadline(ctx, dl.Add(-r.cfg.BatchTimeout/4))
		defer cancel()
		return r.pub.Publish(pctx, events)
	}
	return r.pub.Publish(ctx, events)
}

func (r *Relay) batchAtLeastOnce(ctx context.Context) (int, error) {
	tx, err := r.db.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("outbox: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	q := r.q.WithTx(tx)
	rows, err := q.ClaimLocked(ctx, int32(r.cfg.BatchSize))
	if err != nil {
		return 0, fmt.Errorf("outbox: claim: %w", err)
	}
	if len(rows) == 0 {
		return 0, tx.Commit(ctx)
	}
	events := make([]Event, len(rows))
	for i, row := range rows {
		events[i] = eventFrom(dbsqlc.ClaimLeaseRow(row))
	}
	sortEvents(events)
	o := r.outcome(events, r.publish(ctx, events))
	if len(o.ok) > 0 {
		if _, err := q.MarkPublishedLocked(ctx, o.ok); err != nil {
			return len(rows), fmt.Errorf("outbox: mark published: %w", err)
		}
	}
	if len(o.failed) > 0 {
		if _, err := q.MarkFailedLocked(ctx, dbsqlc.MarkFailedLockedParams{
			MaxAttempts: int32(r.cfg.MaxAttempts), Ids: o.failed, Errs: o.errs, DelaysMs: o.delays,
		}); err != nil {
			return len(rows), fmt.Errorf("outbox: mark failed: %w", err)
		}
	}
	// Events held back behind a failure of their aggregate stay PENDING,
	// untouched: the failed event's backoff keeps them waiting.
	if err := tx.Commit(ctx); err != nil {
		// Published but not marked: the batch will be published again.
		return len(rows), fmt.Errorf("outbox: commit: %w", err)
	}
	return len(rows), o.err
}

func (r *Relay) batchTwoPhase(ctx context.Context) (int, error) {
	token := randomToken()
	// Phase 1: the claim commits on its own; from here the rows are
	// PUBLISHING under (owner, token) and no transaction is open.
	rows, err := r.claimLease(ctx, token)
	if err != nil {
		return 0, fmt.Errorf("outbox: claim: %w", err)
	}
	if len(rows) == 0 {
		return 0, nil
	}
	events := make([]Event, len(rows))
	for i, row := range rows {
		events[i] = eventFrom(row)
		events[i].Attempts-- // the claim counted this attempt already
	}
	sortEvents(events)
	// A crash here (after the claim, before or during the publish) leaves
	// the rows PUBLISHING; after LeaseTTL the reaper returns them to
	// PENDING and another relay (or this one, restarted) publishes them.
	o := r.outcome(events, r.publish(ctx, events))
	// Phase 2: every update is guarded by the token. If this batch was so
	// slow that the reaper took the lease back:
	//  1. the rows went PENDING (token cleared) and perhaps were claimed
	//     again under a new token by another relay;
	//  2. these updates then match no row, and the new owner's outcome
	//     stands; this relay's produce may still have landed, which is a
	//     duplicate of the new owner's, never a lost or skipped event.
	var marked int64
	if len(o.ok) > 0 {
		n, err := r.q.MarkPublishedLease(ctx, dbsqlc.MarkPublishedLeaseParams{Ids: o.ok, Token: token})
		if err != nil {
			return len(rows), fmt.Errorf("outbox: mark published: %w", err)
		}
		marked += n
	}
	if len(o.failed)+len(o.held) > 0 {
		ids := append(slices.Clone(o.failed), o.held...)
		errs := append(slices.Clone(o.errs), make([]string, len(o.held))...)
		delays := append(slices.Clone(o.delays), make([]int64, len(o.held))...)
		counted := make([]bool, len(ids))
		for i := range o.failed {
			counted[i] = true
		}
		n, err := r.q.MarkFailedLease(ctx, dbsqlc.MarkFailedLeaseParams{
			MaxAttempts: int32(r.cfg.MaxAttempts), Token: token,
			Ids: ids, Errs: errs, DelaysMs: delays, Counted: counted,
		})
		if err != nil {
			return len(rows), fmt.Errorf("outbox: mark failed: %w", err)
		}
		marked += n
	}
	if int(marked) < len(rows) {
		r.log.WarnContext(ctx, "outbox relay lost its lease; the new owner's result stands",
			"owner", r.cfg.Owner, "events", len(rows), "marked", marked)
		return len(rows), fmt.Errorf("%w: %d of %d events were reaped before the batch finished",
			ErrLeaseLost, len(rows)-int(marked), len(rows))
	}
	return len(rows), o.err
}

// claimLease runs the two-phase claim in a transaction committed with
// synchronous_commit off: it does not wait for the WAL flush. That is safe
// because losing the claim in a database crash is the same as the reaper
// returning it — the rows are PENDING again and the relay's token-guarded
// mark then changes nothing (an at-least-once duplicate at worst). The
// mark that follows commits synchronously and flushes the claim's WAL with
// its own. It saves one WAL flush per batch.
func (r *Relay) claimLease(ctx context.Context, token int64) ([]dbsqlc.ClaimLeaseRow, error) {
	// One round trip for both: BeginQuery goes out as a simple-protocol
	// query.
	tx, err := r.db.BeginTx(ctx, pgx.TxOptions{BeginQuery: "BEGIN; SET LOCAL synchronous_commit = off"})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	rows, err := r.q.WithTx(tx).ClaimLease(ctx, dbsqlc.ClaimLeaseParams{
		Owner: r.cfg.Owner, Token: token, BatchSize: int32(r.cfg.BatchSize),
	})
	if err != nil {
		return nil, err
	}
	return rows, tx.Commit(ctx)
}

// outcome sorts a batch's events into delivered, failed (charged an
// attempt, backed off) and held (not charged: an earlier event of the same
// aggregate failed in this batch, so this one must wait for it, whatever
// the publisher says about it).
type outcome struct {
	ok     []int64
	failed []int64
	errs   []string
	delays []int64
	held   []int64
	err    error
}

func (r *Relay) outcome(events []Event, perr error) outcome {
	var o outcome
	if perr == nil {
		o.ok = make([]int64, len(events))
		for i, e := range events {
			o.ok[i] = e.ID
		}
		return o
	}
	o.err = perr
	errOf := func(int) error { return perr }
	var be *BatchError
	if errors.As(perr, &be) && len(be.Errs) == len(events) {
		errOf = func(i int) error { return be.Errs[i] }
	}
	type aggKey struct{ t, id string }
	blocked := map[aggKey]bool{}
	for i, e := range events {
		k := aggKey{e.AggregateType, e.AggregateID}
		switch err := errOf(i); {
		case blocked[k]:
			o.held = append(o.held, e.ID)
		case err == nil:
			o.ok = append(o.ok, e.ID)
		default:
			blocked[k] = true
			o.failed = append(o.failed, e.ID)
			o.errs = append(o.errs, truncate(err.Error(), 2000))
			o.delays = append(o.delays, r.backoff(e.Attempts).Milliseconds())
		}
	}
	return o
}

// backoff is the delay after the n-th failed attempt (n from 0).
func (r *Relay) backoff(n int) time.Duration {
	d := r.cfg.BackoffMin
	for i := 0; i < n && d < r.cfg.BackoffMax; i++ {
		d *= 2
	}
	d = min(d, r.cfg.BackoffMax)
	return d + time.Duration(rand.Int64N(int64(d)/5+1))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

func randomToken() int64 {
	var b [8]byte
	_, _ = cryptoRead(b[:])
	return int64(binary.LittleEndian.Uint64(b[:]) >> 1)
}

var cryptoRead = crand.Read

func eventFrom(row dbsqlc.ClaimLeaseRow) Event {
	return Event{
		Message: Message{
			Topic: row.Topic, AggregateType: row.AggregateType, AggregateID: row.AggregateID,
			EventID: row.EventID, EventType: row.EventType, Payload: row.Payload,
			Headers: decodeHeaders(row.Headers),
		},
		ID: row.ID, Seq: row.AggregateSeq, Attempts: int(row.Attempts), CreatedAt: row.CreatedAt.Time,
	}
}

// sortEvents orders a batch by aggregate (aggregates in order of their
// first row id) and each aggregate's events by sequence. Enqueue assigns
// ids and sequence numbers under the same lock, so they agree; the sort
// does not rely on it.
func sortEvents(events []Event) {
	type aggKey struct{ t, id string }
	first := map[aggKey]int64{}
	for _, e := range events {
		k := aggKey{e.AggregateType, e.AggregateID}
		if v, ok := first[k]; !ok || e.ID < v {
			first[k] = e.ID
		}
	}
	slices.SortFunc(events, func(a, b Event) int {
		fa, fb := first[aggKey{a.AggregateType, a.AggregateID}], first[aggKey{b.AggregateType, b.AggregateID}]
		if c := cmp.Compare(fa, fb); c != 0 {
			return c
		}
		return cmp.Compare(a.Seq, b.Seq)
	})
}
