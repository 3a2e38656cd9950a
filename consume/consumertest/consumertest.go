// Package consumertest is the kit every consume.Driver must pass, against
// a real broker and a real PostgreSQL: a driver's test builds a Harness
// for its broker and calls Run. The kit checks the consumer's promises end
// to end, through the driver:
//
// Usage:
//
//	func TestMyDriver(t *testing.T) {
//		consumertest.Run(t, consumertest.Harness{New: newBroker, Attach: attachBroker})
//	}
//
// # What it checks
//
//   - CommitAfterDBCommit: a message is acknowledged to the broker only
//     after its transaction committed, never when the commit fails;
//   - KillAfterDBCommit: a consumer process SIGKILLed between a
//     transaction's commit and its ack (the consumer-db-committed
//     failpoint) is restarted, the redelivered messages are skipped as
//     duplicates (the handler is not run again), nothing is lost;
//   - GracefulStop: Stop waits for the message in hand, commits and acks
//     it, and the next consumer starts after it;
//   - PoisonInOrder: messages the handler fails on are dead-lettered in
//     stream order and the stream carries on, in order;
//   - DefiniteRefusal: a message whose event id PostgreSQL cannot store
//     (invalid UTF-8, over the index limit) or whose transaction it
//     refuses with a data exception is dead-lettered at once, like a
//     Permanent handler error, and the stream carries on, in order;
//   - StuckDeadLetter: a message that can be neither processed nor
//     dead-lettered (the dead-letter destination is missing, or the copy
//     is too large) is reported (consume.KindStuck), holds only its own
//     stream, is not acknowledged, lets a second member join and Stop
//     complete, and is dead-lettered once the operator fixes the cause.
//     With Harness.ReferenceCopy, the too-large case checks instead that
//     a reference copy (no value, dlq-truncated) is dead-lettered and the
//     stream moves on.
//   - DeadLetterCheck: Start fails, with an error naming it, when the
//     dead-letter topic is missing (consume.DeadLetterChecker), and
//     starts with the driver's check turned off.
//
// KillAfterDBCommit runs the test binary again as the consumer process:
// Run must be called from a top-level test (TestXxx(t) { consumertest.Run(t,
// h) }), so that the child can select it with -test.run.
package consumertest

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/consume"
	"github.com/idemkit/idem/internal/testdb"
)

// Harness is what a driver's test gives the kit.
type Harness struct {
	// New starts (or reaches) a broker for one test; it is shut down when
	// the test ends. Required.
	New func(t testing.TB) Broker
	// Attach reaches, from the kit's child process, the broker whose
	// Broker.Addr the parent passed. Required.
	Attach func(t testing.TB, addr string) Broker
	// NearLimitValue is the size of a message value that the broker
	// accepts but whose dead-letter copy (the same value plus the
	// dead-letter headers) it refuses as too large. Required.
	NearLimitValue int
	// ReferenceCopy says the driver dead-letters a reference copy (no
	// value, dlq-truncated "true", dlq-source) when the full copy is too
	// large: then StuckDeadLetter's too-large case checks that the
	// message is dead-lettered that way and its stream moves on, instead
	// of that it holds its stream. Defaults to false.
	ReferenceCopy bool
	// SQLDrivers are database/sql driver names (registered by the
	// caller: "postgres" for lib/pq, "pgx" for pgx's stdlib) on which
	// CommitAfterDBCommit and KillAfterDBCommit run again, with a
	// consumer made by consume.NewSQL whose handler writes through the
	// *sql.Tx. Defaults to none.
	SQLDrivers []string
}

// Broker is one test's broker as the driver sees it.
type Broker interface {
	// Addr is what Harness.Attach needs to reach this broker from another
	// process.
	Addr() string
	// CreateTopic creates a topic (a stream of the broker) with the given
	// number of partitions (a per-message broker may map them to
	// subjects). Dead-letter topics are created by the kit with this too:
	// the broker must not create a topic on first publish.
	CreateTopic(t testing.TB, topic string, partitions int)
	// Produce publishes msgs to topic, each on its Partition, in order.
	Produce(t testing.TB, topic string, msgs ...Msg)
	// Driver returns a driver for cfg. Its group must hand partitions over
	// quickly (the kit kills and adds members): use short session and
	// rebalance timeouts.
	Driver(t testing.TB, cfg DriverConfig) consume.Driver
	// Read returns the first n messages of topic, waiting up to timeout,
	// in each partition's order; it fails t if fewer arrive.
	Read(t testing.TB, topic string, n int, timeout time.Duration) []Msg
	// Acked is how many messages of topic the group has acknowledged:
	// for an offset broker the sum over partitions of the committed
	// offsets (topics start at offset 0), for a per-message broker the
	// count of acked messages.
	Acked(t testing.TB, group, topic string) int
}

