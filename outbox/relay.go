package outbox

import (
	"cmp"
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/backoff"
	"github.com/idemkit/idem/internal/failpoint"
	"github.com/idemkit/idem/internal/startstop"
	"github.com/idemkit/idem/outbox/internal/dbsqlc"
)

// Relay drives outbox rows to a Publisher. Several relays (in one process
// or many) may share a table: FOR UPDATE SKIP LOCKED splits the work and
// the head-of-line claim keeps per-aggregate order (see the package doc).
//
// A Relay is a lifecycle.Component and a lifecycle.HardStopper: Start,
// Stop (soft) and HardStop, each safe to call twice, concurrently and
// before Start.
type Relay struct {
	pool    *pgxpool.Pool
	q       *dbsqlc.Queries
	pub     Publisher
	check   Checker // pub's, if it is one
	cfg     RelayConfig
	log     *slog.Logger
	backoff backoff.Policy

	wake chan struct{}
	svc  startstop.Service
	// listening is true while the LISTEN connection is up: only then is
	// arming the doorbell worth anything.
	listening atomic.Bool
	// onSleep, set by tests before Start, is called as the loop goes to
	// sleep, saying whether it sleeps armed.
	onSleep func(armed bool)

	// cursor is the aggregate the last claim ended at: the next claim
	// looks at the aggregates after it first, then wraps around, so that
	// every aggregate with events gets its turn (see claimCursor).
	cursorMu sync.Mutex
	cursor   aggregateKey
	// window is how many of the oldest unheld, unpublished rows the claim
	// looks for heads among (see claimWindow).
	window int
}

// NewRelay returns a relay over pool publishing through pub. A nil cfg
// means all defaults.
//
// The relay takes a pool, not a narrower interface, because it needs one
// for what only a pool gives: transactions for its batches and, unless
// DisableNotify, two connections of its own, for LISTEN and for the
// doorbell's session lock, taken from the pool and never returned to it
// (the pool opens others in their place). It uses at most three of the
// pool's connections at a time besides: one each for the batch in hand,
// the reaper and the purge.
func NewRelay(pool *pgxpool.Pool, pub Publisher, cfg *RelayConfig) (*Relay, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: pool is nil", ErrInvalidConfig)
	}
	if pub == nil {
		return nil, fmt.Errorf("%w: publisher is nil", ErrInvalidConfig)
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	r := &Relay{
		pool: pool, q: dbsqlc.New(pool), pub: pub, cfg: c, log: c.Logger,
		backoff: backoff.Policy{Min: c.BackoffMin, Max: c.BackoffMax},
		wake:    make(chan struct{}, 1),
	}
	r.check, _ = pub.(Checker)
	return r, nil
}

// Start launches the relay loop, the LISTEN connection, the lease reaper
// and the retention purge, and returns. ctx lends its values to them and
// bounds nothing else: cancelling it afterwards changes nothing (Stop and
// HardStop end the run). Start on a running relay is a no-op; Start after
// a stop starts a fresh run.
func (r *Relay) Start(ctx context.Context) error {
	return r.svc.Start(ctx, func(ctx context.Context, g *startstop.Group) error {
		g.Go(ctx, r.loop)
		if !r.cfg.DisableNotify {
			g.Go(ctx, r.listen)
		}
		g.Go(ctx, r.reapLoop)
		if r.cfg.Retention > 0 {
			g.Go(ctx, r.purgeLoop)
		}
		return nil
	})
}

// Stop is the soft stop: no new batch starts, the batch in hand finishes
// (publish and mark, bounded by BatchTimeout), the reaper and the purge
// stop between statements, and Stop returns when every goroutine has
// returned, or with ctx's error when ctx ends first (the batch then still
// finishes in the background).
func (r *Relay) Stop(ctx context.Context) error { return r.svc.Stop(ctx) }

