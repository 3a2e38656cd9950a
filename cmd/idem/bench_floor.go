package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// A floor is what no subject can beat on the same server and the same
// work: sql-floor for the table relays, wal-floor for the WAL relay. A
// subject that beats its floor by more than the run's noise means the
// floor measures something else, and every ratio to it is wrong: the
// bench then fails, naming both (benchFloorCheck).

// benchFloorRounds is how many interleaved rounds a floor and its
// subjects run: at least two, so that the run measures its own noise.
const benchFloorRounds = 2

// errBeatsFloor is the failure of a subject faster than its floor.
var errBeatsFloor = errors.New("a subject beats its floor")

// benchSpread is a variant's noise over its rounds: (max-min)/min of its
// per-round rates, 0 with fewer than two rounds.
func benchSpread(rates []float64) float64 {
	if len(rates) < 2 {
		return 0
	}
	lo, hi := slices.Min(rates), slices.Max(rates)
	if lo <= 0 {
		return 0
	}
	return (hi - lo) / lo
}

// benchFloorCheck compares each subject's per-round rates (events/s) with
// its floor's, same run, rounds interleaved. The run's noise is the
// largest spread of the floor's and the subjects' rounds. A subject whose
// best round beats the floor's best round by more than that noise is a
// failure: one line on log naming the subject and its floor, and an error
// wrapping errBeatsFloor (the bench exits non-zero).
func benchFloorCheck(log io.Writer, floor string, rounds map[string][]float64, subjects []string) error {
	noise := benchSpread(rounds[floor])
	for _, s := range subjects {
		noise = max(noise, benchSpread(rounds[s]))
	}
	fbest := slices.Max(append([]float64{0}, rounds[floor]...))
	var errs []error
	for _, s := range subjects {
		if len(rounds[s]) == 0 || fbest <= 0 {
			continue
		}
		best := slices.Max(rounds[s])
		if best > fbest*(1+noise) {
			err := fmt.Errorf("%w: %s (best round %.0f/s) beats its floor %s (best round %.0f/s) by %.0f%%, more than the run's noise (%.0f%%, the largest spread of %d interleaved rounds): %s is not a floor",
				errBeatsFloor, s, best, floor, fbest, (best/fbest-1)*100, noise*100, len(rounds[floor]), floor)
			fmt.Fprintf(log, "FLOOR BEATEN: %v\n", err)
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 && fbest > 0 {
		fmt.Fprintf(log, "%s holds: no subject beats it by more than the run's noise (%.0f%%)\n", floor, noise*100)
	}
	return errors.Join(errs...)
}

// benchWALPluginArgs are the WAL relay's options to pgoutput
// (outbox/wal's stream): the raw floor reads with the same ones.
func benchWALPluginArgs(publication string) []string {
	return []string{"proto_version '1'", "publication_names '" + publication + "'", "messages 'true'"}
}

// benchWALRaw is wal-floor's one round: the raw logical-decoding rate of
// slot. It connects for replication (as the relay does, connection
// included in the time), streams the slot with the relay's plugin and
// options, counts the logical decoding messages of prefix until want
// have come and the transaction of the last one has committed, and
// acknowledges the stream as it goes (status updates, answers to
// keepalives) and at the end. It decodes nothing of idem's encoding and
// publishes nothing: what remains is the server's decoding and the wire,
// which every relay of this slot pays too.
func benchWALRaw(ctx context.Context, dbURL, slot, publication, prefix string, want int) (time.Duration, error) {
	cfg, err := pgconn.ParseConfig(dbURL)
	if err != nil {
		return 0, err
	}
	cfg.RuntimeParams["replication"] = "database"
	t0 := time.Now()
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return 0, fmt.Errorf("wal-floor: connect: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if err := pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{PluginArgs: benchWALPluginArgs(publication)}); err != nil {
		return 0, fmt.Errorf("wal-floor: start replication: %w", err)
	}
	const statusEvery = 10 * time.Second
	status := func(pos pglogrepl.LSN) error {
		return pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{
			WALWritePosition: pos, WALFlushPosition: pos, WALApplyPosition: pos, ClientTime: time.Now()})
	}
	// Reads wait on the socket's deadline, as the relay's do, not on a
	// context per message.
	stopWatch := context.AfterFunc(ctx, func() { _ = conn.Conn().SetReadDeadline(time.Now()) })
	defer stopWatch()
	if err := conn.Conn().SetReadDeadline(time.Now().Add(10 * time.Minute)); err != nil {
		return 0, err
	}
	var (
		confirmed pglogrepl.LSN // the end of the last committed transaction
		n         int
		last      = time.Now()
	)
	for {
		msg, err := conn.ReceiveMessage(context.Background())
		if err != nil {
			if ctx.Err() != nil {
				return 0, ctx.Err()
			}
			return 0, fmt.Errorf("wal-floor: receive (%d of %d messages): %w", n, want, err)
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok {
			if e, ok := msg.(*pgproto3.ErrorResponse); ok {
				return 0, fmt.Errorf("wal-floor: stream: %w", pgconn.ErrorResponseToPgError(e))
			}
			continue
		}
		if len(cd.Data) == 0 {
			continue
		}
		switch cd.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(cd.Data[1:])
			if err != nil {
				return 0, err
			}
			if ka.ReplyRequested {
				if err := status(confirmed); err != nil {
					return 0, err
				}
			}
		case pglogrepl.XLogDataByteID:
			xld, err := pglogrepl.ParseXLogData(cd.Data[1:])
			if err != nil || len(xld.WALData) == 0 {
				return 0, fmt.Errorf("wal-floor: xlogdata: %v", err)
			}
			// Only the pgoutput message kind is looked at: 'M' (a logical
			// decoding message, to tell ours by its prefix) and 'C' (a
			// commit, the position to confirm).
			switch xld.WALData[0] {
			case 'M':
				lm, err := pglogrepl.Parse(xld.WALData)
				if err != nil {
					return 0, err
				}
				if m, ok := lm.(*pglogrepl.LogicalDecodingMessage); ok && m.Prefix == prefix {
					n++
				}
			case 'C':
				lm, err := pglogrepl.Parse(xld.WALData)
				if err != nil {
					return 0, err
				}
				if c, ok := lm.(*pglogrepl.CommitMessage); ok {
					confirmed = c.TransactionEndLSN
				}
				if n >= want {
					elapsed := time.Since(t0)
					if err := status(confirmed); err != nil {
						return 0, err
					}
					_ = conn.Conn().SetDeadline(time.Now().Add(5 * time.Second)) // CopyDone reads without a context
					_, _ = pglogrepl.SendStandbyCopyDone(ctx, conn)
					return elapsed, nil
				}
			}
		}
		if time.Since(last) >= statusEvery {
			if err := status(confirmed); err != nil {
				return 0, err
			}
			last = time.Now()
		}
	}
}

// benchRates prints per-round rates for the log.
func benchRates(rates []float64) string {
	s := ""
	for i, r := range rates {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%.0f", r)
	}
	return s
}

// benchBatchRounds splits a variant's batches (events and milliseconds of
// each, in the order they ran) into n consecutive rounds of about equal
// batch counts and returns each round's rate, events/s.
func benchBatchRounds(counts []int, ms []float64, n int) []float64 {
	if len(counts) < n {
		n = len(counts)
	}
	var out []float64
	for r := range n {
		lo, hi := r*len(counts)/n, (r+1)*len(counts)/n
		events, t := 0, 0.0
		for i := lo; i < hi; i++ {
			events += counts[i]
			t += ms[i]
		}
		if t > 0 {
			out = append(out, float64(events)/(t/1000))
		}
	}
	return out
}
