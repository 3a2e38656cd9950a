package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem/outbox/internal/dbsqlc"
)

// listen keeps a LISTEN connection open and turns notifications into
// wake-ups. On any connection failure it reconnects with backoff; after
// each (re)connect it wakes the loop once, because events committed while
// nobody listened sent their NOTIFY into the void.
func (r *Relay) listen(ctx context.Context) {
	delay := 50 * time.Millisecond
	for {
		err := r.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		r.log.WarnContext(ctx, "outbox relay listener; reconnecting", "error", err, "owner", r.cfg.Owner)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		delay = min(2*delay, 5*time.Second)
	}
}

func (r *Relay) listenOnce(ctx context.Context) error {
	pc, err := r.db.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("outbox: listener acquire: %w", err)
	}
	// Hijack: the connection leaves the pool for good, so that a session
	// in LISTEN state is never handed to other code, and closing it here
	// does not shrink the pool.
	conn := pc.Hijack()
	defer conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck
	if _, err := conn.Exec(ctx, "SELECT set_config('application_name', $1, false)",
		ListenerApplicationName(r.cfg.Owner)); err != nil {
		return fmt.Errorf("outbox: listener: %w", err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+NotifyChannel); err != nil {
		return fmt.Errorf("outbox: listen: %w", err)
	}
	r.wakeUp()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return fmt.Errorf("outbox: wait for notification: %w", err)
		}
		r.wakeUp()
	}
}

// ListenerApplicationName is the application_name of a relay's LISTEN
// connection, for finding it in pg_stat_activity.
func ListenerApplicationName(owner string) string { return "idem-outbox-listen " + owner }

func (r *Relay) every(ctx context.Context, d time.Duration, f func(context.Context)) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f(ctx)
		}
	}
}

// reapLoop returns expired PUBLISHING leases to PENDING (or DEAD when the
// attempts are used up). It runs in both modes: an at-least-once relay may
// share a table with two-phase ones.
func (r *Relay) reapLoop(ctx context.Context) {
	r.every(ctx, r.cfg.ReapInterval, func(ctx context.Context) {
		if _, err := r.Reap(ctx); err != nil && ctx.Err() == nil {
			r.log.WarnContext(ctx, "outbox reaper", "error", err)
		}
	})
}

// Reap returns PUBLISHING rows whose lease is older than LeaseTTL to
// PENDING, attempts preserved (DEAD if they are used up), and reports how
// many it returned. The relay runs it every ReapInterval.
func (r *Relay) Reap(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.BatchTimeout)
	defer cancel()
	n, err := r.q.ReapLeases(ctx, dbsqlc.ReapLeasesParams{
		MaxAttempts: int32(r.cfg.MaxAttempts), TtlMs: r.cfg.LeaseTTL.Milliseconds(),
	})
	if err != nil {
		return 0, fmt.Errorf("outbox: reap: %w", err)
	}
	if n > 0 {
		r.wakeUp()
	}
	return n, nil
}

func (r *Relay) purgeLoop(ctx context.Context) {
	r.every(ctx, r.cfg.PurgeInterval, func(ctx context.Context) {
		if _, err := r.Purge(ctx); err != nil && ctx.Err() == nil {
			r.log.WarnContext(ctx, "outbox purger", "error", err)
		}
	})
}

// Purge deletes PUBLISHED rows older than Retention, PurgeBatchSize rows
// per statement (short transactions, no long locks), until none are left
// or ctx ends, and reports how many it deleted. The relay runs it every
// PurgeInterval.
func (r *Relay) Purge(ctx context.Context) (int64, error) {
	var total int64
	for ctx.Err() == nil {
		sctx, cancel := context.WithTimeout(ctx, r.cfg.BatchTimeout)
		n, err := r.q.PurgePublished(sctx, dbsqlc.PurgePublishedParams{
			RetentionMs: r.cfg.Retention.Milliseconds(), BatchSize: int32(r.cfg.PurgeBatchSize),
		})
		cancel()
		if err != nil {
			return total, fmt.Errorf("outbox: purge: %w", err)
		}
		total += n
		if n < int64(r.cfg.PurgeBatchSize) {
			break
		}
	}
	return total, nil
}
