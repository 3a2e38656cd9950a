// Package publishertest is the suite every outbox.Publisher must pass. It
// drives the publisher through a real outbox.Relay on a real PostgreSQL
// (TEST_DATABASE_URL, else the local server; a schema per subtest)
// against the publisher's own broker, and reads back what reached the
// broker. It knows no broker: the caller's Broker says how to read a
// topic and how to make one fail.
//
// Usage:
//
//	func TestMyPublisher(t *testing.T) {
//		publishertest.Run(t, func(t *testing.T, topics []string) *publishertest.Broker {
//			return &publishertest.Broker{Publisher: newMyPublisher(t, topics), Read: readTopic}
//		})
//	}
//
// # What it checks
//
// Call Run from a test of the publisher's package:
//
//	func TestPublisherSuite(t *testing.T) {
//		publishertest.Run(t, func(t *testing.T, topics []string) *publishertest.Broker {
//			// start a broker for this subtest, create topics, build the publisher
//			return &publishertest.Broker{Publisher: pub, Read: read, Reject: reject, Stall: stall, TooLarge: 1 << 20}
//		})
//	}
//
// What it proves, each in a subtest of its own:
//
//   - Delivery: every event arrives once, with its payload, event type,
//     aggregate, sequence number and headers, each aggregate's events in
//     sequence order on each topic; also with two relays sharing the
//     publisher (it must be safe for concurrent use).
//   - PartialFailure: a call mixing events for a rejecting topic and a
//     healthy one, interleaved, reports each event's own result: no failed
//     event is marked PUBLISHED (that would be a loss), no delivered one
//     left unmarked, and an aggregate's later event to the healthy topic
//     waits for its failed earlier one.
//   - TooLarge: an event the publisher or its broker cannot take fails
//     alone; the later events of its aggregate wait; other aggregates go
//     out.
//   - MissingTopic: an event for a topic that does not exist fails and
//     holds back its aggregate only.
//   - Deadline: against a topic that never succeeds, Publish returns by the
//     relay's deadline with the stuck events failed (wrapping ctx's error)
//     and the others delivered, so the batch records its outcome in time.
//   - ReservedHeaders: an event whose own Headers carry names idem
//     reserves (idem.IsReservedHeader: event-id and the others, in any
//     letter case; enqueue refuses them, but a row written before it did
//     may hold them) reaches the broker with idem's values only: a
//     forwarded event-id must not become the consumers' dedup key. Its
//     other headers arrive as they are.
//
// What it cannot prove: durability across a broker crash, and the order of
// first deliveries across topics on the wire (the relay's waves give it;
// the chaos audit checks it end to end).
package publishertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// Broker is one subtest's broker and the publisher under test.
type Broker struct {
	// Publisher publishes to the broker.
	Publisher outbox.Publisher
	// Read returns every message on topic at the time of the call,
	// decoded. A header name that a message carries twice decodes to its
	// last value. Messages of one aggregate must come in the broker's order
	// for them (Kafka: their partition's). A topic with no message
	// returns none and no error.
	Read func(ctx context.Context, topic string) ([]Message, error)
	// Reject makes every later publish to topic fail at once with a
	// permanent error (Kafka: a non-retriable error code for the
	// partitions of topic).
	Reject func(topic string)
	// Stall makes every later publish to topic never succeed (Kafka: a
	// retriable error code forever, NOT_ENOUGH_REPLICAS): only the
	// publisher's deadline ends it.
	Stall func(topic string)
	// TooLarge is a payload size, in bytes, that the publisher (its
	// outbox.Checker) or its broker refuses. The suite's other payloads
	// are under 100 bytes.
	TooLarge int
}

// Message is a message read back from the broker, decoded into the event
// it carries.
type Message struct {
	Topic         string
	EventID       string
	EventType     string
	AggregateType string
	AggregateID   string
	Seq           int64
	Payload       []byte
	// Headers are the event's own headers, without the ones the
	// publisher adds to carry the fields above.
	Headers map[string]string
}