// DriverConfig is what the kit asks of a driver.
type DriverConfig struct {
	Group           string
	Topics          []string
	DeadLetterTopic string
	// SkipDeadLetterCheck: the driver must not check at Start that the
	// dead-letter topic exists (its SkipDeadLetterTopicCheck).
	SkipDeadLetterCheck bool
}

// Msg is a message the kit produces or reads back.
type Msg struct {
	Partition int
	EventID   string
	Value     []byte
	// Headers are the message's headers (as read back from a dead-letter
	// topic: the driver's dead-letter headers among them).
	Headers map[string]string
}

// Run runs the kit. See the package doc.
func Run(t *testing.T, h Harness) {
	if h.New == nil || h.Attach == nil || h.NearLimitValue <= 0 {
		t.Fatal("consumertest: Harness needs New, Attach and NearLimitValue")
	}
	if os.Getenv(childEnv) != "" {
		runChild(t, h)
		return
	}
	t.Run("CommitAfterDBCommit", func(t *testing.T) { t.Parallel(); testCommitAfterDBCommit(t, h, "") })
	t.Run("KillAfterDBCommit", func(t *testing.T) {
		t.Parallel()
		for _, batch := range []bool{false, true} {
			t.Run("batch="+strconv.FormatBool(batch), func(t *testing.T) { t.Parallel(); testKillAfterDBCommit(t, h, batch, "") })
		}
	})
	t.Run("GracefulStop", func(t *testing.T) { t.Parallel(); testGracefulStop(t, h) })
	for i, driver := range h.SQLDrivers {
		// One batch mode per driver, alternating: each driver is killed
		// once, and both modes are covered over database/sql.
		batch := i%2 == 1
		t.Run("SQL/"+driver, func(t *testing.T) {
			t.Parallel()
			t.Run("CommitAfterDBCommit", func(t *testing.T) {
				t.Parallel()
				testCommitAfterDBCommit(t, h, driver)
			})
			t.Run("KillAfterDBCommit/batch="+strconv.FormatBool(batch), func(t *testing.T) {
				t.Parallel()
				testKillAfterDBCommit(t, h, batch, driver)
			})
		})
	}
	t.Run("PoisonInOrder", func(t *testing.T) {
		t.Parallel()
		for _, batch := range []bool{false, true} {
			t.Run("batch="+strconv.FormatBool(batch), func(t *testing.T) { t.Parallel(); testPoisonInOrder(t, h, batch) })
		}
	})
	t.Run("DefiniteRefusal", func(t *testing.T) {
		t.Parallel()
		for _, batch := range []bool{false, true} {
			t.Run("batch="+strconv.FormatBool(batch), func(t *testing.T) { t.Parallel(); testDefiniteRefusal(t, h, batch) })
		}
	})
	t.Run("DeadLetterCheck", func(t *testing.T) { t.Parallel(); testDeadLetterCheck(t, h) })
	t.Run("StuckDeadLetter", func(t *testing.T) {
		t.Parallel()
		for _, c := range []string{"missing-topic", "too-large"} {
			t.Run(c, func(t *testing.T) { t.Parallel(); testStuckDeadLetter(t, h, c) })
		}
	})
}

// world is one kit test's database, broker and topic.
type world struct {
	db     *testdb.DB
	broker Broker
	topic  string
	dlq    string
	group  string
}

func newWorld(t *testing.T, h Harness, partitions int) *world {
	t.Helper()
	w := &world{db: testdb.New(t), broker: h.New(t), topic: "kit.events", dlq: "kit.events.dlq", group: "kit"}
	w.broker.CreateTopic(t, w.topic, partitions)
	w.broker.CreateTopic(t, w.dlq, 1)
	if _, err := w.db.Pool.Exec(context.Background(), effectSchema); err != nil {
		t.Fatal(err)
	}
	return w
}

// effectSchema: one kit_effect row per handled message, no unique key (a
// second effect would show). An event id in kit_fail makes the commit of
// the transaction that inserts its effect fail (a deferred constraint
// trigger), after the handler returned.
const effectSchema = `
CREATE TABLE kit_effect (
	id       bigserial PRIMARY KEY,
	event_id text NOT NULL,
	value    text
);
CREATE TABLE kit_fail (event_id text PRIMARY KEY);
CREATE FUNCTION kit_check() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF EXISTS (SELECT 1 FROM kit_fail WHERE event_id = NEW.event_id) THEN
		RAISE EXCEPTION 'kit: commit of % refused', NEW.event_id;
	END IF;
	RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER kit_check AFTER INSERT ON kit_effect
	DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION kit_check();
`

const effectSQL = `INSERT INTO kit_effect (event_id, value) VALUES ($1, $2)`

func effectHandler(ctx context.Context, tx pgx.Tx, m *consume.Message) error {
	_, err := tx.Exec(ctx, effectSQL, m.EventID, string(m.Value))
	return err
}

