package outbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/outbox/internal/dbsqlc"
)

// aggSeqs lists aggregates, each with a sequence number in it.
type aggSeqs struct {
	types, ids []string
	seqs       []int64
}

func (a *aggSeqs) add(k aggregateKey, seq int64) {
	a.types = append(a.types, k.typ)
	a.ids = append(a.ids, k.id)
	a.seqs = append(a.seqs, seq)
}

func (a *aggSeqs) empty() bool { return len(a.types) == 0 }

// settlement is what a batch changes in the blocked aggregates (see the
// package doc, "Blocked aggregates"): an aggregate with a failed event is
// blocked at that event; one whose delivered events include one that had
// failed before (Attempts > 0) may have been blocked by it, and is
// released after it.
func settlement(events []Event, o *outcome) (block, release aggSeqs) {
	failed := map[aggregateKey]bool{}
	for _, i := range o.failed {
		k := events[i].aggregate()
		if !failed[k] {
			failed[k] = true
			block.add(k, events[i].Seq)
		}
	}
	released := map[aggregateKey]bool{}
	for _, i := range o.ok {
		k := events[i].aggregate()
		if events[i].Attempts > 0 && !failed[k] && !released[k] {
			released[k] = true
			release.add(k, events[i].Seq)
		}
	}
	return block, release
}

// settle records block and release in q's transaction: the counter rows
// of every aggregate involved are locked first, in one statement, and the
// flags and held events change in the statements after it (the reason is
// in queries.sql, at LockAggregates). q must be in a transaction.
func settle(ctx context.Context, q *dbsqlc.Queries, block, release aggSeqs) error {
	if block.empty() && release.empty() {
		return nil
	}
	lock := dbsqlc.LockAggregatesParams{
		AggregateTypes: append(append([]string(nil), release.types...), block.types...),
		AggregateIds:   append(append([]string(nil), release.ids...), block.ids...),
	}
	if err := q.LockAggregates(ctx, lock); err != nil {
		return fmt.Errorf("outbox: lock aggregates: %w", err)
	}
	if !release.empty() {
		if err := q.ReleaseAggregates(ctx, dbsqlc.ReleaseAggregatesParams{
			AggregateTypes: release.types, AggregateIds: release.ids, Seqs: release.seqs,
		}); err != nil {
			return fmt.Errorf("outbox: release aggregates: %w", err)
		}
	}
	if !block.empty() {
		if err := q.BlockAggregates(ctx, dbsqlc.BlockAggregatesParams{
			AggregateTypes: block.types, AggregateIds: block.ids, Seqs: block.seqs,
		}); err != nil {
			return fmt.Errorf("outbox: block aggregates: %w", err)
		}
	}
	return nil
}

// sweepMaxRows bounds one sweep.
const sweepMaxRows = 1000

// sweep releases blocked aggregates that no longer have a failed event:
// the relay releases an aggregate when it delivers the failed event, but
// a crash between that mark and the release, or a failed event removed by
// other means, would leave the later events held for ever. It returns how
// many aggregates it released.
func (r *Relay) sweep(ctx context.Context) (int, error) {
	var n int
	// beginClaim: OrphanBlocked's plan is as dear as a claim's.
	err := pgx.BeginTxFunc(ctx, r.pool, pgx.TxOptions{BeginQuery: beginClaim}, func(tx pgx.Tx) error {
		q := r.q.WithTx(tx)
		rows, err := q.OrphanBlocked(ctx, sweepMaxRows) // locks them
		if err != nil || len(rows) == 0 {
			return err
		}
		var rel aggSeqs
		for _, row := range rows {
			rel.add(aggregateKey{row.AggregateType, row.AggregateID}, 0)
		}
		n = len(rows)
		return q.ReleaseAggregates(ctx, dbsqlc.ReleaseAggregatesParams{
			AggregateTypes: rel.types, AggregateIds: rel.ids, Seqs: rel.seqs,
		})
	})
	if err != nil {
		return 0, fmt.Errorf("outbox: sweep blocked aggregates: %w", err)
	}
	return n, nil
}

// blockDead blocks the aggregates of events the reaper turned DEAD, in a
// transaction of its own.
func (r *Relay) blockDead(ctx context.Context, block aggSeqs) error {
	return pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		return settle(ctx, r.q.WithTx(tx), block, aggSeqs{})
	})
}
