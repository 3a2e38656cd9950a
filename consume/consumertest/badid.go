package consumertest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/consume"
)

// Event ids that processed_event can never hold: PostgreSQL refuses the
// first with SQLSTATE 22021 and the second with 54000 (over the btree
// limit), on every attempt.
var (
	binaryEventID = "\xde\xad\xbe\xef-binary-uuid" // not valid UTF-8
	longEventID   = "ev-" + strings.Repeat("x", 3000)
)

// testDefiniteRefusal: on one stream, two messages whose event ids
// PostgreSQL cannot store (invalid UTF-8, 3 KB) and one (ev-6) whose
// transaction PostgreSQL refuses at COMMIT with a data exception (SQLSTATE
// 22023, a deferred constraint trigger) are the messages' fault, as a
// Permanent handler error would be: each is dead-lettered at once, in
// stream order, and the messages behind them are processed, in order. A
// consumer that took these refusals for a database outage would retry
// the first one for ever and hold the stream behind it.
func testDefiniteRefusal(t *testing.T, h Harness, batch bool) {
	w := newWorld(t, h, 1)
	ctx := context.Background()
	if _, err := w.db.Pool.Exec(ctx, `
CREATE TABLE kit_refuse (event_id text PRIMARY KEY);
CREATE FUNCTION kit_refuse_check() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF EXISTS (SELECT 1 FROM kit_refuse WHERE event_id = NEW.event_id) THEN
		RAISE EXCEPTION 'kit: % is refused for good', NEW.event_id USING ERRCODE = 'invalid_parameter_value';
	END IF;
	RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER kit_refuse_check AFTER INSERT ON kit_effect
	DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION kit_refuse_check();
INSERT INTO kit_refuse VALUES ('ev-6');`); err != nil {
		t.Fatal(err)
	}
	var ev events
	c := w.consumer(t, effectHandler, func(cfg *consume.Config) {
		cfg.Batch, cfg.Hook = batch, ev.hook
		cfg.MaxAttempts = 100 // dead-lettered at once, not after retries
	})
	start(t, c)
	ms := msgs(0, 9, 1)
	ms[2].EventID = binaryEventID
	ms[4].EventID = longEventID
	w.broker.Produce(t, w.topic, ms...)
	dl := w.broker.Read(t, w.dlq, 3, 60*time.Second)
	w.waitEffects(t, 6, 60*time.Second)
	if got := joinValues(dl); got != "2 4 6" {
		t.Fatalf("dead letters %q, want \"2 4 6\" (stream order)", got)
	}
	for i, want := range []struct{ id, err string }{
		{binaryEventID, "not valid UTF-8"}, {longEventID, "more than 1024"}, {"ev-6", "refused for good"},
	} {
		if dl[i].EventID != want.id || !strings.Contains(headerValues(dl[i]), want.err) {
			t.Errorf("dead letter %d: event id %.20q, headers %.300v; want event id %.20q and an error carrying %q", i, dl[i].EventID, dl[i].Headers, want.id, want.err)
		}
	}
	rows, err := w.db.Pool.Query(ctx, `SELECT value FROM kit_effect ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if want := "0 1 3 5 7 8"; strings.Join(got, " ") != want {
		t.Errorf("effects in order %v, want %s", got, want)
	}
	waitFor(t, 60*time.Second, "9 messages acked", func() bool { return w.broker.Acked(t, w.group, w.topic) == 9 })
	for _, e := range ev.of(consume.KindDeadLettered) {
		if e.Attempt != 1 {
			t.Errorf("%.20q dead-lettered after %d failures, want 1 (the refusal is definitive)", e.EventID, e.Attempt)
		}
	}
	if n := ev.count(consume.KindStuck, ""); n != 0 {
		t.Errorf("%d stuck events, want 0", n)
	}
}