// Durations the suite uses.
const (
	// BatchTimeout is the relays' batch timeout in the Deadline subtest:
	// the publish gets three quarters of it, the mark the rest, which must
	// be enough for two UPDATEs on a loaded machine.
	BatchTimeout = 4 * time.Second
	// WaitTimeout bounds every poll (delivery, a publish returning).
	WaitTimeout = 30 * time.Second
)

// Run runs the suite. newBroker is called once per subtest with the
// topics the subtest uses; it must create them, no others (a topic it was
// not given must not exist), and return a broker of the subtest's own.
// Subtests run in parallel.
func Run(t *testing.T, newBroker func(t *testing.T, topics []string) *Broker) {
	t.Helper()
	for _, tt := range []struct {
		name string
		fn   func(t *testing.T, newBroker func(t *testing.T, topics []string) *Broker)
	}{
		{"Delivery", testDelivery},
		{"ConcurrentRelays", testConcurrentRelays},
		{"PartialFailure", testPartialFailure},
		{"TooLarge", testTooLarge},
		{"MissingTopic", testMissingTopic},
		{"Deadline", testDeadline},
		{"ReservedHeaders", testReservedHeaders},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.fn(t, newBroker)
		})
	}
}

// fixture is one subtest's database, broker and relay factory.
type fixture struct {
	t  *testing.T
	db *testdb.DB
	b  *Broker
}

func setup(t *testing.T, newBroker func(t *testing.T, topics []string) *Broker, topics ...string) *fixture {
	t.Helper()
	f := &fixture{t: t, db: testdb.New(t)}
	f.b = newBroker(t, topics)
	if f.b == nil || f.b.Publisher == nil || f.b.Read == nil {
		t.Fatal("publishertest: newBroker returned no Publisher or no Read")
	}
	return f
}

func (f *fixture) relay(pub outbox.Publisher, cfg outbox.RelayConfig) *outbox.Relay {
	f.t.Helper()
	cfg.DisableNotify = true
	if cfg.BackoffMin == 0 {
		// A failed event must not come back within the subtest unless the
		// subtest says so.
		cfg.BackoffMin, cfg.BackoffMax = time.Hour, time.Hour
	}
	r, err := outbox.NewRelay(f.db.Pool, pub, &cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), WaitTimeout)
		defer cancel()
		_ = r.HardStop(ctx)
	})
	return r
}

func ev(topic, agg string, seq int) outbox.Message {
	return outbox.Message{
		Topic: topic, AggregateType: "order", AggregateID: agg,
		EventID: fmt.Sprintf("%s-%d", agg, seq), EventType: "E" + fmt.Sprint(seq),
		Payload: []byte(fmt.Sprintf(`{"agg":%q,"seq":%d}`, agg, seq)),
		Headers: map[string]string{"trace": "t-" + agg, "x-seq": fmt.Sprint(seq)},
	}
}

func (f *fixture) enqueue(msgs ...outbox.Message) {
	f.t.Helper()
	if _, err := outbox.Enqueue(context.Background(), f.db.Pool, msgs...); err != nil {
		f.t.Fatal(err)
	}
}

type row struct {
	status   string
	attempts int
	lastErr  string
}

func (f *fixture) rows() map[string]row {
	f.t.Helper()
	rs, err := f.db.Pool.Query(context.Background(), "SELECT event_id, status, attempts, coalesce(last_error, '') FROM outbox_event")
	if err != nil {
		f.t.Fatal(err)
	}
	defer rs.Close()
	out := map[string]row{}
	for rs.Next() {
		var id string
		var r row
		if err := rs.Scan(&id, &r.status, &r.attempts, &r.lastErr); err != nil {
			f.t.Fatal(err)
		}
		out[id] = r
	}
	if err := rs.Err(); err != nil {
		f.t.Fatal(err)
	}
	return out
}

// read returns event id → copies on the broker, over topics, and the
// messages.
func (f *fixture) read(topics ...string) (map[string]int, []Message) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), WaitTimeout)
	defer cancel()
	n := map[string]int{}
	var all []Message
	for _, topic := range topics {
		msgs, err := f.b.Read(ctx, topic)
		if err != nil {
			f.t.Fatalf("publishertest: Read(%s): %v", topic, err)
		}
		for _, m := range msgs {
			n[m.EventID]++
		}
		all = append(all, msgs...)
	}
	return n, all
}