// HardStop is the soft stop plus the end of the batch in hand: its
// context is cancelled. In AtLeastOnce mode its transaction rolls back
// (the batch may have been published: it will be again); in TwoPhase mode
// its rows stay PUBLISHING until the reaper returns them after LeaseTTL.
// Like Stop, it returns when the goroutines have, or when ctx ends.
func (r *Relay) HardStop(ctx context.Context) error { return r.svc.HardStop(ctx) }

func (r *Relay) wakeUp() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *Relay) emit(ctx context.Context, e RelayEvent) context.Context {
	if r.cfg.Hook == nil {
		return ctx
	}
	e.Mode, e.Owner = r.cfg.Mode, r.cfg.Owner
	return idem.CallHook(r.cfg.Hook, ctx, e)
}

// loop runs batches until ctx (the run's) ends. The end is checked only
// between batches: a batch that has begun runs to its end on its own
// context.
//
// Between batches it follows the doorbell protocol (see doorbell.go). A
// full batch is followed by the next at once. After a short one the relay
// tries to arm the doorbell:
//   - armed: it takes a last look (one more batch: whatever committed
//     before the arm) and, if that finds nothing, sleeps until a NOTIFY, a
//     wake-up or PollInterval, disarming when it wakes;
//   - other (another relay is armed, and that relay's NOTIFY wakes this
//     one too): it takes a last look as well, since the armed relay's own
//     last look may have found this relay's aggregates locked by the batch
//     just finished, and sleeps if it finds nothing;
//   - busy (an enqueue that rang no bell is uncommitted): it polls again
//     after a short, growing delay (1 to 16 ms).
//
// A batch whose deliveries failed is progress like any other (the failures
// are recorded); one that failed itself (a database error) is followed by
// an arm and a last look too, and a last look that fails sleeps, armed if
// it was. While it sleeps armed the relay watches the doorbell's
// connection, whose end took the lock with it: a cut wakes the relay,
// which arms again on a new connection.
//
// So a relay sleeps only after a claim that found nothing and began after
// it, or another relay, was armed; an event that claim could not take was
// in another relay's batch, and that relay takes its own last look when
// the batch ends.
func (r *Relay) loop(ctx context.Context) {
	poll := time.NewTimer(0)
	defer poll.Stop()
	var bell doorbell
	armed, looked, busy := false, false, 0
	defer func() { bell.leave(ctx, r, armed) }()
	for {
		if ctx.Err() != nil {
			return
		}
		b := r.runBatch(ctx)
		n, err := b.claimed, b.err
		if err != nil && !errors.Is(err, ErrLeaseLost) && !errors.Is(err, context.Canceled) {
			r.log.WarnContext(ctx, "outbox relay batch", "error", err, "owner", r.cfg.Owner)
		}
		// A batch that failed recorded nothing (a database error); one
		// whose deliveries failed recorded them, and is progress.
		failed := err != nil && !b.recorded
		if armed && n > 0 && !failed {
			bell.disarm(ctx)
			armed = false
		}
		if n > 0 {
			busy = 0
		}
		if !failed && n == r.cfg.BatchSize {
			looked = false
			continue // likely more behind it
		}
		wait := r.cfg.PollInterval
		switch {
		case looked && (n == 0 || failed):
			// The last look found nothing, or failed: sleep, armed or not
			// (armed, the next enqueue still wakes the relay).
		case !r.cfg.DisableNotify && r.listening.Load():
			switch bell.arm(ctx, r) {
			case bellArmed:
				armed, looked = true, true
				continue
			case bellOther:
				looked = true
				continue
			case bellBusy:
				if !failed { // a failing relay polls at PollInterval
					busy++
					wait = min(wait, busyPoll.Ceiling(busy))
				}
			}
		}
		looked = false
		if r.onSleep != nil {
			r.onSleep(armed)
		}
		var cut <-chan struct{} // nil: never ready
		stopWatch := func() {}
		if armed {
			cut, stopWatch = bell.watch()
		}
		poll.Reset(wait)
		select {
		case <-ctx.Done():
			stopWatch()
			return
		case <-r.wake:
		case <-poll.C:
		case <-cut: // the disarm fails and closes it; the next arm reconnects
		}
		stopWatch()
		if !poll.Stop() {
			select {
			case <-poll.C:
			default:
			}
		}
		if armed {
			bell.disarm(ctx)
			armed = false
		}
	}
}

