package outbox

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/backoff"
	"github.com/idemkit/idem/outbox/internal/dbsqlc"
)

// The doorbell decides when an enqueue sends the NOTIFY that wakes relays:
// only while a relay sleeps. The enqueue's side is in its statement
// (EnqueueOne's comment in the queries explains the locks and why every
// committed event is either rung for or seen by a relay's last claim); the
// relay's side is here. A NOTIFY per enqueuing transaction, the way the
// first outbox sent it, made PostgreSQL serialize every such commit of the
// server: the outbox then cost a business transaction 0.30 of its
// throughput, and a relay that is busy needs no wake-up at all.

// Arm outcomes (ArmDoorbell's state).
const (
	bellArmed  = "armed" // this relay holds both locks: enqueues ring
	bellBusy   = "busy"  // an enqueue that rang nothing is uncommitted
	bellOther  = "other" // another relay is armed: its NOTIFY wakes this one too
	bellFailed = ""      // the doorbell's connection failed: poll
)

// busyPoll spaces the polls of a relay that could not arm because enqueues
// were in flight: traffic, so the next claim will likely find it. The
// relay waits the policy's ceiling (doubling from Min to Max), without the
// jitter of Delay: it is alone with this delay (no herd to spread), and the
// delay bounds latency.
var busyPoll = backoff.Policy{Min: time.Millisecond, Max: 16 * time.Millisecond}

// doorbell is the relay loop's session for the doorbell locks: session
// advisory locks, so a connection of their own, taken from the pool and
// never returned to it (like the listener's). Only the loop goroutine uses
// it. A failed statement closes the connection, which drops whatever lock
// it held; the next arm opens another.
type doorbell struct {
	conn *pgx.Conn
	q    *dbsqlc.Queries
	// opened says that the relay has armed or tried to: other relays may
	// sleep behind it (see leave).
	opened bool
}

// DoorbellApplicationName is the application_name of a relay's doorbell
// connection (see ListenerApplicationName).
func DoorbellApplicationName(owner string) string { return "idem-outbox-doorbell " + owner }

// arm runs ArmDoorbell, on a new connection if the one it has fails: a
// connection cut while the relay was awake (its backend terminated, a
// proxy's idle timeout) is found only by the next statement on it, and a
// relay that then slept unarmed would not be rung by the next enqueue (it
// would wait for PollInterval). It fails only when a new connection does.
func (b *doorbell) arm(ctx context.Context, r *Relay) string {
	b.opened = true
	for {
		fresh := b.conn == nil
		if fresh {
			pc, err := r.pool.Acquire(ctx)
			if err != nil {
				return bellFailed
			}
			b.conn = pc.Hijack()
			b.q = dbsqlc.New(b.conn)
			if _, err := b.conn.Exec(ctx, "SELECT set_config('application_name', $1, false)",
				DoorbellApplicationName(r.cfg.Owner)); err != nil {
				b.close(ctx)
				return bellFailed
			}
		}
		state, err := b.q.ArmDoorbell(ctx)
		if err == nil {
			return state
		}
		b.close(ctx)
		if fresh || ctx.Err() != nil {
			return bellFailed
		}
	}
}

// watch watches the doorbell's connection while the relay sleeps armed:
// a cut connection (its backend terminated, the server restarted) took
// the lock with it, so enqueues ring nobody, and nothing else would wake
// the relay before its PollInterval. cut is closed when the connection
// fails; stop ends the watch and returns once the connection is the
// loop's again. The watch is a read on the idle session, which the server
// answers only by closing it (it LISTENs to nothing), ended by a read
// deadline in the past, which leaves the connection usable.
func (b *doorbell) watch() (cut <-chan struct{}, stop func()) {
	c, done := make(chan struct{}), make(chan struct{})
	pc := b.conn.PgConn()
	var stopping atomic.Bool
	go func() {
		defer close(done)
		for {
			err := pc.WaitForNotification(context.Background())
			if err == nil {
				continue // a LISTEN of the session's past in the pool: not a cut
			}
			if !stopping.Load() {
				close(c)
			}
			return
		}
	}()
	return c, func() {
		stopping.Store(true)
		_ = pc.Conn().SetReadDeadline(time.Now())
		<-done
		_ = pc.Conn().SetReadDeadline(time.Time{})
	}
}

// disarm runs even when ctx has ended (the loop disarms on its way out
// too), bounded by disarmTimeout; a failure closes the connection, which
// lets the locks go as well.
func (b *doorbell) disarm(ctx context.Context) {
	if b.conn == nil {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), disarmTimeout)
	defer cancel()
	if err := b.q.DisarmDoorbell(dctx); err != nil {
		b.close(ctx)
	}
}

const disarmTimeout = 5 * time.Second

// leave ends the doorbell when the loop returns. A relay that has armed
// rings the bell on its way out, armed or not: relays that went to sleep
// because it was armed ('other') rely on it to take the last look before
// each of its own sleeps, and would otherwise sleep through events
// committed after it left (nobody armed, nobody rings) until their
// PollInterval. That holds when it leaves unarmed too: it may have woken
// by other means than a NOTIFY (its poll, its listener's reconnect, the
// reaper), which did not wake them, or been stopped in the middle of an
// arm that took the locks. It lets its locks go first, so that a relay
// the bell wakes can arm in its place; without a doorbell connection
// (its last arm failed) it rings on one of the pool's.
func (b *doorbell) leave(ctx context.Context, r *Relay, armed bool) {
	if !b.opened {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), disarmTimeout)
	defer cancel()
	if armed {
		b.disarm(dctx)
	}
	if b.conn != nil {
		err := b.q.RingDoorbell(dctx)
		b.close(ctx)
		if err == nil {
			return
		}
	}
	_ = r.q.RingDoorbell(dctx)
}

func (b *doorbell) close(ctx context.Context) {
	if b.conn == nil {
		return
	}
	_ = b.conn.Close(context.WithoutCancel(ctx))
	b.conn, b.q = nil, nil
}