// sqlEffectHandler is effectHandler through the *sql.Tx of consume.NewSQL.
func sqlEffectHandler(ctx context.Context, tx *sql.Tx, m *consume.Message) error {
	_, err := tx.ExecContext(ctx, effectSQL, m.EventID, string(m.Value))
	return err
}

// effectConsumer is a consumer with the effect handler: on the pgx pool,
// or, for a sqlDriver, made by consume.NewSQL on that database/sql driver.
func (w *world) effectConsumer(t *testing.T, sqlDriver string, mutate func(*consume.Config)) *consume.Consumer {
	t.Helper()
	if sqlDriver == "" {
		return w.consumer(t, effectHandler, mutate)
	}
	return w.newConsumer(t, mutate, func(d consume.Driver, cfg *consume.Config) (*consume.Consumer, error) {
		return consume.NewSQL(w.db.SQL(t, sqlDriver, 4), d, sqlEffectHandler, cfg)
	})
}

func msgs(from, to, partitions int) []Msg {
	var out []Msg
	for i := from; i < to; i++ {
		out = append(out, Msg{Partition: i % partitions, EventID: "ev-" + strconv.Itoa(i), Value: []byte(strconv.Itoa(i))})
	}
	return out
}

func (w *world) consumer(t *testing.T, h consume.Handler, mutate func(*consume.Config)) *consume.Consumer {
	t.Helper()
	return w.newConsumer(t, mutate, func(d consume.Driver, cfg *consume.Config) (*consume.Consumer, error) {
		return consume.New(w.db.Pool, d, h, cfg)
	})
}

func (w *world) newConsumer(t *testing.T, mutate func(*consume.Config), mk func(consume.Driver, *consume.Config) (*consume.Consumer, error)) *consume.Consumer {
	t.Helper()
	cfg := &consume.Config{
		ConsumerID: w.group, BackoffMin: time.Millisecond, BackoffMax: 50 * time.Millisecond,
		DeadLetterTimeout: 5 * time.Second, AckTimeout: 5 * time.Second, Logger: quiet(),
	}
	if mutate != nil {
		mutate(cfg)
	}
	d := w.broker.Driver(t, DriverConfig{Group: w.group, Topics: []string{w.topic}, DeadLetterTopic: w.dlq})
	c, err := mk(d, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// start starts c and stops it when the test ends.
func start(t *testing.T, c *consume.Consumer) {
	t.Helper()
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
}

func (w *world) count(t testing.TB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := w.db.Pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitFor polls cond until it holds or timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("consumertest: %s: not within %v", what, timeout)
		}
		time.Sleep(20 * time.Millisecond) // polling interval, not a wait for an event
	}
}

func (w *world) waitEffects(t testing.TB, n int, timeout time.Duration) {
	t.Helper()
	waitFor(t, timeout, fmt.Sprintf("%d distinct effects", n), func() bool {
		return w.count(t, `SELECT count(DISTINCT event_id) FROM kit_effect`) >= n
	})
}

// assertExactlyOnce: ev-0..ev-(n-1) each have one effect, except those in
// skip (none), and nothing else has any.
func (w *world) assertExactlyOnce(t testing.TB, n int, skip ...string) {
	t.Helper()
	rows, err := w.db.Pool.Query(context.Background(), `SELECT event_id, count(*) FROM kit_effect GROUP BY event_id`)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for rows.Next() {
		var id string
		var c int
		if err := rows.Scan(&id, &c); err != nil {
			t.Fatal(err)
		}
		counts[id] = c
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	skipped := map[string]bool{}
	for _, s := range skip {
		skipped[s] = true
	}
	for i := range n {
		id := "ev-" + strconv.Itoa(i)
		want := 1
		if skipped[id] {
			want = 0
		}
		if counts[id] != want {
			t.Errorf("%s: %d effects, want %d", id, counts[id], want)
		}
		delete(counts, id)
	}
	if len(counts) > 0 {
		t.Errorf("unexpected effects: %v", counts)
	}
}

// events records a consumer's hook events.
type events struct {
	mu  sync.Mutex
	all []consume.Event
}

func (e *events) hook(ctx context.Context, ev consume.Event) context.Context {
	e.mu.Lock()
	e.all = append(e.all, ev)
	e.mu.Unlock()
	return ctx
}

func (e *events) of(k consume.Kind) []consume.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []consume.Event
	for _, ev := range e.all {
		if ev.Kind == k {
			out = append(out, ev)
		}
	}
	return out
}

func (e *events) count(k consume.Kind, eventID string) int {
	n := 0
	for _, ev := range e.of(k) {
		if eventID == "" || ev.EventID == eventID {
			n++
		}
	}
	return n
}

func joinValues(ms []Msg) string {
	var vs []string
	for _, m := range ms {
		vs = append(vs, string(m.Value))
	}
	return strings.Join(vs, " ")
}