// RunBatch claims, publishes and marks one batch, and returns how many
// events it claimed. It runs on its own context,
// context.WithTimeout(context.WithoutCancel(ctx), BatchTimeout) with ctx's
// values: cancelling ctx does not interrupt it, and when ctx is the
// relay's own (the loop's) the hard stop does. The relay loop calls it;
// tests and benchmarks may too.
//
// The error is the batch's: a database error (nothing was recorded), a
// summary of the events whose attempt failed (they were recorded as
// such), or ErrLeaseLost.
func (r *Relay) RunBatch(ctx context.Context) (int, error) {
	b := r.runBatch(ctx)
	return b.claimed, b.err
}

func (r *Relay) runBatch(ctx context.Context) result {
	wctx, cancelWork := startstop.WorkContext(ctx)
	defer cancelWork()
	bctx, cancel := context.WithTimeout(wctx, r.cfg.BatchTimeout)
	defer cancel()
	start := time.Now()
	bctx = r.emit(bctx, RelayEvent{Kind: RelayBatchBegin})
	var b result
	if r.cfg.Mode == TwoPhase {
		b = r.batchTwoPhase(bctx)
	} else {
		b = r.batchAtLeastOnce(bctx)
	}
	r.emit(bctx, RelayEvent{Kind: RelayBatchDone, Count: b.claimed,
		Published: len(b.o.ok), Failed: len(b.o.failed), Held: len(b.o.held), Calls: b.o.calls,
		Duration: time.Since(start), Err: b.err})
	return b
}

// result is one batch's: how many events it claimed, the delivery
// outcome, and the batch's error. recorded says that the outcome is in
// the table: err is then the delivery's (failed events wait for their
// retry) or ErrLeaseLost, not a failure of the batch itself.
type result struct {
	claimed  int
	o        outcome
	err      error
	recorded bool
}

// beginClaim opens a claim's transaction with JIT compilation off. The
// claim's plan is estimated dear enough (a recursive CTE, a window, many
// index loops) to cross jit_above_cost on a default server, and LLVM then
// compiles it afresh at every execution: measured on PostgreSQL 15 with
// 100,000 events of one aggregate, 866 ms per claim with JIT, 5.7 ms
// without (TestClaimRunsWithoutJIT). The claim reads at most a few
// thousand rows by index, where compiled expressions gain nothing. One
// simple-protocol round trip, like BEGIN alone.
const beginClaim = "BEGIN; SET LOCAL jit = off"

