package wal

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/sqlpgx"
	"github.com/idemkit/idem/outbox"
)

// EnqueueTx writes msgs into tx's WAL as transactional logical decoding
// messages of prefix PrefixDefault, one pg_logical_emit_message call each
// (one statement for the whole slice), and returns their event ids
// (generated where empty) in order. It has outbox.EnqueueTx's signature,
// so code written against one takes the other; use an Enqueuer for
// another prefix.
//
// Trace context: as with outbox.EnqueueTx, when ctx carries an
// outbox.Propagator its headers are added to each message
// (outbox.InjectHeaders).
//
// Atomicity: the messages are part of tx. PostgreSQL decodes them only
// when tx commits, and never if it rolls back. No row is written and no
// lock is taken: a WAL relay reads them from its replication slot.
//
// Ordering: a relay receives transactions in commit order, and the
// messages of one transaction in the order they were written. That is a
// total order over the whole database, so the events of one aggregate are
// in commit order without a sequence counter. Two transactions that
// enqueue for one aggregate without otherwise conflicting may commit in
// either order: lock the aggregate's row (as the state change usually
// does) when the order of their events matters.
//
// A message written before the relay's slot exists is never decoded:
// start the relay (which creates the slot) before the first EnqueueTx.
func EnqueueTx(ctx context.Context, tx pgx.Tx, msgs ...outbox.Message) ([]string, error) {
	return defaultEnqueuer.EnqueueTx(ctx, tx, msgs...)
}

var defaultEnqueuer = Enqueuer{Prefix: PrefixDefault}

// An Enqueuer writes messages with its Prefix, which must match the
// Config.Prefix of the relay that is to publish them: a relay reads only
// its prefix. Several services sharing a database keep their events apart
// by prefix (each with its own slot). The zero value uses PrefixDefault.
type Enqueuer struct {
	// Prefix is the logical decoding message prefix, at most PrefixMaxLen
	// bytes of UTF-8 without NUL. Defaults to PrefixDefault.
	Prefix string
}

// EnqueueTx is the package's EnqueueTx with e's prefix. An invalid prefix
// is an error wrapping ErrInvalidConfig.
func (e Enqueuer) EnqueueTx(ctx context.Context, tx pgx.Tx, msgs ...outbox.Message) ([]string, error) {
	if tx == nil {
		return nil, fmt.Errorf("%w: tx is nil", ErrInvalidConfig)
	}
	return e.enqueue(ctx, tx, msgs)
}

func (e Enqueuer) enqueue(ctx context.Context, db outbox.DBTX, msgs []outbox.Message) ([]string, error) {
	prefix := e.Prefix
	if prefix == "" {
		prefix = PrefixDefault
	}
	if err := checkPrefix(prefix); err != nil {
		return nil, err
	}
	if len(msgs) == 0 {
		return nil, nil
	}
	// The table outbox's rules, from the one function both modes share, so
	// that an event valid in one mode is valid in the other.
	if err := outbox.ValidateMessages(msgs...); err != nil {
		return nil, err
	}
	ids := make([]string, len(msgs))
	contents := make([][]byte, len(msgs))
	for i, m := range msgs {
		if m.EventID == "" {
			m.EventID = outbox.NewEventID()
		}
		m.Headers = outbox.InjectHeaders(ctx, m.Headers) // m is a copy: the caller's map is not changed
		ids[i] = m.EventID
		contents[i] = encode(&m)
	}
	var err error
	if len(contents) == 1 {
		_, err = db.Exec(ctx, "SELECT pg_logical_emit_message(true, $1, $2::bytea)", prefix, contents[0])
	} else {
		// Volatile functions in the select list run after the sort, so the
		// messages are written in slice order.
		_, err = db.Exec(ctx, `SELECT pg_logical_emit_message(true, $1, m)
			FROM unnest($2::bytea[]) WITH ORDINALITY AS t(m, i) ORDER BY i`, prefix, contents)
	}
	if err != nil {
		return nil, fmt.Errorf("outbox/wal: enqueue: %w", err)
	}
	return ids, nil
}

// EnqueueSQLTx is EnqueueTx for a database/sql transaction (lib/pq, pgx's
// stdlib driver, or an ORM's *sql.Tx), with the same statement, order,
// validation (outbox.ErrInvalidMessage) and atomicity. A nil tx is an
// error wrapping ErrInvalidConfig, as for EnqueueTx; a tx already
// committed or rolled back is an error wrapping sql.ErrTxDone, and nothing
// is written.
func EnqueueSQLTx(ctx context.Context, tx *sql.Tx, msgs ...outbox.Message) ([]string, error) {
	return defaultEnqueuer.EnqueueSQLTx(ctx, tx, msgs...)
}

// EnqueueSQLTx is the package's EnqueueSQLTx with e's prefix.
func (e Enqueuer) EnqueueSQLTx(ctx context.Context, tx *sql.Tx, msgs ...outbox.Message) ([]string, error) {
	if tx == nil {
		return nil, fmt.Errorf("%w: tx is nil", ErrInvalidConfig)
	}
	return e.enqueue(ctx, sqlpgx.DB{Q: tx}, msgs)
}

// Enqueue is EnqueueTx for events that describe no other write: its one
// statement runs on db (a pool or a connection) as a transaction of its
// own, so the slice is written whole or not at all, and commits before it
// returns. Events that must commit with a state change belong in that
// change's transaction: use EnqueueTx.
func Enqueue(ctx context.Context, db outbox.DBTX, msgs ...outbox.Message) ([]string, error) {
	return defaultEnqueuer.Enqueue(ctx, db, msgs...)
}

// Enqueue is the package's Enqueue with e's prefix.
func (e Enqueuer) Enqueue(ctx context.Context, db outbox.DBTX, msgs ...outbox.Message) ([]string, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: db is nil", ErrInvalidConfig)
	}
	return e.enqueue(ctx, db, msgs)
}

func storable(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

func checkPrefix(p string) error {
	if p == "" || len(p) > PrefixMaxLen || !storable(p) {
		return fmt.Errorf("%w: Prefix must be 1..%d bytes of UTF-8 without NUL", ErrInvalidConfig, PrefixMaxLen)
	}
	return nil
}
