package wal

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// visibility tells whether decoded transactions are visible yet to a new
// snapshot on the server, through a plain (not replication) connection of
// its own, opened when first needed. Only the stream's publisher uses it.
//
// Why it is needed: PostgreSQL writes and flushes a transaction's commit
// record, wakes the WAL senders, and only then removes the transaction
// from the set of running ones; until that last step a new snapshot does
// not see the transaction's writes. Logical decoding reads the WAL up to
// the flush position, so the relay can receive a commit, and publish its
// events, before the transaction is visible: a consumer that reacts to
// an event by reading what its transaction wrote (a charge worker
// settling the payment the event names) finds nothing. Most of the time
// the gap is microseconds; a committing backend that loses the CPU makes
// it milliseconds, and one waiting for a synchronous standby
// (synchronous_standby_names) stays in it until the standby answers.
// The table outbox cannot do this: its relay claims a row only through a
// snapshot that sees it.
type visibility struct {
	cfg  *pgconn.Config
	conn *pgconn.PgConn
}

// visiblePollMin and visiblePollMax bound the pause between two looks at
// the snapshot while a transaction is not visible yet; the pause doubles
// from the first to the second.
const (
	visiblePollMin = 100 * time.Microsecond
	visiblePollMax = 100 * time.Millisecond
)

// await returns once every transaction of xids is visible to a new
// snapshot, or with an error when ctx ends first or the server cannot be
// asked. onWait, if not nil, is called once, at the first look that finds
// one not visible yet.
func (v *visibility) await(ctx context.Context, xids []uint32, onWait func(notVisible int)) error {
	pause := visiblePollMin
	for first := true; ; first = false {
		snap, err := v.snapshot(ctx)
		if err != nil {
			return err
		}
		n := 0
		for _, x := range xids {
			if !snap.visible(x) {
				n++
			}
		}
		if n == 0 {
			return nil
		}
		if first && onWait != nil {
			onWait(n)
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("outbox/wal: waiting for %d decoded transactions to become visible: %w", n, ctx.Err())
		case <-t.C:
		}
		pause = min(2*pause, visiblePollMax)
	}
}

func (v *visibility) snapshot(ctx context.Context) (snapshot, error) {
	if v.conn == nil || v.conn.IsClosed() {
		c, err := pgconn.ConnectConfig(ctx, v.cfg)
		if err != nil {
			return snapshot{}, fmt.Errorf("outbox/wal: visibility: connect: %w", err)
		}
		v.conn = c
	}
	res, err := v.conn.Exec(ctx, "SELECT pg_current_snapshot()").ReadAll()
	if err == nil && (len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 1) {
		err = errors.New("not one value")
	}
	if err != nil {
		v.close()
		return snapshot{}, fmt.Errorf("outbox/wal: visibility: pg_current_snapshot: %w", err)
	}
	return parseSnapshot(string(res[0].Rows[0][0]))
}

func (v *visibility) close() {
	if v.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = v.conn.Close(ctx)
	v.conn = nil
}

// snapshot is pg_current_snapshot()'s value: full (epoch-extended)
// transaction ids, everything below xmin finished, everything from xmax
// on not yet, and xip the ones between still running.
type snapshot struct {
	xmin, xmax uint64
	xip        []uint64
}

// parseSnapshot reads pg_snapshot's text form, "xmin:xmax:xip,xip,...".
func parseSnapshot(s string) (snapshot, error) {
	bad := func() (snapshot, error) { return snapshot{}, fmt.Errorf("outbox/wal: visibility: snapshot %q", s) }
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return bad()
	}
	var sn snapshot
	var err error
	if sn.xmin, err = strconv.ParseUint(parts[0], 10, 64); err != nil {
		return bad()
	}
	if sn.xmax, err = strconv.ParseUint(parts[1], 10, 64); err != nil || sn.xmax < sn.xmin {
		return bad()
	}
	if parts[2] != "" {
		for _, f := range strings.Split(parts[2], ",") {
			x, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				return bad()
			}
			sn.xip = append(sn.xip, x)
		}
	}
	return sn, nil
}

// visible tells whether the transaction of 32-bit id xid (pgoutput's
// Begin carries no epoch) has committed visibly in the snapshot. The id is
// widened to the full id nearest xmax: a transaction just decoded is
// never 2^31 ids away from the server's current one.
func (s snapshot) visible(xid uint32) bool {
	full := int64(s.xmax) + int64(int32(xid-uint32(s.xmax)))
	switch {
	case full < int64(s.xmin):
		return true
	case full >= int64(s.xmax):
		return false
	}
	return !slices.Contains(s.xip, uint64(full))
}