func (r *Relay) batchAtLeastOnce(ctx context.Context) (b result) {
	t0 := time.Now()
	tx, err := r.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: beginClaim})
	if err != nil {
		b.err = fmt.Errorf("outbox: begin: %w", err)
		return b
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	q := r.q.WithTx(tx)
	events, err := r.claim(ctx,
		func(win int) ([]dbsqlc.ClaimFastRow, error) {
			return q.ClaimFast(ctx, dbsqlc.ClaimFastParams{WindowSize: int32(win), BatchSize: int32(r.cfg.BatchSize)})
		},
		func(cur aggregateKey, win, n int) ([]dbsqlc.ClaimLeaseRow, error) {
			rows, err := q.ClaimLocked(ctx, dbsqlc.ClaimLockedParams{
				CursorType: cur.typ, CursorID: cur.id, BatchSize: int32(n), WindowSize: int32(win),
			})
			out := make([]dbsqlc.ClaimLeaseRow, len(rows))
			for i, row := range rows {
				out[i] = dbsqlc.ClaimLeaseRow(row)
			}
			return out, err
		})
	if err != nil {
		b.err = fmt.Errorf("outbox: claim: %w", err)
		return b
	}
	if len(events) == 0 {
		b.err = tx.Commit(ctx)
		return b
	}
	b.claimed = len(events)
	r.emitClaimed(ctx, events, time.Since(t0))
	// The claim marked the batch PUBLISHED in this transaction, which holds
	// the rows until it ends: nobody else sees the mark before the commit,
	// and what was not delivered is undone below, before it. So the common
	// batch, all delivered, writes each row once (as the cheapest unordered
	// relay does), where a claim followed by a mark wrote it twice.
	//
	// Crash window: the rows are locked by this transaction, nothing is
	// published. A crash rolls the transaction back; the rows are PENDING
	// and untouched, and the next claim takes them.
	if err := failpoint.Inject(failpoint.RelayMidClaim); err != nil {
		b.err = err
		return b
	}
	b.o = r.deliver(ctx, events)
	// Crash window: the broker has the delivered events, the table does
	// not know (the mark is uncommitted). A crash rolls the claim back;
	// the events are published again by the next claim: a duplicate,
	// never a loss.
	if len(b.o.ok) > 0 {
		if err := failpoint.Inject(failpoint.RelayPublished); err != nil {
			b.err = err
			return b
		}
	}
	var dead []int64
	if len(b.o.failed)+len(b.o.held) > 0 {
		p := r.failParams(events, b.o)
		counted := make([]bool, len(p.ids))
		for i := range b.o.failed {
			counted[i] = true
		}
		// Held-back events were not attempted: back to PENDING uncounted,
		// as they were; the block below holds them behind the failure.
		for _, i := range b.o.held {
			p.ids = append(p.ids, events[i].ID)
			p.errs = append(p.errs, "")
			p.delays = append(p.delays, 0)
		}
		marked, err := q.MarkFailedLocked(ctx, dbsqlc.MarkFailedLockedParams{
			MaxAttempts: int32(r.cfg.MaxAttempts), Ids: p.ids, Errs: p.errs, DelaysMs: p.delays, Counted: counted,
		})
		if err != nil {
			b.err = fmt.Errorf("outbox: mark failed: %w", err)
			return b
		}
		if len(marked) != len(p.ids) {
			// The rows are this transaction's: a shortfall is a bug, and
			// committing would publish-mark undelivered events.
			b.err = fmt.Errorf("outbox: mark failed: %d of %d rows changed", len(marked), len(p.ids))
			return b
		}
		for _, m := range marked {
			if m.Dead {
				dead = append(dead, m.ID)
			}
		}
	}
	// The failed event's backoff keeps the events held back behind it
	// waiting, and the block takes them (and the aggregate's later events)
	// out of the claim's index.
	if block, release := settlement(events, &b.o); !block.empty() || !release.empty() {
		if err := settle(ctx, q, block, release); err != nil {
			b.err = err
			return b
		}
	}
	if err := tx.Commit(ctx); err != nil {
		// Published but not marked: the batch will be published again.
		b.err = fmt.Errorf("outbox: commit: %w", err)
		return b
	}
	r.emitDead(ctx, events, dead)
	b.recorded = true
	b.err = b.o.err()
	return b
}

