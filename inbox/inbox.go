package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/inbox/internal/dbsqlc"
)

// DBTX is what MarkProcessedTx needs: a pgx.Tx in practice. It is the same
// shape as sqlc's generated DBTX, so a sqlc Queries' transaction fits.
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
	// ErrInvalidConfig wraps every Config validation error.
	ErrInvalidConfig = errors.New("inbox: invalid config")
)

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
func MarkProcessedTx(ctx context.Context, tx DBTX, consumerID, eventID string) (first bool, err error) {
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
func (ib *Inbox) MarkProcessedTx(ctx context.Context, tx DBTX, consumerID, eventID string) (first bool, err error) {
	if consumerID == "" {
		return false, ErrEmptyConsumerID
	}
	if eventID == "" {
		return false, ErrEmptyEventID
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
func (ib *Inbox) MarkProcessedBatchTx(ctx context.Context, tx DBTX, consumerID string, eventIDs []string) (first []bool, err error) {
	if consumerID == "" {
		return nil, ErrEmptyConsumerID
	}
	if len(eventIDs) == 0 {
		return nil, nil
	}
	for _, id := range eventIDs {
		if id == "" {
			return nil, ErrEmptyEventID
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
