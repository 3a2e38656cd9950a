package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/inbox/internal/dbsqlc"
	"github.com/idemkit/idem/internal/sqlpgx"
)

// DBTX runs statements: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx. It is
// what Seen, Purge and NewPurger need (each statement commits on its own
// when given a pool), and the same shape as sqlc's generated DBTX. The
// functions whose name ends in Tx take a pgx.Tx instead: their name is the
// promise that they write inside the caller's transaction; those ending
// in SQLTx take a database/sql *sql.Tx and run the same statements.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Form selects the SQL statement that records an event.
type Form string

const (
	// FormDoNothing is INSERT … ON CONFLICT DO NOTHING, judged by rows
	// affected (1 = first, 0 = repeat). A repeat writes nothing.
	FormDoNothing Form = "do-nothing"
	// FormDoUpdate is INSERT … ON CONFLICT DO UPDATE … RETURNING (xmax = 0).
	// A repeat rewrites the row: a dead tuple and a row lock per duplicate.
	FormDoUpdate Form = "do-update"

	// FormDefault is the form chosen by measurement; see the package doc.
	FormDefault = FormDoNothing
)

var (
	// ErrEmptyConsumerID is returned for an empty consumer id.
	ErrEmptyConsumerID = errors.New("inbox: empty consumer id")
	// ErrEmptyEventID is returned for an empty event id.
	ErrEmptyEventID = errors.New("inbox: empty event id")
	// ErrInvalidEventID is returned (wrapped, with the reason) for an event
	// id that processed_event cannot hold: not valid UTF-8, containing
	// NUL, or longer than MaxEventIDBytes. PostgreSQL would refuse it on
	// every attempt (SQLSTATE 22021, or 54000 over the btree limit of about
	// 2.7 KB), so no retry can help: it is the message's fault.
	ErrInvalidEventID = errors.New("inbox: invalid event id")
	// ErrInvalidConfig wraps every Config validation error.
	ErrInvalidConfig = errors.New("inbox: invalid config")
	// ErrNilTx is returned by the functions whose name ends in Tx for a
	// nil transaction: nothing is written or read.
	ErrNilTx = errors.New("inbox: nil transaction")
)

// MaxEventIDBytes bounds an event id. It is the outbox's bound on the ids
// it publishes (outbox.MaxFieldBytes, 1,024 bytes), well below the ~2.7 KB
// that a btree entry of processed_event's primary key can hold.
const MaxEventIDBytes = 1024

// ValidateEventID reports whether processed_event can hold eventID:
// ErrEmptyEventID for "", an error wrapping ErrInvalidEventID for one that
// is not valid UTF-8, contains NUL or is longer than MaxEventIDBytes, nil
// otherwise. MarkProcessedTx, MarkProcessedBatchTx, SeenTx and Seen check
// it before touching the database; a consumer calls it to tell a message
// that can never be recorded from a database that is down.
func ValidateEventID(eventID string) error {
	switch {
	case eventID == "":
		return ErrEmptyEventID
	case len(eventID) > MaxEventIDBytes:
		return fmt.Errorf("%w: %d bytes, more than %d", ErrInvalidEventID, len(eventID), MaxEventIDBytes)
	case !utf8.ValidString(eventID):
		return fmt.Errorf("%w: not valid UTF-8 (%s)", ErrInvalidEventID, idPrefix(eventID))
	case strings.ContainsRune(eventID, 0):
		return fmt.Errorf("%w: contains NUL (%s)", ErrInvalidEventID, idPrefix(eventID))
	}
	return nil
}

// idPrefix quotes the start of a bad id for an error text: escaped, so
// that the text itself is valid UTF-8 and short.
func idPrefix(id string) string {
	const n = 32
	if len(id) > n {
		return fmt.Sprintf("%+q…", id[:n])
	}
	return fmt.Sprintf("%+q", id)
}

// Config configures an Inbox. A nil *Config means all defaults.
type Config struct {
	// Form is the SQL statement used to record an event. Both forms give
	// the same answers; they differ in what a duplicate costs. Defaults to
	// FormDefault (FormDoNothing).
	Form Form
}

func (c *Config) validate() error {
	switch c.Form {
	case FormDoNothing, FormDoUpdate:
		return nil
	}
	return fmt.Errorf("%w: Form %q: want %q or %q", ErrInvalidConfig, c.Form, FormDoNothing, FormDoUpdate)
}