func (r *Relay) batchTwoPhase(ctx context.Context) (b result) {
	token := randomToken()
	t0 := time.Now()
	// Phase 1: the claim commits on its own; from here the rows are
	// PUBLISHING under (owner, token) and no transaction is open.
	events, err := r.claimLease(ctx, token)
	if err != nil {
		b.err = fmt.Errorf("outbox: claim: %w", err)
		return b
	}
	if len(events) == 0 {
		return b
	}
	b.claimed = len(events)
	r.emitClaimed(ctx, events, time.Since(t0))
	// Crash window: the lease is committed, nothing is published. The rows
	// stay PUBLISHING; after LeaseTTL the reaper returns them to PENDING
	// (the claim's attempt stays counted) and another relay, or this one
	// restarted, publishes them.
	if err := failpoint.Inject(failpoint.RelayMidClaim); err != nil {
		b.err = err
		return b
	}
	b.o = r.deliver(ctx, events)
	// Crash window: the broker has the delivered events, the rows are
	// still PUBLISHING. After LeaseTTL the reaper returns them and they
	// are published again: a duplicate, never a loss.
	if len(b.o.ok) > 0 {
		if err := failpoint.Inject(failpoint.RelayPublished); err != nil {
			b.err = err
			return b
		}
	}
	// Phase 2: every update is guarded by the token. If this batch was so
	// slow that the reaper took the lease back:
	//  1. the rows went PENDING (token cleared) and perhaps were claimed
	//     again under a new token by another relay;
	//  2. these updates then match no row, and the new owner's outcome
	//     stands; this relay's produce may still have landed, which is a
	//     duplicate of the new owner's, never a lost or skipped event.
	var marked int64
	if len(b.o.ok) > 0 {
		n, err := r.q.MarkPublishedLease(ctx, dbsqlc.MarkPublishedLeaseParams{Ids: b.o.ids(events, b.o.ok), Token: token})
		if err != nil {
			b.err = fmt.Errorf("outbox: mark published: %w", err)
			return b
		}
		marked += n
	}
	var dead []int64
	block, release := settlement(events, &b.o)
	if int(marked) < len(b.o.ok) {
		// Some delivered events had been reaped (and perhaps claimed
		// again) before the mark: their aggregates may be another relay's
		// now, and its failure would be undone by this release. Release
		// nothing; the sweep releases an aggregate left blocked with no
		// failed event.
		release = aggSeqs{}
	}
	if len(b.o.failed)+len(b.o.held) > 0 {
		p := r.failParams(events, b.o)
		counted := make([]bool, len(p.ids))
		for i := range b.o.failed {
			counted[i] = true
		}
		// Held events go back to PENDING uncounted and with no delay of
		// their own: the failed event before them keeps them waiting.
		for _, i := range b.o.held {
			p.ids = append(p.ids, events[i].ID)
			p.errs = append(p.errs, "")
			p.delays = append(p.delays, 0)
		}
		failed, err := r.markFailedLease(ctx, dbsqlc.MarkFailedLeaseParams{
			MaxAttempts: int32(r.cfg.MaxAttempts), Token: token,
			Ids: p.ids, Errs: p.errs, DelaysMs: p.delays, Counted: counted,
		}, events, block, release)
		if err != nil {
			b.err = err
			return b
		}
		marked += int64(len(failed))
		for _, m := range failed {
			if m.Dead {
				dead = append(dead, m.ID)
			}
		}
	} else if !release.empty() {
		if err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
			return settle(ctx, r.q.WithTx(tx), aggSeqs{}, release)
		}); err != nil {
			// The events are marked; the sweep releases the aggregate.
			b.err = err
			return b
		}
	}
	r.emitDead(ctx, events, dead)
	if int(marked) < len(events) {
		lost := len(events) - int(marked)
		b.recorded = true
		b.err = fmt.Errorf("%w: %d of %d events were reaped before the batch finished", ErrLeaseLost, lost, len(events))
		r.log.WarnContext(ctx, "outbox relay lost its lease; the new owner's result stands",
			"owner", r.cfg.Owner, "events", len(events), "marked", marked)
		r.emit(ctx, RelayEvent{Kind: RelayLeaseLost, Count: lost, Err: b.err})
		return b
	}
	b.recorded = true
	b.err = b.o.err()
	return b
}

