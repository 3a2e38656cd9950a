package outbox

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/sqlpgx"
	"github.com/idemkit/idem/outbox/internal/dbsqlc"
)

// Errors returned by this package. Use errors.Is.
var (
	// ErrInvalidMessage is returned by EnqueueTx when a Message lacks a
	// required field; the error text names the field and the message index.
	ErrInvalidMessage = errors.New("outbox: invalid message")
	// ErrInvalidConfig is returned by NewRelay when a RelayConfig field is
	// out of range (after defaults are filled in), or a dependency is nil;
	// the error text names the field.
	ErrInvalidConfig = errors.New("outbox: invalid config")
	// ErrLeaseLost is reported (a RelayLeaseLost hook event, and the error
	// of RunBatch) when a two-phase batch finished after its lease had been
	// reaped: the token guard left the rows to their new owner.
	ErrLeaseLost = errors.New("outbox: lease lost")
	// ErrNilTx is returned by EnqueueTx and EnqueueSQLTx for a nil
	// transaction: an event outside the caller's transaction would break
	// the one promise of the outbox, so nothing is written anywhere.
	ErrNilTx = errors.New("outbox: nil transaction")
)

// DBTX is what Enqueue, GetStatus, Requeue and the other one-statement
// helpers need: statements, no transaction control. *pgxpool.Pool,
// *pgx.Conn and pgx.Tx satisfy it. It is the package's only database
// interface: the relay takes a *pgxpool.Pool (see NewRelay).
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// MaxFieldBytes bounds each of a Message's Topic, AggregateType,
// AggregateID, EventID and EventType: the aggregate and the event id are
// index keys, and PostgreSQL refuses an index entry over about 2.7 KB with
// an error that would abort the caller's transaction. Longer fields are an
// ErrInvalidMessage before anything is written.
const MaxFieldBytes = 1024

// Message is one event to publish.
type Message struct {
	// Topic is the destination (a Kafka topic, a NATS subject). Required.
	Topic string
	// AggregateType and AggregateID name the entity the event is about
	// ("order", "42"). Events of one aggregate are first published in
	// enqueue order, across topics (see the package doc); publishers use
	// AggregateID as the message key (package kafka: the record key, so
	// that an aggregate stays in one partition). Both required.
	AggregateType string
	AggregateID   string
	// EventID identifies the event for consumers' deduplication (the
	// event-id header). Generated (32 hex characters) when empty. Unique.
	EventID string
	// EventType is the event-type header. Required.
	EventType string
	// Payload is the record value. May be empty.
	Payload []byte
	// Headers are extra record headers. May be nil.
	//
	// Every string of a Message must be valid UTF-8 without NUL bytes
	// (PostgreSQL text); Payload may hold any bytes.
	Headers map[string]string
}

// Event is a Message as the relay hands it to a Publisher.
type Event struct {
	Message
	// ID is the outbox row id.
	ID int64
	// Seq is the event's position in its aggregate, from 1, without gaps.
	Seq int64
	// Attempts is how many publish attempts this event had before this one.
	Attempts int
	// CreatedAt is when the event was enqueued.
	CreatedAt time.Time
}

// NewEventID returns a random 128-bit event id in hex.
func NewEventID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// EnqueueTx writes msgs to the outbox in tx, one statement for the whole
// slice, and returns their event ids (generated where empty) in order.
//
// Trace context: when ctx carries a Propagator (ContextWithPropagator),
// each message's headers get what it writes (an OpenTelemetry span
// context), so that the event's consumer continues the caller's trace.
//
// Atomicity: the events are part of tx. Nothing is visible to a relay, or
// published, unless tx commits; a rollback leaves no trace, not even a gap
// in the aggregate sequence. A sleeping relay is woken by a NOTIFY sent at
// commit; while every relay is busy the enqueue sends none (a NOTIFY
// serializes the server's notifying commits), and the relays' next claim
// finds the events.
//
// Ordering: each event gets the next sequence number of its aggregate. The
// aggregate's counter row stays locked until tx ends, so a concurrent
// transaction enqueueing for the same aggregate waits for tx; sequence
// order is commit order. Keep transactions that enqueue short. Under
// REPEATABLE READ or SERIALIZABLE such a concurrent enqueue fails with a
// serialization error and must be retried, as usual at those levels.
func EnqueueTx(ctx context.Context, tx pgx.Tx, msgs ...Message) ([]string, error) {
	if tx == nil {
		return nil, ErrNilTx
	}
	return enqueue(ctx, tx, msgs)
}

// EnqueueSQLTx is EnqueueTx for a database/sql transaction (lib/pq, pgx's
// stdlib driver, or an ORM's *sql.Tx): the same statement, the same
// numbering, order, validation (ErrInvalidMessage) and doorbell, with the
// same atomicity: the events commit or roll back with tx. A nil tx is
// ErrNilTx; a tx already committed or rolled back is an error wrapping
// sql.ErrTxDone, and nothing is written.
//
// The relay, the reaper and the purges are not part of the caller's
// transaction: they keep their own pgxpool, opened from the same database
// URL (see NewRelay).
func EnqueueSQLTx(ctx context.Context, tx *sql.Tx, msgs ...Message) ([]string, error) {
	if tx == nil {
		return nil, ErrNilTx
	}
	return enqueue(ctx, sqlpgx.DB{Q: tx}, msgs)
}