// eventually polls cond until it holds or WaitTimeout passes.
func (f *fixture) eventually(what string, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(WaitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			f.t.Fatalf("publishertest: timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
}

// drain runs batches of r until every row is PUBLISHED.
func (f *fixture) drain(r *outbox.Relay, want int) {
	f.t.Helper()
	f.eventually(fmt.Sprintf("%d events published", want), func() bool {
		_, _ = r.RunBatch(context.Background())
		n := 0
		for _, s := range f.rows() {
			if s.status == "PUBLISHED" {
				n++
			}
		}
		return n == want
	})
}

// checkOrder fails unless, on each topic, each aggregate's first
// deliveries come in increasing sequence order.
func checkOrder(t *testing.T, msgs []Message) {
	t.Helper()
	type stream struct{ topic, aggType, agg string }
	last := map[stream]int64{}
	seen := map[string]bool{}
	for _, m := range msgs {
		if seen[m.EventID] {
			continue // a duplicate; consumers drop it by event id
		}
		seen[m.EventID] = true
		s := stream{m.Topic, m.AggregateType, m.AggregateID}
		if m.Seq <= last[s] {
			t.Errorf("publishertest: on %s, aggregate %s: seq %d (%s) after seq %d: reordered", m.Topic, m.AggregateID, m.Seq, m.EventID, last[s])
		}
		last[s] = m.Seq
	}
}

func testDelivery(t *testing.T, newBroker func(t *testing.T, topics []string) *Broker) {
	f := setup(t, newBroker, "pt.one", "pt.two")
	var want []outbox.Message
	for _, agg := range []string{"a", "b", "c"} {
		for seq := 1; seq <= 6; seq++ {
			topic := "pt.one"
			if agg == "b" && seq > 3 || agg == "c" && seq%2 == 0 {
				topic = "pt.two" // b changes topic once, c at every event
			}
			want = append(want, ev(topic, agg, seq))
		}
	}
	f.enqueue(want...)
	r := f.relay(f.b.Publisher, outbox.RelayConfig{Mode: outbox.TwoPhase})
	f.drain(r, len(want))
	n, msgs := f.read("pt.one", "pt.two")
	byID := map[string]Message{}
	for _, m := range msgs {
		byID[m.EventID] = m
	}
	for _, w := range want {
		m, ok := byID[w.EventID]
		switch {
		case n[w.EventID] != 1:
			t.Errorf("%s: %d copies on the broker, want 1", w.EventID, n[w.EventID])
		case !ok:
		case m.Topic != w.Topic || m.EventType != w.EventType || m.AggregateType != w.AggregateType ||
			m.AggregateID != w.AggregateID || string(m.Payload) != string(w.Payload) ||
			m.Headers["trace"] != w.Headers["trace"] || m.Headers["x-seq"] != w.Headers["x-seq"] || len(m.Headers) != len(w.Headers):
			t.Errorf("%s: read back %+v, want the fields of %+v", w.EventID, m, w)
		case fmt.Sprint(m.Seq) != w.Headers["x-seq"]:
			t.Errorf("%s: seq %d, want %s", w.EventID, m.Seq, w.Headers["x-seq"])
		}
	}
	if len(msgs) != len(want) {
		t.Errorf("%d messages on the broker, want %d", len(msgs), len(want))
	}
	checkOrder(t, msgs)
}

func testConcurrentRelays(t *testing.T, newBroker func(t *testing.T, topics []string) *Broker) {
	f := setup(t, newBroker, "pt.one")
	const aggs, perAgg = 10, 20
	var msgs []outbox.Message
	for seq := 1; seq <= perAgg; seq++ {
		for a := range aggs {
			msgs = append(msgs, ev("pt.one", fmt.Sprintf("agg%02d", a), seq))
		}
	}
	f.enqueue(msgs...)
	var wg sync.WaitGroup
	for i := range 3 {
		r := f.relay(f.b.Publisher, outbox.RelayConfig{Mode: outbox.Mode(i % 2), BatchSize: 25, Owner: fmt.Sprintf("pt-%d", i)})
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(WaitTimeout)
			for time.Now().Before(deadline) {
				if n, err := r.RunBatch(context.Background()); n == 0 && err == nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	f.drain(f.relay(f.b.Publisher, outbox.RelayConfig{}), len(msgs))
	n, got := f.read("pt.one")
	for _, m := range msgs {
		if n[m.EventID] == 0 {
			t.Errorf("%s never reached the broker", m.EventID)
		}
	}
	checkOrder(t, got)
}

func testPartialFailure(t *testing.T, newBroker func(t *testing.T, topics []string) *Broker) {
	for _, mode := range []outbox.Mode{outbox.AtLeastOnce, outbox.TwoPhase} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			f := setup(t, newBroker, "pt.good", "pt.bad")
			if f.b.Reject == nil {
				t.Fatal("publishertest: Broker.Reject is nil")
			}
			f.b.Reject("pt.bad")
			// Interleaved by id: a good, b bad, c good, d bad, ..., and b's
			// second event to the good topic, which must wait for b-1.
			var msgs []outbox.Message
			for i, agg := range []string{"a", "b", "c", "d", "e", "f"} {
				topic := "pt.good"
				if i%2 == 1 {
					topic = "pt.bad"
				}
				msgs = append(msgs, ev(topic, agg, 1))
			}
			msgs = append(msgs, ev("pt.good", "b", 2), ev("pt.good", "a", 2))
			f.enqueue(msgs...)
			r := f.relay(f.b.Publisher, outbox.RelayConfig{Mode: mode, BatchTimeout: 20 * time.Second, LeaseTTL: time.Minute})
			if n, err := r.RunBatch(context.Background()); n != len(msgs) || err == nil {
				t.Fatalf("RunBatch = %d, %v; want %d events and the failures", n, err, len(msgs))
			}
			onBroker, _ := f.read("pt.good", "pt.bad")
			rows := f.rows()
			for _, m := range msgs {
				s := rows[m.EventID]
				bad := m.Topic == "pt.bad"
				switch {
				case s.status == "PUBLISHED" && onBroker[m.EventID] == 0:
					t.Errorf("%s is PUBLISHED but not on the broker: lost", m.EventID)
				case s.status != "PUBLISHED" && onBroker[m.EventID] > 0 && !bad:
					t.Errorf("%s is on the broker but %s", m.EventID, s.status)
				case bad && (s.status != "PENDING" || s.attempts != 1 || s.lastErr == "" || onBroker[m.EventID] > 0):
					t.Errorf("%s (rejecting topic): %+v, on the broker %d times; want PENDING, 1 attempt, its error, absent",
						m.EventID, s, onBroker[m.EventID])
				case m.EventID == "b-2" && (s.status != "PENDING" || s.attempts != 0 || onBroker["b-2"] > 0):
					t.Errorf("b-2: %+v, on the broker %d times; want PENDING, untried, absent (b-1 failed)", s, onBroker["b-2"])
				case !bad && m.EventID != "b-2" && s.status != "PUBLISHED":
					t.Errorf("%s (healthy topic): %+v, want PUBLISHED", m.EventID, s)
				}
			}
		})
	}
}

func testTooLarge(t *testing.T, newBroker func(t *testing.T, topics []string) *Broker) {
	f := setup(t, newBroker, "pt.one")
	if f.b.TooLarge <= 0 {
		t.Fatal("publishertest: Broker.TooLarge is not set")
	}
	big := ev("pt.one", "a", 1)
	big.Payload = make([]byte, f.b.TooLarge)
	for i := range big.Payload {
		big.Payload[i] = byte(i*7919 + i/251) // resists compression
	}
	f.enqueue(big, ev("pt.one", "a", 2), ev("pt.one", "b", 1))
	r := f.relay(f.b.Publisher, outbox.RelayConfig{})
	if n, err := r.RunBatch(context.Background()); n != 3 || err == nil {
		t.Fatalf("RunBatch = %d, %v; want 3 events and a-1's failure", n, err)
	}
	rows := f.rows()
	if s := rows["a-1"]; s.status != "PENDING" || s.attempts != 1 || s.lastErr == "" {
		t.Fatalf("a-1 (too large): %+v, want PENDING, 1 attempt, its error", s)
	}
	if s := rows["a-2"]; s.status != "PENDING" || s.attempts != 0 {
		t.Fatalf("a-2: %+v, want PENDING and untried behind a-1", s)
	}
	// b-1 may share a broker-side batch with a-1 and fail with it: end
	// its backoff and let it go.
	if _, err := f.db.Pool.Exec(context.Background(), "UPDATE outbox_event SET available_at = now() WHERE event_id = 'b-1'"); err != nil {
		t.Fatal(err)
	}
	f.eventually("b-1 published", func() bool {
		_, _ = r.RunBatch(context.Background())
		return f.rows()["b-1"].status == "PUBLISHED"
	})
	n, _ := f.read("pt.one")
	if n["a-1"] != 0 || n["a-2"] != 0 || n["b-1"] != 1 {
		t.Fatalf("on the broker: %v, want b-1 once and neither a-1 nor a-2", n)
	}
}

func testMissingTopic(t *testing.T, newBroker func(t *testing.T, topics []string) *Broker) {
	f := setup(t, newBroker, "pt.one")
	f.enqueue(ev("pt.missing", "a", 1), ev("pt.one", "a", 2), ev("pt.one", "b", 1))
	r := f.relay(f.b.Publisher, outbox.RelayConfig{BatchTimeout: 20 * time.Second, LeaseTTL: time.Minute})
	if n, err := r.RunBatch(context.Background()); n != 3 || err == nil {
		t.Fatalf("RunBatch = %d, %v; want 3 events and a-1's failure", n, err)
	}
	rows := f.rows()
	if s := rows["a-1"]; s.status != "PENDING" || s.attempts != 1 || s.lastErr == "" {
		t.Fatalf("a-1 (missing topic): %+v, want PENDING, 1 attempt, its error", s)
	}
	if s := rows["a-2"]; s.status != "PENDING" || s.attempts != 0 {
		t.Fatalf("a-2: %+v, want PENDING and untried behind a-1", s)
	}
	if s := rows["b-1"]; s.status != "PUBLISHED" {
		t.Fatalf("b-1: %+v, want PUBLISHED", s)
	}
	if n, _ := f.read("pt.one"); n["a-2"] != 0 || n["b-1"] != 1 {
		t.Fatalf("on the broker: %v, want b-1 once and no a-2", n)
	}
}

func testReservedHeaders(t *testing.T, newBroker func(t *testing.T, topics []string) *Broker) {
	f := setup(t, newBroker, "pt.one")
	e := outbox.Event{Message: ev("pt.one", "a", 7), ID: 1, Seq: 7, CreatedAt: time.Now()}
	e.Headers = map[string]string{
		idem.HeaderEventID: "forwarded-id", idem.HeaderEventType: "forged-type",
		idem.HeaderAggregateType: "forged-aggregate", idem.HeaderAggregateSeq: "999",
		"Event-ID": "forwarded-id", "dlq-redrive-id": "forged", "x-upstream": "kept",
	}
	ctx, cancel := context.WithTimeout(context.Background(), WaitTimeout)
	defer cancel()
	if err := f.b.Publisher.Publish(ctx, []outbox.Event{e}); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	var msgs []Message
	f.eventually("the event on the broker", func() bool {
		_, msgs = f.read("pt.one")
		return len(msgs) > 0
	})
	if len(msgs) != 1 {
		t.Fatalf("%d messages on the broker, want 1", len(msgs))
	}
	m := msgs[0]
	if m.EventID != e.EventID || m.EventType != e.EventType || m.AggregateType != e.AggregateType || m.Seq != e.Seq {
		t.Fatalf("on the broker: event id %q, type %q, aggregate type %q, seq %d; want idem's %q, %q, %q, %d (the event's own headers overrode idem's)",
			m.EventID, m.EventType, m.AggregateType, m.Seq, e.EventID, e.EventType, e.AggregateType, e.Seq)
	}
	for k, v := range m.Headers {
		if idem.IsReservedHeader(k) {
			t.Errorf("header %s: %q reached the broker beside idem's own", k, v)
		}
	}
	if m.Headers["x-upstream"] != "kept" {
		t.Errorf("headers %v: the event's own x-upstream is missing", m.Headers)
	}
}

// watched wraps the publisher to see each call's result.
type watched struct {
	outbox.Publisher
	mu    sync.Mutex
	calls []watchedCall
}

type watchedCall struct {
	events   []string
	returned bool
	errs     []error
}

func (w *watched) Publish(ctx context.Context, events []outbox.Event) error {
	w.mu.Lock()
	i := len(w.calls)
	c := watchedCall{}
	for _, e := range events {
		c.events = append(c.events, e.EventID)
	}
	w.calls = append(w.calls, c)
	w.mu.Unlock()
	err := w.Publisher.Publish(ctx, events)
	errs := make([]error, len(events))
	var be *outbox.BatchError
	switch {
	case errors.As(err, &be) && len(be.Errs) == len(events):
		copy(errs, be.Errs)
	case err != nil:
		for k := range errs {
			errs[k] = err
		}
	}
	w.mu.Lock()
	w.calls[i].returned, w.calls[i].errs = true, errs
	w.mu.Unlock()
	return err
}

func testDeadline(t *testing.T, newBroker func(t *testing.T, topics []string) *Broker) {
	f := setup(t, newBroker, "pt.stuck", "pt.one")
	if f.b.Stall == nil {
		t.Fatal("publishertest: Broker.Stall is nil")
	}
	f.b.Stall("pt.stuck")
	f.enqueue(ev("pt.stuck", "a", 1), ev("pt.one", "b", 1), ev("pt.one", "a", 2))
	w := &watched{Publisher: f.b.Publisher}
	r := f.relay(w, outbox.RelayConfig{Mode: outbox.TwoPhase, BatchTimeout: BatchTimeout, LeaseTTL: 2*BatchTimeout + time.Second})
	n, batchErr := r.RunBatch(context.Background())
	if n != 3 || batchErr == nil {
		t.Fatalf("RunBatch = %d, %v; want 3 events and a-1's failure", n, batchErr)
	}
	// The outcome was recorded, on the batch's own context: the publish
	// ended before the batch deadline, leaving the mark its time.
	rows := f.rows()
	if s := rows["a-1"]; s.status != "PENDING" || s.attempts != 1 || s.lastErr == "" {
		t.Fatalf("a-1 (stuck topic): %+v, want PENDING, 1 attempt, its error (the batch: %v)", s, batchErr)
	}
	if strings.Contains(rows["a-1"].lastErr, outbox.ErrPublishTimeout.Error()) {
		t.Fatalf("a-1: %q: Publish did not return by its deadline; the relay gave up on it", rows["a-1"].lastErr)
	}
	if s := rows["b-1"]; s.status != "PUBLISHED" {
		t.Fatalf("b-1 (healthy topic, same call): %+v, want PUBLISHED: Publish must report what it delivered by the deadline", s)
	}
	if s := rows["a-2"]; s.status != "PENDING" || s.attempts != 0 {
		t.Fatalf("a-2: %+v, want PENDING and untried behind a-1", s)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.calls) != 1 || !w.calls[0].returned {
		t.Fatalf("calls %+v, want one that returned", w.calls)
	}
	c := w.calls[0]
	for k, id := range c.events {
		if id == "a-1" && !errors.Is(c.errs[k], context.DeadlineExceeded) {
			t.Fatalf("a-1's error %v does not wrap the context's (context.DeadlineExceeded)", c.errs[k])
		}
	}
	if !slices.Contains(c.events, "a-1") {
		t.Fatalf("the call held %v", c.events)
	}
}