// Inbox records processed events with one SQL form. It holds no connection:
// every call runs on the transaction it is given. Safe for concurrent use.
type Inbox struct {
	form Form
}

// New returns an Inbox. A nil cfg means all defaults.
func New(cfg *Config) (*Inbox, error) {
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	if c.Form == "" {
		c.Form = FormDefault
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &Inbox{form: c.Form}, nil
}

// Form reports the SQL form in use.
func (ib *Inbox) Form() Form { return ib.form }

var defaultInbox = &Inbox{form: FormDefault}

// MarkProcessedTx records that consumerID has processed eventID, in tx, and
// reports whether this is the first time. It is MarkProcessedTx of an Inbox
// with the default Form.
func MarkProcessedTx(ctx context.Context, tx pgx.Tx, consumerID, eventID string) (first bool, err error) {
	return defaultInbox.MarkProcessedTx(ctx, tx, consumerID, eventID)
}

// MarkProcessedTx records that consumerID has processed eventID and reports
// whether this is the first time (true) or a repeat (false).
//
// Atomicity: the row is written in tx, so it commits or rolls back together
// with the handler's own writes in tx. Call it first in the transaction and
// skip the handler's work when first is false. If tx rolls back, the event
// counts as never processed and its next delivery gets first == true.
//
// Concurrency: two transactions marking the same event at once serialize on
// the primary key; the second waits for the first to end, then gets false if
// the first committed and true if it rolled back. Exactly one of them sees
// first == true per committed row.
//
// ctx governs the statement.
func (ib *Inbox) MarkProcessedTx(ctx context.Context, tx pgx.Tx, consumerID, eventID string) (first bool, err error) {
	if tx == nil {
		return false, ErrNilTx
	}
	return ib.mark(ctx, tx, consumerID, eventID)
}

// MarkProcessedSQLTx is MarkProcessedTx of an Inbox with the default Form,
// for a database/sql transaction.
func MarkProcessedSQLTx(ctx context.Context, tx *sql.Tx, consumerID, eventID string) (first bool, err error) {
	return defaultInbox.MarkProcessedSQLTx(ctx, tx, consumerID, eventID)
}

// MarkProcessedSQLTx is MarkProcessedTx for a database/sql transaction
// (lib/pq, pgx's stdlib driver, or an ORM's *sql.Tx): the same statement
// of ib's Form, with the same atomicity and concurrency. A nil tx is
// ErrNilTx; a tx already committed or rolled back is an error wrapping
// sql.ErrTxDone, and nothing is written.
func (ib *Inbox) MarkProcessedSQLTx(ctx context.Context, tx *sql.Tx, consumerID, eventID string) (first bool, err error) {
	if tx == nil {
		return false, ErrNilTx
	}
	return ib.mark(ctx, sqlpgx.DB{Q: tx}, consumerID, eventID)
}

func (ib *Inbox) mark(ctx context.Context, tx DBTX, consumerID, eventID string) (first bool, err error) {
	if consumerID == "" {
		return false, ErrEmptyConsumerID
	}
	if err := ValidateEventID(eventID); err != nil {
		return false, err
	}
	q := dbsqlc.New(tx)
	switch ib.form {
	case FormDoUpdate:
		first, err = q.MarkDoUpdate(ctx, dbsqlc.MarkDoUpdateParams{ConsumerID: consumerID, EventID: eventID})
	default:
		var n int64
		n, err = q.MarkDoNothing(ctx, dbsqlc.MarkDoNothingParams{ConsumerID: consumerID, EventID: eventID})
		first = n == 1
	}
	if err != nil {
		return false, fmt.Errorf("inbox: mark %s/%s: %w", consumerID, eventID, err)
	}
	return first, nil
}

// MarkProcessedBatchTx is MarkProcessedTx for many events in one statement:
// first[i] tells whether eventIDs[i] is seen for the first time. An id that
// appears twice in eventIDs is first at most at its earliest position. The
// same atomicity and concurrency rules as MarkProcessedTx apply to each id.
func (ib *Inbox) MarkProcessedBatchTx(ctx context.Context, tx pgx.Tx, consumerID string, eventIDs []string) (first []bool, err error) {
	if tx == nil {
		return nil, ErrNilTx
	}
	return ib.markBatch(ctx, tx, consumerID, eventIDs)
}

// MarkProcessedBatchSQLTx is MarkProcessedBatchTx for a database/sql
// transaction; see MarkProcessedSQLTx.
func (ib *Inbox) MarkProcessedBatchSQLTx(ctx context.Context, tx *sql.Tx, consumerID string, eventIDs []string) (first []bool, err error) {
	if tx == nil {
		return nil, ErrNilTx
	}
	return ib.markBatch(ctx, sqlpgx.DB{Q: tx}, consumerID, eventIDs)
}

func (ib *Inbox) markBatch(ctx context.Context, tx DBTX, consumerID string, eventIDs []string) (first []bool, err error) {
	if consumerID == "" {
		return nil, ErrEmptyConsumerID
	}
	if len(eventIDs) == 0 {
		return nil, nil
	}
	for i, id := range eventIDs {
		if err := ValidateEventID(id); err != nil {
			return nil, fmt.Errorf("inbox: event %d: %w", i, err)
		}
	}
	q := dbsqlc.New(tx)
	inserted := make(map[string]bool, len(eventIDs))
	switch ib.form {
	case FormDoUpdate:
		// DO UPDATE may not touch a row twice in one command.
		distinct := make([]string, 0, len(eventIDs))
		seen := make(map[string]bool, len(eventIDs))
		for _, id := range eventIDs {
			if !seen[id] {
				seen[id] = true
				distinct = append(distinct, id)
			}
		}
		rows, qerr := q.MarkBatchDoUpdate(ctx, dbsqlc.MarkBatchDoUpdateParams{ConsumerID: consumerID, EventIds: distinct})
		err = qerr
		for _, r := range rows {
			inserted[r.EventID] = r.Inserted
		}
	default:
		ids, qerr := q.MarkBatchDoNothing(ctx, dbsqlc.MarkBatchDoNothingParams{ConsumerID: consumerID, EventIds: eventIDs})
		err = qerr
		for _, id := range ids {
			inserted[id] = true
		}
	}
	if err != nil {
		return nil, fmt.Errorf("inbox: mark %d events of %s: %w", len(eventIDs), consumerID, err)
	}
	first = make([]bool, len(eventIDs))
	for i, id := range eventIDs {
		if inserted[id] {
			first[i] = true
			inserted[id] = false // a later repeat in the batch is not first
		}
	}
	return first, nil
}

// SeenTx reports whether consumerID's processed_event row for eventID is
// visible in tx: committed by another transaction (as of tx's snapshot
// under REPEATABLE READ, as of the statement under READ COMMITTED), or
// written earlier in tx itself. It only reads: it neither writes nor locks,
// so it is no substitute for MarkProcessedTx, which alone decides whether
// the event is new. Use it to skip work that must not run inside a
// transaction for an event already processed (a consumer's Prepare step).
func SeenTx(ctx context.Context, tx pgx.Tx, consumerID, eventID string) (bool, error) {
	if tx == nil {
		return false, ErrNilTx
	}
	return seen(ctx, tx, consumerID, eventID)
}

// SeenSQLTx is SeenTx for a database/sql transaction. A nil tx is
// ErrNilTx.
func SeenSQLTx(ctx context.Context, tx *sql.Tx, consumerID, eventID string) (bool, error) {
	if tx == nil {
		return false, ErrNilTx
	}
	return seen(ctx, sqlpgx.DB{Q: tx}, consumerID, eventID)
}

// SeenSQL is Seen on a *sql.DB: one statement outside any transaction,
// with Seen's caveat (decide in MarkProcessedSQLTx).
func SeenSQL(ctx context.Context, db *sql.DB, consumerID, eventID string) (bool, error) {
	if db == nil {
		return false, ErrNilTx
	}
	return seen(ctx, sqlpgx.DB{Q: db}, consumerID, eventID)
}

// Seen is SeenTx outside a transaction: one statement on db (a pool), which
// sees every row committed before it started and none in progress. An
// answer of false can be stale by the time the caller acts on it (another
// consumer may be committing the event right now): decide in
// MarkProcessedTx.
func Seen(ctx context.Context, db DBTX, consumerID, eventID string) (bool, error) {
	return seen(ctx, db, consumerID, eventID)
}

func seen(ctx context.Context, db DBTX, consumerID, eventID string) (bool, error) {
	if consumerID == "" {
		return false, ErrEmptyConsumerID
	}
	if err := ValidateEventID(eventID); err != nil {
		return false, err
	}
	ok, err := dbsqlc.New(db).Seen(ctx, dbsqlc.SeenParams{ConsumerID: consumerID, EventID: eventID})
	if err != nil {
		return false, fmt.Errorf("inbox: read %s/%s: %w", consumerID, eventID, err)
	}
	return ok, nil
}
