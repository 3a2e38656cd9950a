package consume

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/backoff"
	"github.com/idemkit/idem/internal/startstop"
)

// DB is what a Consumer needs from PostgreSQL: transactions for the
// handler, and plain statements for inbox.Seen (Config.Prepare's check),
// which must not hold a transaction open. A *pgxpool.Pool satisfies it.
type DB interface {
	inbox.DBTX
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Consumer runs a Handler for every message a Driver fetches, in a
// database transaction that also records the event in processed_event
// (package inbox), and acknowledges the message to the broker only after
// that transaction committed. See the package doc for the guarantee.
//
// It satisfies lifecycle.Component and lifecycle.HardStopper.
type Consumer struct {
	db      backend
	driver  Driver
	inbox   *inbox.Inbox
	cfg     Config
	log     *slog.Logger
	backoff backoff.Policy
	// purger deletes old processed_event rows while the consumer runs;
	// nil with Config.DisablePurge.
	purger *inbox.Purger
	ss     startstop.Service
	// stopBy is the deadline of the ctx of the latest Stop or HardStop
	// call (UnixNano; 0 for none): the stop's last ack and the session's
	// Close are bounded by it (see Stop).
	stopBy atomic.Int64
}

// New validates cfg and returns a Consumer; nothing connects until Start.
// db runs the transactions, driver talks to the broker, handler applies
// each message.
func New(db DB, driver Driver, handler Handler, cfg *Config) (*Consumer, error) {
	switch {
	case db == nil:
		return nil, fmt.Errorf("%w: db is nil", ErrInvalidConfig)
	case handler == nil:
		return nil, fmt.Errorf("%w: handler is nil", ErrInvalidConfig)
	}
	return newConsumer(pgxBackend{db: db, h: handler}, driver, cfg)
}

func newConsumer(db backend, driver Driver, cfg *Config) (*Consumer, error) {
	if driver == nil {
		return nil, fmt.Errorf("%w: driver is nil", ErrInvalidConfig)
	}
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	c.setDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	ib, err := inbox.New(&inbox.Config{Form: c.InboxForm})
	if err != nil {
		return nil, fmt.Errorf("%w: InboxForm: %w", ErrInvalidConfig, err)
	}
	var purger *inbox.Purger
	if !c.DisablePurge {
		purger, err = inbox.NewPurger(db.purgeDB(), &inbox.PurgerConfig{
			Retention: c.Retention, PurgeInterval: c.PurgeInterval, PurgeBatchSize: c.PurgeBatchSize, Logger: c.Logger,
		})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	return &Consumer{
		db: db, driver: driver, inbox: ib, cfg: c, purger: purger,
		log:     c.Logger.With("consumer", c.ConsumerID),
		backoff: backoff.Policy{Min: c.BackoffMin, Max: c.BackoffMax},
	}, nil
}

// Start checks the dead-letter destinations when the driver can
// (DeadLetterChecker: a missing one is an error naming it), opens a
// session (Driver.Open) and processes messages on a goroutine until Stop
// or HardStop. ctx bounds the check and the opening and lends its values to
// the run; cancelling it after Start returned changes nothing. Start on a
// running Consumer does nothing; Start after a stop opens a fresh session.
func (c *Consumer) Start(ctx context.Context) error {
	return c.ss.Start(ctx, func(ctx context.Context, g *startstop.Group) error {
		c.stopBy.Store(0)
		if dc, ok := c.driver.(DeadLetterChecker); ok {
			if err := dc.CheckDeadLetter(ctx); err != nil {
				return err
			}
		}
		sess, err := c.driver.Open(ctx)
		if err != nil {
			return fmt.Errorf("consume: open session: %w", err)
		}
		r := newRun(c, sess, ctx)
		g.Go(ctx, r.loop)
		if c.purger != nil {
			// The purger lives as long as the run: soft-stopped with it
			// (the batch in flight commits), hard-stopped with it.
			if err := c.purger.Start(ctx); err != nil {
				return fmt.Errorf("consume: start the inbox purger: %w", err)
			}
			g.Go(ctx, func(ctx context.Context) {
				work, cancel := startstop.WorkContext(ctx)
				defer cancel()
				<-ctx.Done()
				if c.purger.Stop(work) != nil {
					_ = c.purger.HardStop(context.WithoutCancel(ctx))
				}
			})
		}
		return nil
	})
}

// Stop is the graceful stop: no new message is taken; the message (or
// batch) in hand finishes and commits; a message waiting between two
// attempts is abandoned (it is redelivered later, which is harmless); what
// is done is acked; the session is closed (the group left, so that another
// member takes the partitions over at once). Stop waits for all that, or
// returns ctx.Err() when ctx ends first (the run then goes on in the
// background; HardStop cuts it short). Safe before Start, twice and
// concurrently.
//
// The last ack and the session's Close are bounded by AckTimeout and, when
// ctx (of this call, or of a later Stop or HardStop) has a deadline, by
// that deadline too: an ack (the last one, or one in flight when the stop
// comes) by a third of the time left when the stop reaches it, the Close
// by three quarters of what is left then. A
// broker can hold an ack or a leave for long (a Kafka group rebalancing
// holds commits, and the leave, until every member it knows has rejoined,
// a SIGKILLed one included, which it waits for until its session times
// out). Giving such an ack up costs a re-read (the messages are in
// processed_event: their next owner skips them), and giving the leave up
// delays the hand-over to the broker's own timeout; waiting would cost
// the stop its budget.
func (c *Consumer) Stop(ctx context.Context) error {
	c.noteStop(ctx)
	return c.ss.Stop(ctx)
}

// noteStop records ctx's deadline as the stop's bound: the latest call's
// (a HardStop after a Stop that timed out gives the stop a new budget).
func (c *Consumer) noteStop(ctx context.Context) {
	var n int64
	if dl, ok := ctx.Deadline(); ok {
		n = dl.UnixNano()
	}
	c.stopBy.Store(n)
}

// stopContext is the ctx of an ack (share 1/3) or of the session's Close
// (3/4): AckTimeout, and once the soft stop has begun (now, or while the
// call is in flight: an ack that a rebalance holds when the stop comes),
// share of the time then left before the stop's bound.
func (r *run) stopContext(num, den int64) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.work), r.cfg.AckTimeout)
	var mu sync.Mutex
	var timer *time.Timer
	done := false
	unhook := context.AfterFunc(r.ctx, func() {
		by := r.c.stopBy.Load()
		if by == 0 {
			return
		}
		left := time.Until(time.Unix(0, by))
		mu.Lock()
		defer mu.Unlock()
		if !done {
			timer = time.AfterFunc(max(left*time.Duration(num)/time.Duration(den), 0), cancel)
		}
	})
	return ctx, func() {
		unhook()
		mu.Lock()
		done = true
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
		cancel()
	}
}