// Enqueue is EnqueueTx for events that describe no other write: it runs
// its one statement on db (a pool or a connection) in a transaction of its
// own, so the slice is written whole or not at all, and commits before it
// returns. Events that must commit with a state change belong in that
// change's transaction: use EnqueueTx.
func Enqueue(ctx context.Context, db DBTX, msgs ...Message) ([]string, error) {
	return enqueue(ctx, db, msgs)
}

func enqueue(ctx context.Context, db DBTX, msgs []Message) ([]string, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	p := dbsqlc.EnqueueParams{
		Topics:         make([]string, len(msgs)),
		AggregateTypes: make([]string, len(msgs)),
		AggregateIds:   make([]string, len(msgs)),
		EventIds:       make([]string, len(msgs)),
		EventTypes:     make([]string, len(msgs)),
		Payloads:       make([][]byte, len(msgs)),
		Headers:        make([]string, len(msgs)),
	}
	if err := ValidateMessages(msgs...); err != nil {
		return nil, err
	}
	for i, m := range msgs {
		if m.EventID == "" {
			m.EventID = NewEventID()
		}
		m.Headers = InjectHeaders(ctx, m.Headers) // m is a copy: the caller's map is not changed
		h := []byte("{}")
		if len(m.Headers) > 0 {
			var err error
			if h, err = json.Marshal(m.Headers); err != nil {
				return nil, fmt.Errorf("%w: message %d: Headers: %v", ErrInvalidMessage, i, err)
			}
		}
		payload := m.Payload
		if payload == nil {
			payload = []byte{}
		}
		p.Topics[i], p.AggregateTypes[i], p.AggregateIds[i] = m.Topic, m.AggregateType, m.AggregateID
		p.EventIds[i], p.EventTypes[i], p.Payloads[i], p.Headers[i] = m.EventID, m.EventType, payload, string(h)
	}
	q := dbsqlc.New(db)
	var err error
	if len(msgs) == 1 {
		_, err = q.EnqueueOne(ctx, dbsqlc.EnqueueOneParams{
			Topic: p.Topics[0], AggregateType: p.AggregateTypes[0], AggregateID: p.AggregateIds[0],
			EventID: p.EventIds[0], EventType: p.EventTypes[0], Payload: p.Payloads[0], Headers: p.Headers[0],
		})
	} else {
		_, err = q.Enqueue(ctx, p)
	}
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "outbox_event_event_id_key" {
			return nil, fmt.Errorf("%w: duplicate EventID: %v", ErrInvalidMessage, pgErr.Detail)
		}
		// The same refusal from another database/sql driver (lib/pq).
		if sqlpgx.SQLState(err) == "23505" && strings.Contains(err.Error(), "outbox_event_event_id_key") {
			return nil, fmt.Errorf("%w: duplicate EventID: %v", ErrInvalidMessage, err)
		}
		return nil, fmt.Errorf("outbox: enqueue: %w", err)
	}
	return p.EventIds, nil
}

// ValidateMessages checks msgs against the rules every enqueue function
// applies before it writes anything (outbox.EnqueueTx and the WAL
// outbox's EnqueueTx alike, so that an event valid in one mode is valid in
// the other): Topic, AggregateType, AggregateID and EventType present;
// those and EventID valid UTF-8 without NUL and at most MaxFieldBytes;
// every header name and value valid UTF-8 without NUL, and no header name
// reserved by idem (idem.IsReservedHeader: event-id, event-type,
// aggregate-type, aggregate-seq, dlq-*), which a publisher writes itself.
// The first violation is an error wrapping ErrInvalidMessage that names
// the message's index and the field.
func ValidateMessages(msgs ...Message) error {
	for i := range msgs {
		if why := messageProblem(&msgs[i]); why != "" {
			return fmt.Errorf("%w: message %d: %s", ErrInvalidMessage, i, why)
		}
	}
	return nil
}

// messageProblem says what is wrong with m, "" when nothing is.
func messageProblem(m *Message) string {
	switch {
	case m.Topic == "":
		return "Topic is empty"
	case m.AggregateType == "":
		return "AggregateType is empty"
	case m.AggregateID == "":
		return "AggregateID is empty"
	case m.EventType == "":
		return "EventType is empty"
	}
	for _, f := range [...]struct{ name, v string }{
		{"Topic", m.Topic}, {"AggregateType", m.AggregateType}, {"AggregateID", m.AggregateID},
		{"EventID", m.EventID}, {"EventType", m.EventType},
	} {
		if !storable(f.v) {
			return fmt.Sprintf("%s is not valid UTF-8 without NUL", f.name)
		}
		if len(f.v) > MaxFieldBytes {
			return fmt.Sprintf("%s is %d bytes, more than %d", f.name, len(f.v), MaxFieldBytes)
		}
	}
	for k, v := range m.Headers {
		if !storable(k) || !storable(v) {
			return fmt.Sprintf("Headers[%q] is not valid UTF-8 without NUL", k)
		}
		if idem.IsReservedHeader(k) {
			return fmt.Sprintf("Headers[%q] is a header name idem reserves (its publishers write it)", k)
		}
	}
	return ""
}

// storable reports whether PostgreSQL can store s as text (and in jsonb):
// valid UTF-8 and no NUL. encoding/json would otherwise replace invalid
// bytes silently, and the server refuses a NUL.
func storable(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

func decodeHeaders(raw []byte) map[string]string {
	if len(raw) == 0 || string(raw) == "{}" {
		return nil
	}
	var h map[string]string
	if json.Unmarshal(raw, &h) != nil {
		return nil
	}
	return h
}
