package outbox_test

import (
	"bytes"
	"context"
	"database/sql"
	"net"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/lib/pq"

	"github.com/idemkit/idem/internal/pgwire"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// hostileMessages are valid messages (ValidateMessages passes) whose every
// field is built to break out of a SQL literal: quotes, backslashes,
// dollar quotes, comments, statement ends, a placeholder, unicode (no
// NUL: text fields refuse it); the payload holds every byte value.
func hostileMessages(agg string) []outbox.Message {
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	nasty := `'); DROP TABLE outbox_event; -- $$ $1 $tag$ \' \\ " E'\x41' U&'\0041' /* */ ` + "\t\r\n" + `ünïcødé 🙂 ` + "\u202e\u2028\ufeff\U0010fffd"
	return []outbox.Message{
		{Topic: "t" + nasty, AggregateType: "ty" + nasty, AggregateID: agg + nasty, EventType: "ev" + nasty,
			Payload: append([]byte(nasty), all...),
			Headers: map[string]string{"k" + nasty: "v" + nasty, `"`: `\`, "$1": "$$"}},
		{Topic: "plain", AggregateType: "ty" + nasty, AggregateID: agg + nasty, EventType: "empty payload and headers"},
		{Topic: `\`, AggregateType: `'`, AggregateID: agg + `$$`, EventType: `"`, Payload: []byte{0, '\\', '\'', 0xff}},
	}
}

// storedRow is every column an enqueue writes, but id (and the
// timestamps).
const storedRow = `SELECT topic, aggregate_type, aggregate_id, aggregate_seq, event_id, event_type, payload, headers::text, status, held
FROM outbox_event WHERE event_id = $1`

type row struct {
	topic, aggType, aggID string
	seq                   int64
	eventID, eventType    string
	payload               []byte
	headers, status       string
	held                  bool
}

func readRow(t *testing.T, db *testdb.DB, eventID string) row {
	t.Helper()
	var r row
	if err := db.Pool.QueryRow(t.Context(), storedRow, eventID).Scan(&r.topic, &r.aggType, &r.aggID, &r.seq, &r.eventID, &r.eventType, &r.payload, &r.headers, &r.status, &r.held); err != nil {
		t.Fatalf("event %s: %v", eventID, err)
	}
	return r
}

// TestEnqueueSQLTxHostileInput: hostile values in every field, one message
// and a batch of three, on lib/pq and pgx's stdlib driver, are stored by
// EnqueueSQLTx byte for byte as EnqueueTx (pgx) stores them, and nothing
// else runs (the table is still there, holding exactly these events).
func TestEnqueueSQLTxHostileInput(t *testing.T) {
	t.Parallel()
	forEachDriver(t, 2, func(t *testing.T, db *testdb.DB, sdb *sql.DB) {
		ctx := t.Context()
		for _, n := range []int{1, 3} {
			msgs := hostileMessages("n" + string(rune('0'+n)))[:n]
			// The pgx twin, with parameters: aggregate "pgx…", the same
			// fields otherwise.
			pgxMsgs := hostileMessages("p" + string(rune('0'+n)))[:n]
			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			pgxIDs, err := outbox.EnqueueTx(ctx, tx, pgxMsgs...)
			if err != nil {
				t.Fatalf("EnqueueTx: %v", err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			stx := sqlTx(t, sdb)
			ids, err := outbox.EnqueueSQLTx(ctx, stx, msgs...)
			if err != nil {
				t.Fatalf("EnqueueSQLTx of %d hostile messages: %v", n, err)
			}
			if err := stx.Commit(); err != nil {
				t.Fatal(err)
			}
			for i := range n {
				got, want := readRow(t, db, ids[i]), readRow(t, db, pgxIDs[i])
				if got.aggID[0] != 'n' || want.aggID[0] != 'p' {
					t.Fatalf("aggregate ids %q, %q", got.aggID, want.aggID)
				}
				got.aggID, want.aggID = got.aggID[1:], want.aggID[1:] // the one intended difference
				got.eventID, want.eventID = "", ""
				if !bytes.Equal(got.payload, want.payload) || !bytes.Equal(got.payload, msgsPayload(msgs[i])) {
					t.Fatalf("message %d of %d: payload %q, EnqueueTx's %q", i, n, got.payload, want.payload)
				}
				got.payload, want.payload = nil, nil
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("message %d of %d: stored\n%+v\nEnqueueTx stored\n%+v", i, n, got, want)
				}
				if got.topic != msgs[i].Topic || got.aggType != msgs[i].AggregateType || got.eventType != msgs[i].EventType {
					t.Fatalf("message %d of %d: stored %+v, sent %+v", i, n, got, msgs[i])
				}
			}
		}
		var count int
		if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM outbox_event").Scan(&count); err != nil || count != 8 {
			t.Fatalf("outbox_event: %d rows (%v), want the 8 events", count, err)
		}
	})
}

func msgsPayload(m outbox.Message) []byte {
	if m.Payload == nil {
		return []byte{}
	}
	return m.Payload
}

// pqDialer is a lib/pq Dialer over a dial function.
type pqDialer func(ctx context.Context, network, addr string) (net.Conn, error)

func (d pqDialer) Dial(network, addr string) (net.Conn, error) {
	return d(context.Background(), network, addr)
}

func (d pqDialer) DialTimeout(network, addr string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return d(ctx, network, addr)
}

func (d pqDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return d(ctx, network, addr)
}

// TestEnqueueSQLTxRoundTrips pins EnqueueSQLTx's round trips, counted on
// the wire (internal/pgwire): one statement, so one round trip on pgx's
// stdlib driver (its cached prepared statement: Bind/Execute) and two on
// lib/pq, which sends a statement with parameters as Parse/Describe, then
// Bind/Execute. A second statement (a separate doorbell, a read of the
// sequence) would fail it.
func TestEnqueueSQLTxRoundTrips(t *testing.T) {
	t.Parallel()
	for _, driver := range testdb.SQLDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, testdb.MaxConns(1))
			counter := pgwire.NewCounter()
			var sdb *sql.DB
			switch driver {
			case "pgx":
				cfg, err := pgx.ParseConfig(db.URL)
				if err != nil {
					t.Fatal(err)
				}
				cfg.DialFunc = counter.DialFunc(nil)
				sdb = stdlib.OpenDB(*cfg)
			case "postgres":
				c, err := pq.NewConnector(db.URL)
				if err != nil {
					t.Fatal(err)
				}
				c.Dialer(pqDialer(counter.DialFunc(nil)))
				sdb = sql.OpenDB(c)
			}
			t.Cleanup(func() { _ = sdb.Close() })
			for i, n := range []int{1, 3, 1, 3} {
				tx := sqlTx(t, sdb)
				if i < 2 {
					// Not counted: pgx prepares a statement the first
					// time its connection runs it (one round trip more).
					if _, err := outbox.EnqueueSQLTx(t.Context(), tx, hostileMessages("warm")[:n]...); err != nil {
						t.Fatal(err)
					}
				}
				counter.Reset()
				if _, err := outbox.EnqueueSQLTx(t.Context(), tx, hostileMessages("rt")[:n]...); err != nil {
					t.Fatal(err)
				}
				got := counter.Counts()
				want := 1
				if driver == "postgres" {
					want = 2
				}
				if got.RoundTrips != want {
					t.Errorf("EnqueueSQLTx of %d on %s: %d round trips, want %d (messages %v)", n, driver, got.RoundTrips, want, got.Messages)
				}
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
