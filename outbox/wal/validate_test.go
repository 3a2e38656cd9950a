package wal_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/outbox"
)

// TestBothModesRefuseTheSameMessages: the table outbox and the WAL outbox
// refuse the same messages through one validation (outbox.ValidateMessages),
// before anything is written: each field one byte over
// outbox.MaxFieldBytes, and a user header that idem reserves (it would
// overwrite idem's event-id on a broker that keeps one value per name).
// Each refusal is an ErrInvalidMessage naming the field; the table gets
// no row and the slot decodes nothing but the valid event enqueued after
// them. Fields at the limit are accepted by both.
func TestBothModesRefuseTheSameMessages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, nil, nil)
	ctx := context.Background()
	at := strings.Repeat("f", outbox.MaxFieldBytes)
	over := at + "f"
	base := func() outbox.Message {
		return outbox.Message{Topic: "events", AggregateType: "order", AggregateID: "a", EventType: "E", Payload: []byte("p")}
	}
	testCases := []struct {
		field string
		edit  func(m *outbox.Message)
	}{
		{"Topic", func(m *outbox.Message) { m.Topic = over }},
		{"AggregateType", func(m *outbox.Message) { m.AggregateType = over }},
		{"AggregateID", func(m *outbox.Message) { m.AggregateID = over }},
		{"EventID", func(m *outbox.Message) { m.EventID = over }},
		{"EventType", func(m *outbox.Message) { m.EventType = over }},
		{`Headers["event-id"]`, func(m *outbox.Message) { m.Headers = map[string]string{"event-id": "forwarded"} }},
		{`Headers["Event-Type"]`, func(m *outbox.Message) { m.Headers = map[string]string{"Event-Type": "x"} }},
		{`Headers["aggregate-type"]`, func(m *outbox.Message) { m.Headers = map[string]string{"aggregate-type": "x"} }},
		{`Headers["aggregate-seq"]`, func(m *outbox.Message) { m.Headers = map[string]string{"aggregate-seq": "7"} }},
		{`Headers["dlq-redrive-id"]`, func(m *outbox.Message) { m.Headers = map[string]string{"dlq-redrive-id": "x"} }},
	}
	modes := []struct {
		name    string
		enqueue func(ctx context.Context, tx pgx.Tx, msgs ...outbox.Message) ([]string, error)
	}{
		{"table", outbox.EnqueueTx},
		{"wal", b.enq.EnqueueTx},
	}
	for _, mode := range modes {
		err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			for _, tt := range testCases {
				m := base()
				tt.edit(&m)
				// The bad message second: the first, valid, is not written either.
				_, err := mode.enqueue(ctx, tx, base(), m)
				if !errors.Is(err, outbox.ErrInvalidMessage) || !strings.Contains(err.Error(), "message 1: "+tt.field) {
					t.Errorf("%s mode, %s: err = %v, want ErrInvalidMessage naming message 1's %s", mode.name, tt.field, err, tt.field)
				}
			}
			return nil // commit: whatever was written would be decoded
		})
		if err != nil {
			t.Fatalf("%s mode: the transaction after the refusals: %v", mode.name, err)
		}
	}
	var rows int
	if err := b.db.Pool.QueryRow(ctx, "SELECT count(*) FROM outbox_event").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 0 {
		t.Fatalf("table mode wrote %d rows for refused messages", rows)
	}
	// The fields at the limit are valid in both modes; the WAL one is the
	// first and only event the relay delivers.
	limit := outbox.Message{Topic: "events", AggregateType: at, AggregateID: at, EventID: at, EventType: at, Headers: map[string]string{"x-event-id": "kept"}}
	for _, mode := range modes {
		err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			_, err := mode.enqueue(ctx, tx, limit)
			return err
		})
		if err != nil {
			t.Fatalf("%s mode, fields at the limit: %v", mode.name, err)
		}
	}
	recs := b.kc.ReadAll(t, b.topic, 1, 60*time.Second)
	if got := ids(recs); got[0] != at {
		t.Fatalf("first record delivered: event id %.20q…, want the one at the limit", got[0])
	}
	if more, _ := b.kc.Read(b.topic, 2, time.Second); len(more) > 1 {
		t.Fatalf("%d records on the topic, want 1: the refused messages were written", len(more))
	}
}