// claimLease runs the two-phase claim in a transaction committed with
// synchronous_commit off: it does not wait for the WAL flush. That is safe
// because losing the claim in a database crash is the same as the reaper
// returning it — the rows are PENDING again and the relay's token-guarded
// mark then changes nothing (an at-least-once duplicate at worst). The
// mark that follows commits synchronously and flushes the claim's WAL with
// its own. It saves one WAL flush per batch.
func (r *Relay) claimLease(ctx context.Context, token int64) ([]Event, error) {
	// One round trip for both: BeginQuery goes out as a simple-protocol
	// query.
	tx, err := r.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: beginClaim + "; SET LOCAL synchronous_commit = off"})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	q := r.q.WithTx(tx)
	events, err := r.claim(ctx,
		func(win int) ([]dbsqlc.ClaimFastRow, error) {
			rows, err := q.ClaimLeaseFast(ctx, dbsqlc.ClaimLeaseFastParams{
				Owner: r.cfg.Owner, Token: token, WindowSize: int32(win), BatchSize: int32(r.cfg.BatchSize),
			})
			out := make([]dbsqlc.ClaimFastRow, len(rows))
			for i, row := range rows {
				out[i] = dbsqlc.ClaimFastRow(row)
			}
			return out, err
		},
		func(cur aggregateKey, win, n int) ([]dbsqlc.ClaimLeaseRow, error) {
			return q.ClaimLease(ctx, dbsqlc.ClaimLeaseParams{
				Owner: r.cfg.Owner, Token: token, BatchSize: int32(n), WindowSize: int32(win),
				CursorType: cur.typ, CursorID: cur.id,
			})
		})
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, err
	}
	return events, nil
}

// claim runs a batch's claim in the caller's transaction: fast (the
// window's heads, ClaimFast or ClaimLeaseFast) and, when that falls short
// of the batch, full (ClaimLocked or ClaimLease) for the rest, which sees
// the heads just taken as done and the events behind them as heads. It
// returns the events in delivery order with Attempts as they were before
// this claim (which counted one), moves the cursor and adapts the window.
func (r *Relay) claim(ctx context.Context,
	fast func(win int) ([]dbsqlc.ClaimFastRow, error),
	full func(cur aggregateKey, win, n int) ([]dbsqlc.ClaimLeaseRow, error),
) ([]Event, error) {
	cur, win := r.claimCursor()
	heads, err := fast(win)
	if err != nil {
		return nil, err
	}
	events := make([]Event, 0, r.cfg.BatchSize)
	rotated := make([]bool, 0, r.cfg.BatchSize)
	for _, row := range heads {
		events = append(events, eventFrom(leaseRow(row)))
		rotated = append(rotated, false)
	}
	if n := r.cfg.BatchSize - len(events); n > 0 {
		rest, err := full(cur, win, n)
		if err != nil {
			return nil, err
		}
		for _, row := range rest {
			events = append(events, eventFrom(row))
			rotated = append(rotated, row.Rotated)
		}
	}
	for i := range events {
		events[i].Attempts--
	}
	r.advanceCursor(cur, events, rotated)
	r.adaptWindow(win, rotated)
	sortEvents(events)
	return events, nil
}

// markFailedLease runs MarkFailedLease; with aggregates to block or
// release, in one transaction with settle, so that no other relay can
// claim a failed event (still PUBLISHING under this lease until the
// commit) and deliver it before its aggregate is recorded as blocked.
//
// It blocks only the aggregates whose failed event the mark changed, that
// is, still under this lease: one that was reaped is another relay's to
// settle (perhaps claimed again and in flight, or delivered), and blocking
// its aggregate here would hold events of the new owner's batch.
func (r *Relay) markFailedLease(ctx context.Context, p dbsqlc.MarkFailedLeaseParams, events []Event, block, release aggSeqs) ([]dbsqlc.MarkFailedLeaseRow, error) {
	if block.empty() && release.empty() {
		rows, err := r.q.MarkFailedLease(ctx, p)
		if err != nil {
			return nil, fmt.Errorf("outbox: mark failed: %w", err)
		}
		return rows, nil
	}
	var rows []dbsqlc.MarkFailedLeaseRow
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		q := r.q.WithTx(tx)
		var err error
		if rows, err = q.MarkFailedLease(ctx, p); err != nil {
			return fmt.Errorf("outbox: mark failed: %w", err)
		}
		return settle(ctx, q, ownedBlock(events, block, rows), release)
	})
	return rows, err
}

