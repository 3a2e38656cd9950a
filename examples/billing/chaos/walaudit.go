package chaos

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/examples/billing/app"
	"github.com/idemkit/idem/outbox/wal"
)

// setupWAL names billing's slot after the run and creates the harness's
// audit slot before any billing instance starts, so that it decodes every
// event billing will write: the audit's list of events, in commit order,
// the WAL outbox's counterpart of the outbox table.
func (r *run) setupWAL(ctx context.Context) error {
	r.walSlot = r.runID
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, r.billingDB)
	if err != nil {
		return fmt.Errorf("chaos: wal audit slot: %w", err)
	}
	defer conn.Close(context.Background())
	var level string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil {
		return fmt.Errorf("chaos: wal audit slot: %w", err)
	}
	if level != "logical" {
		return fmt.Errorf("%w: OutboxMode wal needs wal_level=logical on billing's database (it is %s; --pg-restarts runs a cluster that has it)", ErrConfig, level)
	}
	// The publication first: pgoutput looks it up as of each decoded
	// transaction, so it must be older than the audit slot's start.
	// billing's start finds it and creates its own slot.
	if _, err := conn.Exec(ctx, "CREATE PUBLICATION "+r.walSlot); err != nil {
		return fmt.Errorf("chaos: wal publication: %w", err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", r.walSlot+"_audit"); err != nil {
		return fmt.Errorf("chaos: wal audit slot: %w", err)
	}
	return nil
}

// loadWALOutbox decodes, without consuming them, every event of billing's
// prefix from the audit slot, in commit order; Seq numbers each
// aggregate's events in that order.
func (r *run) loadWALOutbox(ctx context.Context) ([]outboxRow, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, r.billingDB)
	if err != nil {
		return nil, fmt.Errorf("chaos: wal audit: %w", err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT data FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
		'proto_version', '1', 'publication_names', $2, 'messages', 'true')`, r.walSlot+"_audit", r.walSlot)
	if err != nil {
		return nil, fmt.Errorf("chaos: wal audit: %w", err)
	}
	prefix := app.OutboxWALPrefix(r.walSlot)
	seq := map[[2]string]int64{}
	var out []outboxRow
	for rows.Next() {
		var data []byte
		if err := rows.Scan(&data); err != nil {
			return nil, fmt.Errorf("chaos: wal audit: %w", err)
		}
		m, err := pglogrepl.Parse(data)
		if err != nil {
			continue // a kind this audit does not read: not an event
		}
		lm, ok := m.(*pglogrepl.LogicalDecodingMessage)
		if !ok || lm.Prefix != prefix || !lm.Transactional {
			continue
		}
		msg, err := wal.DecodeMessage(lm.Content)
		if err != nil {
			return nil, fmt.Errorf("chaos: wal audit: %w", err)
		}
		k := [2]string{msg.AggregateType, msg.AggregateID}
		seq[k]++
		out = append(out, outboxRow{EventID: msg.EventID, Topic: msg.Topic, AggregateType: msg.AggregateType,
			AggregateID: msg.AggregateID, Seq: seq[k], EventType: msg.EventType, Status: "WAL", Payload: msg.Payload, FromWAL: true})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("chaos: wal audit: %w", err)
	}
	return out, nil
}

// walBehind says whether billing's relay still owes events ("" when not):
// its slot must have confirmed the WAL position that was current when the
// harness first asked, after the work had settled (so every event of the
// run lies before it). It is marked on the first call and kept until the
// slot reaches it.
func (r *run) walBehind(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, r.billingDB)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.Background())
	if r.walMark == "" {
		if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&r.walMark); err != nil {
			return "", err
		}
	}
	var behind *int64
	err = conn.QueryRow(ctx, "SELECT ($2::pg_lsn - confirmed_flush_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1",
		r.walSlot, r.walMark).Scan(&behind)
	if errors.Is(err, pgx.ErrNoRows) {
		return "billing's WAL outbox slot does not exist yet", nil
	}
	if err != nil {
		return "", err
	}
	if behind != nil && *behind > 0 {
		return fmt.Sprintf("billing's WAL outbox slot is %d bytes short of the run's end", *behind), nil
	}
	return "", nil
}

// walHolderPID is the process id of the billing instance whose relay
// reads billing's slot, 0 when none does (or it cannot be told): the
// relay's application_name ends with its owner, hostname-pid-random.
func (r *run) walHolderPID(ctx context.Context) int {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, r.billingDB)
	if err != nil {
		return 0
	}
	defer conn.Close(context.Background())
	var name string
	err = conn.QueryRow(ctx, `SELECT a.application_name FROM pg_replication_slots s
		JOIN pg_stat_activity a ON a.pid = s.active_pid WHERE s.slot_name = $1`, r.walSlot).Scan(&name)
	if err != nil {
		return 0
	}
	f := strings.Split(name, "-")
	if len(f) < 3 {
		return 0
	}
	pid, _ := strconv.Atoi(f[len(f)-2])
	return pid
}

// dropWAL drops billing's slot and publication and the audit slot, once
// no reader holds them (a stopped instance's walsender takes a moment to
// exit). A slot left behind would retain WAL for ever.
func (r *run) dropWAL() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, r.billingDB)
	if err != nil {
		r.progress.logf("could not drop the WAL outbox slots %s, %s_audit: %v", r.walSlot, r.walSlot, err)
		return
	}
	defer conn.Close(context.Background())
	for _, slot := range []string{r.walSlot, r.walSlot + "_audit"} {
		for {
			_, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", slot)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				r.progress.logf("could not drop the replication slot %s: %v", slot, err)
				break
			}
			time.Sleep(100 * time.Millisecond) // polling interval
		}
	}
	_, _ = conn.Exec(ctx, "DROP PUBLICATION IF EXISTS "+r.walSlot)
}