// HardStop is Stop that also cancels the work in hand: the handler's ctx
// ends, its transaction rolls back, and the message is redelivered later.
// What was done before is still acked and the session closed, each bounded
// by AckTimeout.
func (c *Consumer) HardStop(ctx context.Context) error {
	c.noteStop(ctx)
	return c.ss.HardStop(ctx)
}

// ConsumerID reports Config.ConsumerID.
func (c *Consumer) ConsumerID() string { return c.cfg.ConsumerID }

// run is one session's state, owned by the processing goroutine except
// where a field says otherwise.
type run struct {
	c    *Consumer
	cfg  *Config
	sess Session
	ctx  context.Context // ends at the soft stop
	work context.Context // ends at the hard stop
	stop context.CancelFunc

	done []*Message        // finished (DB committed or dead-lettered), not acked yet
	held map[string]*stuck // per stream: the message that holds it

	inflight sync.WaitGroup // background dead-letter attempts

	mu      sync.Mutex // guards results and wake: written by the background attempts
	results []dlResult
	wake    context.CancelFunc // ends the Fetch in progress
}

func newRun(c *Consumer, sess Session, ctx context.Context) *run {
	work, cancel := startstop.WorkContext(ctx)
	return &run{c: c, cfg: &c.cfg, sess: sess, ctx: ctx, work: work, stop: cancel, held: map[string]*stuck{}}
}

