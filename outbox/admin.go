package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemkit/idem/outbox/internal/dbsqlc"
)

// Statuses of an outbox event, as stored.
const (
	StatusPending    = "PENDING"
	StatusPublishing = "PUBLISHING"
	StatusPublished  = "PUBLISHED"
	StatusDead       = "DEAD"
	// StatusDiscarded is the terminal state an operator gives a DEAD event
	// that must never be delivered (Admin.Discard). It counts as done for
	// its aggregate's order: the events it held back are published.
	StatusDiscarded = "DISCARDED"
)

// Errors of the admin operations. Use errors.Is.
var (
	// ErrEventNotFound: no outbox event has the given event id (it never
	// existed, or it was published and purged).
	ErrEventNotFound = errors.New("outbox: event not found")
	// ErrWrongState: the event is not in a state the action applies to
	// (requeue of a PUBLISHED event, a second discard). The error is a
	// *StateError that names the event and its status.
	ErrWrongState = errors.New("outbox: event is in the wrong state for this action")
	// ErrReasonRequired: Discard was called without a reason.
	ErrReasonRequired = errors.New("outbox: a reason is required")
	// ErrInvalidFilter: a ListFilter field is out of range (an unknown
	// status, a negative limit); the error names the field.
	ErrInvalidFilter = errors.New("outbox: invalid filter")
)

// StateError says why an action was refused: the event's status at that
// moment. It unwraps to ErrWrongState.
type StateError struct {
	EventID string
	Action  string // "requeue" or "discard"
	Status  string // the status found
}

func (e *StateError) Error() string {
	return fmt.Sprintf("outbox: cannot %s event %s: it is %s, not DEAD", e.Action, e.EventID, e.Status)
}

// Unwrap makes errors.Is(err, ErrWrongState) true.
func (e *StateError) Unwrap() error { return ErrWrongState }

// Admin is the operator's view of the outbox table: list and inspect
// events, requeue DEAD ones, discard the ones that must never be
// delivered. Every change is guarded by the event's status (so concurrent
// operators cannot both act on one event) and appended to the row's audit
// trail. It is what `idem outbox` and the console use.
type Admin struct {
	db DBTX
}

// NewAdmin returns an Admin over db (a pool, a connection or a
// transaction: each method is one statement).
func NewAdmin(db DBTX) *Admin { return &Admin{db: db} }

// Action says who does an admin action and why; both are recorded in the
// row's audit trail. Text is cut to 1 KiB and made valid UTF-8 without NUL.
type Action struct {
	Actor  string
	Reason string
}

// AuditEntry is one operator action in an event's trail.
type AuditEntry struct {
	Action string    `json:"action"`
	Actor  string    `json:"actor"`
	Reason string    `json:"reason"`
	From   string    `json:"from"`
	At     time.Time `json:"at"`
}

// EventRecord is one outbox row as an operator sees it.
type EventRecord struct {
	ID            int64             `json:"id"`
	EventID       string            `json:"event_id"`
	Topic         string            `json:"topic"`
	AggregateType string            `json:"aggregate_type"`
	AggregateID   string            `json:"aggregate_id"`
	Seq           int64             `json:"seq"`
	EventType     string            `json:"event_type"`
	Status        string            `json:"status"`
	Attempts      int               `json:"attempts"`
	LastError     string            `json:"last_error"`
	Headers       map[string]string `json:"headers"`
	// Payload is the stored payload. In JSON it is "payload" when it is a
	// JSON document, else "payload_base64".
	Payload     []byte       `json:"-"`
	AvailableAt time.Time    `json:"available_at"`
	LeaseOwner  string       `json:"lease_owner,omitempty"`
	LockedAt    *time.Time   `json:"locked_at,omitempty"`
	CreatedAt   time.Time    `json:"created_at"`
	PublishedAt *time.Time   `json:"published_at,omitempty"`
	Audit       []AuditEntry `json:"audit"`
}

// PayloadIsJSON reports whether the payload is a JSON document.
func (e *EventRecord) PayloadIsJSON() bool { return len(e.Payload) > 0 && json.Valid(e.Payload) }

// MarshalJSON writes the payload as JSON when it is JSON, else as base64.
func (e EventRecord) MarshalJSON() ([]byte, error) {
	type plain EventRecord
	out := struct {
		plain
		Payload       json.RawMessage `json:"payload,omitempty"`
		PayloadBase64 []byte          `json:"payload_base64,omitempty"`
	}{plain: plain(e)}
	if e.PayloadIsJSON() {
		out.Payload = e.Payload
	} else {
		out.PayloadBase64 = e.Payload
	}
	return json.Marshal(out)
}

// ListFilter selects events for List. Zero fields match everything.
type ListFilter struct {
	// Status is one of the Status* constants, or empty for any.
	Status        string
	AggregateType string
	AggregateID   string
	Topic         string
	// AfterID lists events with a row id above it (paging: pass the last
	// ID of the previous page).
	AfterID int64
	// Limit bounds the result. Defaults to ListLimitDefault; at most
	// ListLimitMax.
	Limit int
}