// ownedBlock is block less the aggregates whose failed event is not among
// the rows MarkFailedLease changed (its lease was lost).
func ownedBlock(events []Event, block aggSeqs, marked []dbsqlc.MarkFailedLeaseRow) aggSeqs {
	ids := make(map[int64]bool, len(marked))
	for _, m := range marked {
		ids[m.ID] = true
	}
	type at struct {
		k   aggregateKey
		seq int64
	}
	id := make(map[at]int64, len(events))
	for i := range events {
		id[at{events[i].aggregate(), events[i].Seq}] = events[i].ID
	}
	var out aggSeqs
	for j := range block.types {
		k := aggregateKey{block.types[j], block.ids[j]}
		if ids[id[at{k, block.seqs[j]}]] {
			out.add(k, block.seqs[j])
		}
	}
	return out
}

type failParams struct {
	ids    []int64
	errs   []string
	delays []int64
}

// failParams lists the failed events with their errors and backoff delays.
func (r *Relay) failParams(events []Event, o outcome) failParams {
	p := failParams{
		ids:    make([]int64, len(o.failed)),
		errs:   make([]string, len(o.failed)),
		delays: make([]int64, len(o.failed)),
	}
	for k, i := range o.failed {
		e := &events[i]
		p.ids[k] = e.ID
		p.errs[k] = errorText(o.errs[i])
		p.delays[k] = r.backoff.Delay(e.Attempts + 1).Milliseconds()
	}
	return p
}

func (r *Relay) emitClaimed(ctx context.Context, events []Event, d time.Duration) {
	if r.cfg.Hook == nil {
		return
	}
	infos := make([]EventInfo, len(events))
	for i := range events {
		infos[i] = infoOf(&events[i])
	}
	r.emit(ctx, RelayEvent{Kind: RelayBatchClaimed, Count: len(events), Duration: d, Events: infos})
}

func (r *Relay) emitDead(ctx context.Context, events []Event, dead []int64) {
	if len(dead) == 0 {
		return
	}
	r.log.WarnContext(ctx, "outbox events are DEAD: each holds back its aggregate until Requeue",
		"owner", r.cfg.Owner, "events", len(dead))
	if r.cfg.Hook == nil {
		return
	}
	var infos []EventInfo
	for i := range events {
		if slices.Contains(dead, events[i].ID) {
			info := infoOf(&events[i])
			info.Attempts++
			infos = append(infos, info)
		}
	}
	r.emit(ctx, RelayEvent{Kind: RelayDead, Count: len(infos), Events: infos})
}

// errorTextMax bounds a stored last_error, in bytes.
const errorTextMax = 2000

