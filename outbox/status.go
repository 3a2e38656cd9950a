package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem/outbox/internal/dbsqlc"
)

// Status is a snapshot of the outbox table.
type Status struct {
	Pending    int64 `json:"pending"`
	Publishing int64 `json:"publishing"`
	Published  int64 `json:"published"`
	Dead       int64 `json:"dead"`
	// Discarded counts events an operator discarded (Admin.Discard).
	Discarded int64 `json:"discarded"`
	// ExpiredLeases counts PUBLISHING rows older than the lease TTL given
	// to GetStatus: the reaper will return them.
	ExpiredLeases int64 `json:"expired_leases"`
	// OldestPending is the age of the oldest PENDING event, 0 if none.
	OldestPending time.Duration `json:"-"`
	// OldestPendingSeconds is OldestPending for JSON.
	OldestPendingSeconds float64 `json:"oldest_pending_seconds"`
	// DeadEvents lists up to the requested number of DEAD events.
	DeadEvents []DeadEvent `json:"dead_events"`
}

// DeadEvent is an event that used up its attempts. It holds back every
// later event of its aggregate until Requeue.
type DeadEvent struct {
	EventID       string    `json:"event_id"`
	Topic         string    `json:"topic"`
	AggregateType string    `json:"aggregate_type"`
	AggregateID   string    `json:"aggregate_id"`
	Seq           int64     `json:"seq"`
	EventType     string    `json:"event_type"`
	Attempts      int       `json:"attempts"`
	LastError     string    `json:"last_error"`
	CreatedAt     time.Time `json:"created_at"`
}

// GetStatus reads counts by status, the oldest pending age, the number of
// PUBLISHING leases older than leaseTTL, and up to maxDead DEAD events.
func GetStatus(ctx context.Context, db DBTX, leaseTTL time.Duration, maxDead int) (*Status, error) {
	q := dbsqlc.New(db)
	row, err := q.Status(ctx, leaseTTL.Milliseconds())
	if err != nil {
		return nil, fmt.Errorf("outbox: status: %w", err)
	}
	st := &Status{
		Pending: row.Pending, Publishing: row.Publishing, Published: row.Published, Dead: row.Dead, Discarded: row.Discarded,
		ExpiredLeases:        row.ExpiredLeases,
		OldestPending:        time.Duration(row.OldestPendingSeconds * float64(time.Second)),
		OldestPendingSeconds: row.OldestPendingSeconds,
		DeadEvents:           []DeadEvent{},
	}
	if maxDead > 0 && row.Dead > 0 {
		dead, err := q.DeadEvents(ctx, int32(maxDead))
		if err != nil {
			return nil, fmt.Errorf("outbox: dead events: %w", err)
		}
		for _, d := range dead {
			st.DeadEvents = append(st.DeadEvents, DeadEvent{
				EventID: d.EventID, Topic: d.Topic, AggregateType: d.AggregateType, AggregateID: d.AggregateID,
				Seq: d.AggregateSeq, EventType: d.EventType, Attempts: int(d.Attempts), LastError: d.LastError,
				CreatedAt: d.CreatedAt.Time,
			})
		}
	}
	return st, nil
}

// Requeue returns DEAD events to PENDING with their attempts reset, so
// that they (and the events of their aggregates they held back) are
// published again. It reports how many it requeued; ids that are unknown
// or not DEAD are skipped. Admin.Requeue does the same for one event,
// with an actor and a reason in the audit trail and an error that says
// why an event was not requeued.
func Requeue(ctx context.Context, db DBTX, eventIDs ...string) (int64, error) {
	rows, err := NewAdmin(db).change(ctx, func(q *dbsqlc.Queries) ([]changedRow, error) {
		rs, err := q.Requeue(ctx, dbsqlc.RequeueParams{EventIds: eventIDs})
		out := make([]changedRow, len(rs))
		for i, r := range rs {
			out[i] = changedRow{r.EventID, r.AggregateType, r.AggregateID, r.AggregateSeq}
		}
		return out, err
	})
	if err != nil {
		return 0, fmt.Errorf("outbox: requeue: %w", err)
	}
	return int64(len(rows)), nil
}