// Bounds of ListFilter.Limit.
const (
	ListLimitDefault = 50
	ListLimitMax     = 10000
)

// ValidStatus reports whether s is one of the Status* constants.
func ValidStatus(s string) bool {
	switch s {
	case StatusPending, StatusPublishing, StatusPublished, StatusDead, StatusDiscarded:
		return true
	}
	return false
}

func narg(s string) pgtype.Text { return pgtype.Text{String: s, Valid: s != ""} }

// List returns the events that match f, in enqueue (row id) order.
func (a *Admin) List(ctx context.Context, f ListFilter) ([]EventRecord, error) {
	if f.Status != "" && !ValidStatus(f.Status) {
		return nil, fmt.Errorf("%w: Status %q is not PENDING, PUBLISHING, PUBLISHED, DEAD or DISCARDED", ErrInvalidFilter, f.Status)
	}
	if f.Limit < 0 || f.Limit > ListLimitMax {
		return nil, fmt.Errorf("%w: Limit %d is not in 0..%d", ErrInvalidFilter, f.Limit, ListLimitMax)
	}
	if f.Limit == 0 {
		f.Limit = ListLimitDefault
	}
	rows, err := dbsqlc.New(a.db).ListEvents(ctx, dbsqlc.ListEventsParams{
		AfterID: f.AfterID, Status: narg(f.Status), AggregateType: narg(f.AggregateType),
		AggregateID: narg(f.AggregateID), Topic: narg(f.Topic), MaxRows: int32(f.Limit),
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: list: %w", err)
	}
	out := make([]EventRecord, 0, len(rows))
	for _, r := range rows {
		out = append(out, eventRecord(dbsqlc.ShowEventRow(r)))
	}
	return out, nil
}

// Show returns one event by its event id, or ErrEventNotFound.
func (a *Admin) Show(ctx context.Context, eventID string) (*EventRecord, error) {
	r, err := dbsqlc.New(a.db).ShowEvent(ctx, eventID)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: %q", ErrEventNotFound, eventID)
	}
	if err != nil {
		return nil, fmt.Errorf("outbox: show: %w", err)
	}
	e := eventRecord(r)
	return &e, nil
}

func eventRecord(r dbsqlc.ShowEventRow) EventRecord {
	e := EventRecord{
		ID: r.ID, EventID: r.EventID, Topic: r.Topic, AggregateType: r.AggregateType, AggregateID: r.AggregateID,
		Seq: r.AggregateSeq, EventType: r.EventType, Status: r.Status, Attempts: int(r.Attempts),
		LastError: r.LastError, Headers: decodeHeaders(r.Headers), Payload: r.Payload,
		AvailableAt: r.AvailableAt.Time, LeaseOwner: r.LeaseOwner.String, CreatedAt: r.CreatedAt.Time,
		Audit: []AuditEntry{},
	}
	if e.Headers == nil {
		e.Headers = map[string]string{}
	}
	if r.LockedAt.Valid {
		t := r.LockedAt.Time
		e.LockedAt = &t
	}
	if r.PublishedAt.Valid {
		t := r.PublishedAt.Time
		e.PublishedAt = &t
	}
	if len(r.Audit) > 0 {
		_ = json.Unmarshal(r.Audit, &e.Audit) // written only by this package's queries
	}
	return e
}

// Requeue returns one DEAD event to PENDING with its attempts reset, so
// that it (and the later events of its aggregate it held back) is
// published again, and records act in its audit trail. It returns
// ErrEventNotFound for an unknown id and a *StateError (ErrWrongState) for
// an event that is not DEAD — including one that a concurrent Requeue
// has just requeued: of two concurrent requeues of one event exactly one
// succeeds.
func (a *Admin) Requeue(ctx context.Context, eventID string, act Action) error {
	rows, err := a.change(ctx, func(q *dbsqlc.Queries) ([]changedRow, error) {
		rs, err := q.Requeue(ctx, dbsqlc.RequeueParams{
			EventIds: []string{eventID}, Actor: auditText(act.Actor), Reason: auditText(act.Reason),
		})
		out := make([]changedRow, len(rs))
		for i, r := range rs {
			out[i] = changedRow{r.EventID, r.AggregateType, r.AggregateID, r.AggregateSeq}
		}
		return out, err
	})
	if err != nil {
		return fmt.Errorf("outbox: requeue: %w", err)
	}
	if len(rows) == 1 {
		return nil
	}
	return a.refusal(ctx, eventID, "requeue")
}

