package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem/internal/backoff"
	"github.com/idemkit/idem/internal/failpoint"
	"github.com/idemkit/idem/outbox/internal/dbsqlc"
)

// listenBackoff spaces the listener's reconnects.
var listenBackoff = backoff.Policy{Min: 50 * time.Millisecond, Max: 5 * time.Second}

// listen keeps a LISTEN connection open and turns notifications into
// wake-ups. On any connection failure it reconnects with backoff; after
// each (re)connect it wakes the loop once, because events committed while
// nobody listened sent their NOTIFY into the void.
func (r *Relay) listen(ctx context.Context) {
	for failures := 1; ; failures++ {
		connected, err := r.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if connected {
			failures = 1
		}
		r.log.WarnContext(ctx, "outbox relay listener; reconnecting", "error", err, "owner", r.cfg.Owner)
		r.emit(ctx, RelayEvent{Kind: RelayListenFailed, Err: err})
		t := time.NewTimer(listenBackoff.Delay(failures))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// listenOnce listens until the connection fails; connected says whether
// it got as far as LISTEN (which resets the reconnect backoff).
func (r *Relay) listenOnce(ctx context.Context) (connected bool, err error) {
	pc, err := r.pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("outbox: listener acquire: %w", err)
	}
	// Hijack: the connection leaves the pool for good, so that a session
	// in LISTEN state is never handed to other code, and closing it here
	// does not shrink the pool.
	conn := pc.Hijack()
	defer conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck
	if _, err := conn.Exec(ctx, "SELECT set_config('application_name', $1, false)",
		ListenerApplicationName(r.cfg.Owner)); err != nil {
		return false, fmt.Errorf("outbox: listener: %w", err)
	}
	// The channel is the database's: relays of outbox tables in other
	// schemas listen on it too. An enqueue's NOTIFY carries its table's
	// oid; an empty payload (the insert trigger of migrations before 006)
	// is anyone's.
	oid, err := dbsqlc.New(conn).OutboxTableOID(ctx)
	if err != nil {
		return false, fmt.Errorf("outbox: listener: %w", err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+NotifyChannel); err != nil {
		return false, fmt.Errorf("outbox: listen: %w", err)
	}
	r.listening.Store(true)
	defer r.listening.Store(false)
	r.wakeUp()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return true, fmt.Errorf("outbox: wait for notification: %w", err)
		}
		if n.Payload == oid || n.Payload == "" {
			r.wakeUp()
		}
	}
}

// ListenerApplicationName is the application_name of a relay's LISTEN
// connection: an operator finds a relay's listener in pg_stat_activity by
// it (SELECT … WHERE application_name = 'idem-outbox-listen <owner>').
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
// many it returned. The relay runs it every ReapInterval; ctx bounds it,
// and so does BatchTimeout.
func (r *Relay) Reap(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.BatchTimeout)
	defer cancel()
	rows, err := r.q.ReapLeases(ctx, dbsqlc.ReapLeasesParams{
		MaxAttempts: int32(r.cfg.MaxAttempts), TtlMs: r.cfg.LeaseTTL.Milliseconds(),
	})
	if err != nil {
		err = fmt.Errorf("outbox: reap: %w", err)
		r.emit(ctx, RelayEvent{Kind: RelayReaped, Err: err})
		return 0, err
	}
	// The sweep: blocked aggregates whose failed event is gone.
	if swept, err := r.sweep(ctx); err != nil {
		r.emit(ctx, RelayEvent{Kind: RelayReaped, Err: err})
		return int64(len(rows)), err
	} else if swept > 0 {
		r.wakeUp()
	}
	if len(rows) == 0 {
		return 0, nil
	}
	r.wakeUp()
	r.emit(ctx, RelayEvent{Kind: RelayReaped, Count: len(rows)})
	var dead []EventInfo
	for _, row := range rows {
		if row.Dead {
			dead = append(dead, EventInfo{ID: row.ID, EventID: row.EventID, EventType: row.EventType, Topic: row.Topic,
				AggregateType: row.AggregateType, AggregateID: row.AggregateID, Seq: row.AggregateSeq, Attempts: int(row.Attempts)})
		}
	}
	if len(dead) > 0 {
		var block aggSeqs
		for _, d := range dead {
			block.add(aggregateKey{d.AggregateType, d.AggregateID}, d.Seq)
		}
		if err := r.blockDead(ctx, block); err != nil {
			// The events are DEAD; unheld, they only cost the claim a look.
			r.log.WarnContext(ctx, "outbox reaper", "error", err)
		}
		r.log.WarnContext(ctx, "outbox events are DEAD (their leases expired): each holds back its aggregate until Requeue",
			"owner", r.cfg.Owner, "events", len(dead))
		r.emit(ctx, RelayEvent{Kind: RelayDead, Count: len(dead), Events: dead})
	}
	return int64(len(rows)), nil
}

func (r *Relay) purgeLoop(ctx context.Context) {
	r.every(ctx, r.cfg.PurgeInterval, func(ctx context.Context) {
		if _, err := r.Purge(ctx); err != nil && ctx.Err() == nil {
			r.log.WarnContext(ctx, "outbox purge", "error", err)
		}
	})
}

// Purge deletes PUBLISHED rows older than Retention, PurgeBatchSize rows
// per statement (short transactions, no long locks), until none are left
// or ctx ends, and reports how many it deleted. Each statement is bounded
// by BatchTimeout. The relay runs it every PurgeInterval.
//
// A crash between two statements leaves the rest for the next run: each
// statement deletes only rows that are PUBLISHED and old, so a partial
// purge is a smaller purge, and the claim's per-aggregate check treats a
// purged predecessor as published.
func (r *Relay) Purge(ctx context.Context) (int64, error) {
	start := time.Now()
	total, err := r.purge(ctx)
	if total > 0 || err != nil {
		r.emit(ctx, RelayEvent{Kind: RelayPurged, Count: int(total), Duration: time.Since(start), Err: err})
	}
	return total, err
}

func (r *Relay) purge(ctx context.Context) (int64, error) {
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
		// Crash window: one batch is deleted (committed), the next is not.
		if err := failpoint.Inject(failpoint.PurgeMidBatch); err != nil {
			return total, err
		}
	}
	return total, nil
}