// errorText is err as PostgreSQL can store it: a publisher's error may
// carry any bytes (a broker's message, a record's key), and a mark that the
// server refuses would leave the attempt uncounted and the event retried
// without backoff, forever. Invalid UTF-8 and NUL become U+FFFD, and the
// cut falls on a character boundary.
func errorText(err error) string {
	s := strings.ToValidUTF8(err.Error(), "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	if len(s) <= errorTextMax {
		return s
	}
	cut := errorTextMax
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

func randomToken() int64 {
	var b [8]byte
	_, _ = crand.Read(b[:])
	return int64(binary.LittleEndian.Uint64(b[:]) >> 1)
}

// leaseRow is a fast claim's row in the full claims' shape (a fast claim
// never walks the aggregates: Rotated is false).
func leaseRow(row dbsqlc.ClaimFastRow) dbsqlc.ClaimLeaseRow {
	return dbsqlc.ClaimLeaseRow{
		ID: row.ID, Topic: row.Topic, AggregateType: row.AggregateType, AggregateID: row.AggregateID,
		AggregateSeq: row.AggregateSeq, EventID: row.EventID, EventType: row.EventType, Payload: row.Payload,
		Headers: row.Headers, Attempts: row.Attempts, CreatedAt: row.CreatedAt,
	}
}

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

// aggregateKey is an aggregate's identity, the one spelling of it in the
// package.
type aggregateKey struct{ typ, id string }

func (k aggregateKey) compare(o aggregateKey) int {
	if c := strings.Compare(k.typ, o.typ); c != 0 {
		return c
	}
	return strings.Compare(k.id, o.id)
}

// claimCursor is where the next claim starts: it takes heads of the
// aggregates after the cursor, in (type, id) order, then wraps around to
// the first ones. The zero key starts at the beginning.
func (r *Relay) claimCursor() (aggregateKey, int) {
	r.cursorMu.Lock()
	defer r.cursorMu.Unlock()
	if r.window == 0 {
		r.window = windowMin * r.cfg.BatchSize
	}
	return r.cursor, r.window
}

// The claim's window, in batches: it starts at windowMin and adapts. The
// claim finds heads among the oldest rows first (the window) and walks the
// aggregates (rotated heads) only when those fall short. Rows in the window
// that are no heads (failed events in their backoff, one per blocked
// aggregate; other relays' batches; the runs behind heads) push heads out
// of it: each claim that had to walk doubles the window, up to windowMax,
// and each that did not shrinks it by an eighth, down to windowMin. A
// larger window costs a claim its rows (an index scan and a hash), far less
// than the walk: with 500 heads in backoff ahead of the ready load, a
// window of one batch made the claim walk every time (bench relay backlog:
// 0.73 of at-least-once), two batches did not (0.89).
const (
	windowMin = 2
	windowMax = 16
)

// adaptWindow applies the rule above after a claim of the given window.
func (r *Relay) adaptWindow(win int, rotated []bool) {
	walked := slices.Contains(rotated, true)
	r.cursorMu.Lock()
	defer r.cursorMu.Unlock()
	if walked {
		r.window = min(2*win, windowMax*r.cfg.BatchSize)
	} else {
		r.window = max(win-win/8, windowMin*r.cfg.BatchSize)
	}
}

// advanceCursor moves the cursor to the last aggregate that a claim
// started at cur took by aggregate (the rotated heads; those taken as the
// oldest events do not move it), in its wrapped order: the greatest such
// key up to cur if the scan wrapped around, else the greatest one. The
// order matters only for fairness (an aggregate waits for at most a round
// of the others), never for correctness: Go compares bytes, the database
// its collation, and a key put on the wrong side of cur only starts the
// next claim elsewhere.
func (r *Relay) advanceCursor(cur aggregateKey, events []Event, rotated []bool) {
	var after, wrapped aggregateKey
	var hasAfter, hasWrapped bool
	for i := range events {
		if !rotated[i] {
			continue
		}
		k := events[i].aggregate()
		if k.compare(cur) > 0 {
			if !hasAfter || k.compare(after) > 0 {
				after, hasAfter = k, true
			}
		} else if !hasWrapped || k.compare(wrapped) > 0 {
			wrapped, hasWrapped = k, true
		}
	}
	if !hasAfter && !hasWrapped {
		return
	}
	next := after
	if hasWrapped {
		next = wrapped
	}
	r.cursorMu.Lock()
	r.cursor = next
	r.cursorMu.Unlock()
}

func (e *Event) aggregate() aggregateKey { return aggregateKey{e.AggregateType, e.AggregateID} }

// sortEvents orders a batch by aggregate (aggregates in order of their
// first row id) and each aggregate's events by sequence. Enqueue assigns
// ids and sequence numbers under the same lock, so they agree; the sort
// does not rely on it.
func sortEvents(events []Event) {
	first := map[aggregateKey]int64{}
	for i := range events {
		k := events[i].aggregate()
		if v, ok := first[k]; !ok || events[i].ID < v {
			first[k] = events[i].ID
		}
	}
	slices.SortFunc(events, func(a, b Event) int {
		if c := cmp.Compare(first[a.aggregate()], first[b.aggregate()]); c != 0 {
			return c
		}
		return cmp.Compare(a.Seq, b.Seq)
	})
}