// RequeueDead requeues every DEAD event that matches f (its Status must be
// empty or DEAD; AfterID and Limit are ignored) and returns their event
// ids.
func (a *Admin) RequeueDead(ctx context.Context, f ListFilter, act Action) ([]string, error) {
	if f.Status != "" && f.Status != StatusDead {
		return nil, fmt.Errorf("%w: Status %q: only DEAD events are requeued", ErrInvalidFilter, f.Status)
	}
	rows, err := a.change(ctx, func(q *dbsqlc.Queries) ([]changedRow, error) {
		rs, err := q.RequeueDead(ctx, dbsqlc.RequeueDeadParams{
			Actor: auditText(act.Actor), Reason: auditText(act.Reason),
			AggregateType: narg(f.AggregateType), AggregateID: narg(f.AggregateID), Topic: narg(f.Topic),
		})
		out := make([]changedRow, len(rs))
		for i, r := range rs {
			out[i] = changedRow{r.EventID, r.AggregateType, r.AggregateID, r.AggregateSeq}
		}
		return out, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: requeue: %w", err)
	}
	ids := make([]string, len(rows))
	for i, r := range rows {
		ids[i] = r.EventID
	}
	return ids, nil
}

// Discard gives a DEAD event the terminal status DISCARDED: it is never
// published, the later events of its aggregate are (the head check counts
// it as done), and the row stays with its payload and the audit entry.
// act.Reason is required (ErrReasonRequired). It returns ErrEventNotFound
// or a *StateError for an event that is not DEAD (a second discard, a
// PENDING event that a relay may be publishing).
func (a *Admin) Discard(ctx context.Context, eventID string, act Action) error {
	if strings.TrimSpace(act.Reason) == "" {
		return ErrReasonRequired
	}
	rows, err := a.change(ctx, func(q *dbsqlc.Queries) ([]changedRow, error) {
		rs, err := q.Discard(ctx, dbsqlc.DiscardParams{
			EventID: eventID, Actor: auditText(act.Actor), Reason: auditText(act.Reason),
		})
		out := make([]changedRow, len(rs))
		for i, r := range rs {
			out[i] = changedRow{r.EventID, r.AggregateType, r.AggregateID, r.AggregateSeq}
		}
		return out, err
	})
	if err != nil {
		return fmt.Errorf("outbox: discard: %w", err)
	}
	if len(rows) == 1 {
		return nil
	}
	return a.refusal(ctx, eventID, "discard")
}

// changedRow is an event an admin change moved out of DEAD: where its
// aggregate's later events stand.
type changedRow struct {
	EventID, AggregateType, AggregateID string
	Seq                                 int64
}

// change runs one admin change in a transaction of its own when db can
// begin one (a pool, a connection; a pgx.Tx gives a savepoint), else on
// db as it is, and commits with it what afterChange does.
func (a *Admin) change(ctx context.Context, fn func(q *dbsqlc.Queries) ([]changedRow, error)) ([]changedRow, error) {
	b, ok := a.db.(interface {
		Begin(ctx context.Context) (pgx.Tx, error)
	})
	if !ok {
		q := dbsqlc.New(a.db)
		rows, err := fn(q)
		if err != nil {
			return nil, err
		}
		// No transaction: the requeued or discarded rows' aggregates stay
		// blocked until the relay's sweep (every ReapInterval) finds them
		// without a failed event and releases them. Releasing here, in
		// statements of their own, could race with an enqueue that read the
		// old flag.
		return rows, nil
	}
	tx, err := b.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	q := dbsqlc.New(tx)
	rows, err := fn(q)
	if err != nil {
		return nil, err
	}
	if err := afterChange(ctx, q, rows); err != nil {
		return nil, err
	}
	return rows, tx.Commit(ctx)
}

// afterChange is what must change with the rows an operator requeued or
// discarded, in the same transaction: the events of each row's aggregate
// after the row's sequence, held behind it, are released (and the
// aggregate unblocked) under the aggregate's counter-row lock, as a relay
// releases them when a failed event is delivered (settle). A requeued row
// itself is PENDING and not held again (Requeue's statement); a discarded
// one is held for good, out of the claim's index, and counts as done in
// the head check. Every operator action goes through here.
func afterChange(ctx context.Context, q *dbsqlc.Queries, rows []changedRow) error {
	var rel aggSeqs
	for _, r := range rows {
		rel.add(aggregateKey{r.AggregateType, r.AggregateID}, r.Seq)
	}
	return settle(ctx, q, aggSeqs{}, rel)
}

// refusal explains why a guarded update changed nothing.
func (a *Admin) refusal(ctx context.Context, eventID, action string) error {
	st, err := dbsqlc.New(a.db).EventStatus(ctx, eventID)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: %q", ErrEventNotFound, eventID)
	}
	if err != nil {
		return fmt.Errorf("outbox: %s: %w", action, err)
	}
	return &StateError{EventID: eventID, Action: action, Status: st}
}

// auditMax bounds each text of an audit entry.
const auditMax = 1024

func auditText(s string) string { return storableText(s, auditMax) }

// storableText is s as PostgreSQL stores it (valid UTF-8, no NUL), cut to
// at most max bytes on a character boundary.
func storableText(s string, max int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