func (r *run) emit(ctx context.Context, e Event) context.Context {
	return idem.CallHook(r.cfg.Hook, ctx, e)
}

func (r *run) loop(ctx context.Context) {
	defer r.stop()
	defer r.finish()
	for {
		// A stuck message dead-lettered in the background is acked now,
		// before the Fetch: the ack is what ends its stream's hold.
		r.collect()
		r.ack()
		r.startDue()
		if ctx.Err() != nil {
			return
		}
		fctx, cancel := r.fetchContext()
		f, err := r.sess.Fetch(fctx)
		woken := fctx.Err() != nil
		cancel()
		r.revoke(f.Revoked)
		if err != nil && !woken {
			r.c.log.Warn("fetch", "err", err)
			if !r.sleep(r.c.backoff.Ceiling(2)) {
				return
			}
		}
		r.process(f.Messages)
		r.ack()
	}
}

// fetchContext is the ctx of one Fetch: it ends at the soft stop, when the
// next stuck message's retry is due, or when a background attempt reports.
func (r *run) fetchContext() (context.Context, context.CancelFunc) {
	fctx, cancel := context.WithCancel(r.ctx)
	if due := r.nextDue(); !due.IsZero() {
		var cancelDue context.CancelFunc
		fctx, cancelDue = context.WithDeadline(fctx, due)
		inner := cancel
		cancel = func() { cancelDue(); inner() }
	}
	// Publish the cancel before looking for results: a background attempt
	// appends its result and then cancels whatever wake holds, so either
	// this look sees its result or it cancels this Fetch.
	r.mu.Lock()
	r.wake = cancel
	pending := len(r.results) > 0
	r.mu.Unlock()
	if pending {
		cancel()
	}
	return fctx, cancel
}

// finish ends the run, step by step:
//  1. nothing is processed any more (the loop returned);
//  2. background dead-letter attempts are waited for (each bounded by
//     DeadLetterTimeout, cut short by a hard stop), and one that succeeded
//     is acked with the rest;
//  3. stuck messages are abandoned: unacked, they come back to the next
//     owner;
//  4. what is done is acked, bounded by AckTimeout even after a hard stop
//     (cheap, and it saves the next owner re-reading), and by the stop's
//     deadline (see Stop);
//  5. the session closes (leaves the group), bounded by AckTimeout and
//     the stop's deadline.
func (r *run) finish() {
	r.inflight.Wait()
	r.collect()
	for s, st := range r.held {
		delete(r.held, s)
		r.abandon(st.it, st.reported)
	}
	r.ack()
	ctx, cancel := r.stopContext(3, 4)
	defer cancel()
	if err := r.sess.Close(ctx); err != nil {
		r.c.log.Warn("close session", "err", err)
	}
}

// sleep waits d; false if the soft stop came first.
func (r *run) sleep(d time.Duration) bool {
	if d <= 0 {
		return r.ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.ctx.Done():
		return false
	}
}

// ack acknowledges what is done since the last ack. Its error only costs
// re-reads: see Session.Ack.
func (r *run) ack() {
	if len(r.done) == 0 {
		return
	}
	msgs := r.done
	r.done = nil
	ctx, cancel := r.stopContext(1, 3)
	defer cancel()
	start := time.Now()
	err := r.sess.Ack(ctx, msgs)
	e := newEvent(KindCommitted, r.cfg.ConsumerID, nil)
	e.Records, e.Duration, e.Err = len(msgs), time.Since(start), err
	r.emit(r.work, e)
	if err != nil {
		r.c.log.Warn("ack", "messages", len(msgs), "err", err)
	}
}

// revoke drops the stuck messages of streams the session lost.
func (r *run) revoke(streams []string) {
	for _, s := range streams {
		if st := r.held[s]; st != nil {
			delete(r.held, s)
			r.abandon(st.it, st.reported)
		}
	}
}
