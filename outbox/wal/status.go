package wal

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/outbox"
)

// SlotStatus is a snapshot of a relay's replication slot, from
// pg_replication_slots and pg_stat_replication.
type SlotStatus struct {
	Slot string `json:"slot"`
	// Active: a relay is reading the slot now; ActivePID is its server
	// process.
	Active    bool `json:"active"`
	ActivePID int  `json:"active_pid,omitempty"`
	// LagBytes is how far the slot's confirmed position is behind the
	// server's current WAL position: WAL written since the last event the
	// relay confirmed (events not yet published are in it).
	LagBytes int64 `json:"lag_bytes"`
	// RetainedBytes is the WAL the slot keeps from being recycled (from
	// its restart position): what a stopped relay costs in disk.
	RetainedBytes int64 `json:"retained_bytes"`
	// FlushLag is pg_stat_replication.flush_lag of the reading relay: how
	// long ago the WAL it last confirmed was written. 0 when caught up or
	// when no relay reads the slot.
	FlushLag time.Duration `json:"-"`
	// FlushLagSeconds is FlushLag for JSON.
	FlushLagSeconds float64 `json:"flush_lag_seconds"`
	// WALStatus is pg_replication_slots.wal_status: reserved, extended,
	// unreserved (past max_slot_wal_keep_size: about to lose WAL) or lost
	// (the slot can no longer be read: events in the lost WAL are gone).
	WALStatus string `json:"wal_status"`
	// SafeWALSize is how many more bytes can be written before the slot
	// is lost under max_slot_wal_keep_size; nil when that is unlimited (-1,
	// the default).
	SafeWALSize *int64 `json:"safe_wal_size"`
}

// GetSlotStatus reads slot's status on db (any connection to the slot's
// database), or ErrSlotNotFound.
func GetSlotStatus(ctx context.Context, db outbox.DBTX, slot string) (*SlotStatus, error) {
	var st SlotStatus
	var pid *int32
	var lagSec *float64
	err := db.QueryRow(ctx, `
		SELECT s.slot_name::text, s.active, s.active_pid,
			COALESCE((pg_current_wal_lsn() - s.confirmed_flush_lsn)::bigint, 0),
			COALESCE((pg_current_wal_lsn() - s.restart_lsn)::bigint, 0),
			EXTRACT(epoch FROM r.flush_lag)::float8,
			COALESCE(s.wal_status, ''), s.safe_wal_size
		FROM pg_replication_slots s
		LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid
		WHERE s.slot_name = $1`, slot).Scan(
		&st.Slot, &st.Active, &pid, &st.LagBytes, &st.RetainedBytes, &lagSec, &st.WALStatus, &st.SafeWALSize)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: %s", ErrSlotNotFound, slot)
	}
	if err != nil {
		return nil, fmt.Errorf("outbox/wal: slot status: %w", err)
	}
	if pid != nil {
		st.ActivePID = int(*pid)
	}
	if lagSec != nil {
		st.FlushLagSeconds = *lagSec
		st.FlushLag = time.Duration(*lagSec * float64(time.Second))
	}
	return &st, nil
}

// Lag is the relay's own view of its slot's lag.
type Lag struct {
	// Bytes is SlotStatus.LagBytes.
	Bytes int64
	// Age is the age of the oldest committed event this relay has read
	// and not yet delivered; 0 when none, or when it is a standby.
	Age time.Duration
}

// lagMeasureMin is the least time one lag measure is given.
const lagMeasureMin = 5 * time.Second

// lagLoop measures the slot every LagInterval on a connection of its own
// (not the replication one, which is streaming), emits RelaySlotLag and
// warns past the thresholds.
func (r *Relay) lagLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.LagInterval)
	defer t.Stop()
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			_ = conn.Close(context.Background())
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		lag, err := r.measure(ctx, &conn)
		if ctx.Err() != nil {
			return
		}
		r.emit(ctx, outbox.RelayEvent{Kind: outbox.RelaySlotLag, LagBytes: lag.Bytes, LagAge: lag.Age, Err: err})
		if err == nil && (lag.Bytes > r.cfg.LagWarnBytes || lag.Age > r.cfg.LagWarnAge) {
			r.log.WarnContext(ctx, "outbox/wal slot lag past its threshold", "slot", r.slotName(),
				"lag_bytes", lag.Bytes, "lag_age", lag.Age, "warn_bytes", r.cfg.LagWarnBytes, "warn_age", r.cfg.LagWarnAge)
		}
	}
}

func (r *Relay) measure(ctx context.Context, conn **pgx.Conn) (Lag, error) {
	var lag Lag
	r.mu.Lock()
	if r.prog != nil {
		if t := r.prog.oldest(); !t.IsZero() {
			lag.Age = max(time.Since(t), 0)
		}
	}
	r.mu.Unlock()
	// One measure may take up to LagInterval, but never less than
	// lagMeasureMin: a connect and one query on a loaded server take longer
	// than a short interval, and a measure that always times out reports
	// nothing but errors. The ticker drops the ticks a slow measure spans.
	qctx, cancel := context.WithTimeout(ctx, max(r.cfg.LagInterval, lagMeasureMin))
	defer cancel()
	if *conn == nil || (*conn).IsClosed() {
		cc, err := pgx.ParseConfig(r.connString)
		if err != nil {
			return lag, fmt.Errorf("outbox/wal: lag: %w", err)
		}
		c, err := pgx.ConnectConfig(qctx, cc)
		if err != nil {
			return lag, fmt.Errorf("outbox/wal: lag: %w", err)
		}
		*conn = c
	}
	st, err := GetSlotStatus(qctx, *conn, r.slotName())
	if err != nil {
		_ = (*conn).Close(context.Background())
		*conn = nil
		return lag, err
	}
	lag.Bytes = st.LagBytes
	return lag, nil
}
