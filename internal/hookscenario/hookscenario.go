// Package hookscenario drives every component of idem that has a hook
// (the idempotency middleware, idemclient, the outbox relay, the Kafka
// consumer, the inbox purger) through a fixed scenario against real
// PostgreSQL, kfake over TCP and real HTTP, with the hooks under test
// installed. The OpenTelemetry and Prometheus modules run it and check
// each of their metrics against Want: the same scenario, so the same
// numbers in both.
package hookscenario

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consume"
	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testkafka"
	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/outbox"
)

// Hooks are the hooks under test; a nil one is not installed.
type Hooks struct {
	Request    func(context.Context, idempotency.Event) context.Context
	Client     func(context.Context, idemclient.Event) context.Context
	Relay      func(context.Context, outbox.RelayEvent) context.Context
	Consumer   func(context.Context, consume.Event) context.Context
	InboxPurge func(context.Context, inbox.PurgeEvent) context.Context
	// BeforeRelay, if set, runs once the events are enqueued and before
	// the relay runs: a backlog gauge reads the table then
	// (BacklogPending, BacklogPublishing).
	BeforeRelay func(t *testing.T, db outbox.DBTX)
}

// Want is what the scenario did, for the metric assertions.
type Want struct {
	// Requests by outcome (the middleware's terminal event kinds).
	Requests                                  map[string]int
	Replays, Conflicts, Mismatches, Takeovers int
	// IdempotencyPurged is how many idempotency records the purge deleted.
	IdempotencyPurged int
	// Published is the events the relay delivered (topic Topic), Failures
	// the failed attempts, Dead the events that went DEAD, Reaped the
	// leases the reaper returned, OutboxPurged the PUBLISHED rows purged.
	Published, Failures, Dead, Reaped, OutboxPurged int
	// Batches is how many relay batches claimed something.
	Batches int
	// Records by outcome (processed, duplicate, dead_lettered); Retries
	// the handler failures retried; DeadLetters; Duplicates.
	Records                          map[string]int
	Retries, DeadLetters, Duplicates int
	// InboxPurged is how many processed_event rows the purger deleted.
	InboxPurged int
	// Attempts by outcome (ok, status), ClientRetries by reason.
	Attempts      map[string]int
	ClientRetries map[string]int
	// Route, Topic and Consumer are the label values used (Route is
	// RouteMain without its method).
	Route, Topic, Consumer string
}

// The outbox backlog when BeforeRelay runs: ev-2 is PUBLISHING under an
// expired lease, the three others PENDING.
const (
	BacklogPending    = 3
	BacklogPublishing = 1
)

// Fixed names of the scenario.
const (
	Topic     = "scenario.events"
	Group     = "scenario-consumer"
	RouteMain = "POST /things"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// Run drives the scenario and returns what it did.
func Run(t *testing.T, h Hooks) Want {
	t.Helper()
	db := testdb.New(t)
	w := Want{Route: "/things", Topic: Topic, Consumer: Group,
		Requests: map[string]int{}, Records: map[string]int{}, Attempts: map[string]int{}, ClientRetries: map[string]int{}}
	requests(t, db, h, &w)
	events(t, db, h, &w)
	client(t, h, &w)
	return w
}

// requests: 1 complete, 3 replays, 1 mismatch, 1 conflict (and the
// complete of the request it waited on), 1 takeover (completing) with the
// fenced first run, and 1 record purged.
func requests(t *testing.T, db *testdb.DB, h Hooks, w *Want) {
	ctx := t.Context()
	scope := func(*http.Request) (string, error) { return "alice", nil }
	store := idempotency.NewPostgresStore(db.Pool)
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	handler := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Block") != "" {
			entered <- struct{}{}
			<-release
		}
		rw.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(rw, `{"ok":true}`)
	})
	newMW := func(cfg idempotency.Config) *idempotency.Middleware {
		cfg.Scope, cfg.Hook = scope, h.Request
		mw, err := idempotency.New(store, &cfg)
		if err != nil {
			t.Fatal(err)
		}
		return mw
	}
	main := newMW(idempotency.Config{})
	// A lease of (next to) nothing: the claim is expired as soon as it is
	// written, so a second request takes it over while the first runs.
	lease := newMW(idempotency.Config{Lease: time.Nanosecond})
	short := newMW(idempotency.Config{Retention: time.Millisecond, Lease: time.Millisecond})
	mux := http.NewServeMux()
	mux.Handle(RouteMain, main.Wrap(handler))
	mux.Handle("POST /lease", lease.Wrap(handler))
	mux.Handle("POST /short", short.Wrap(handler))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	hc := srv.Client()
	send := func(path, key, body string, block bool) int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+path, strings.NewReader(body))
		req.Header.Set(idem.HeaderKey, key)
		if block {
			req.Header.Set("X-Block", "1")
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Error(err)
			return 0
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if s := send("/things", "k-1", `{"a":1}`, false); s != http.StatusCreated {
		t.Fatalf("first: %d", s)
	}
	w.Requests["complete"]++
	for range 3 {
		if s := send("/things", "k-1", `{"a":1}`, false); s != http.StatusCreated {
			t.Fatalf("replay: %d", s)
		}
		w.Replays++
		w.Requests["replay"]++
	}
	if s := send("/things", "k-1", `{"a":2}`, false); s != http.StatusConflict && s != http.StatusUnprocessableEntity {
		t.Fatalf("mismatch: %d", s)
	}
	w.Mismatches++
	w.Requests["mismatch"]++

	// A conflict: the first request with k-2 is held in its handler.
	done := make(chan int, 1)
	go func() { done <- send("/things", "k-2", `{}`, true) }()
	<-entered
	if s := send("/things", "k-2", `{}`, false); s != http.StatusConflict {
		t.Fatalf("in progress: %d", s)
	}
	w.Conflicts++
	w.Requests["conflict"]++
	release <- struct{}{}
	if s := <-done; s != http.StatusCreated {
		t.Fatalf("held request: %d", s)
	}
	w.Requests["complete"]++

	// A takeover: the first run of k-3 holds its handler on a lease that
	// expired at once; the second takes the key over and completes; the
	// first is fenced when it completes.
	go func() { done <- send("/lease", "k-3", `{}`, true) }()
	<-entered
	if s := send("/lease", "k-3", `{}`, false); s != http.StatusCreated {
		t.Fatalf("takeover: %d", s)
	}
	w.Takeovers++
	w.Requests["complete"]++
	release <- struct{}{}
	if s := <-done; s != http.StatusConflict {
		t.Fatalf("fenced first run: %d, want 409", s)
	}
	w.Requests["fenced"]++

	// A record past its retention, purged.
	if s := send("/short", "k-4", `{}`, false); s != http.StatusCreated {
		t.Fatalf("short: %d", s)
	}
	w.Requests["complete"]++
	poll(t, "the idempotency purge", func() bool {
		n, err := short.Purge(ctx)
		if err != nil {
			t.Fatal(err)
		}
		w.IdempotencyPurged += n
		return w.IdempotencyPurged > 0
	})
}

// events: 3 events published (one of them after its lease was reaped), 1
// refused as too large (1 failure, dead at once); the consumer processes
// 2, fails the third twice (1 retry) and dead-letters it, and skips a
// redelivered copy of the first (1 duplicate); the inbox purger deletes
// the processed rows.
func events(t *testing.T, db *testdb.DB, h Hooks, w *Want) {
	ctx := t.Context()
	kc := testkafka.New(t)
	kc.CreateTopic(t, Topic, 1)
	kc.CreateTopic(t, Topic+kafka.DeadLetterSuffixDefault, 1)
	prod := kc.Client(t, append(kafka.ProducerOpts(), kgo.ProducerBatchMaxBytes(16<<10))...)
	pub, err := kafka.NewPublisher(prod, nil)
	if err != nil {
		t.Fatal(err)
	}
	msgs := []outbox.Message{
		{Topic: Topic, AggregateType: "thing", AggregateID: "a", EventID: "ev-1", EventType: "ok", Payload: []byte("1")},
		{Topic: Topic, AggregateType: "thing", AggregateID: "b", EventID: "ev-2", EventType: "ok", Payload: []byte("2")},
		{Topic: Topic, AggregateType: "thing", AggregateID: "c", EventID: "ev-3", EventType: "poison", Payload: []byte("3")},
		{Topic: Topic, AggregateType: "thing", AggregateID: "d", EventID: "ev-big", EventType: "ok", Payload: bytes.Repeat([]byte("x"), 32<<10)},
	}
	if _, err := outbox.Enqueue(ctx, db.Pool, msgs...); err != nil {
		t.Fatal(err)
	}
	// ev-2 is left PUBLISHING under an old lease, as by a relay that died
	// mid-batch: the reaper returns it.
	if _, err := db.Pool.Exec(ctx, `UPDATE outbox_event SET status = 'PUBLISHING', lease_owner = 'dead', lease_token = 1,
		locked_at = now() - interval '1 hour' WHERE event_id = 'ev-2'`); err != nil {
		t.Fatal(err)
	}
	if h.BeforeRelay != nil {
		h.BeforeRelay(t, db.Pool)
	}
	relay, err := outbox.NewRelay(db.Pool, pub, &outbox.RelayConfig{Mode: outbox.TwoPhase, MaxAttempts: 1, DisableNotify: true,
		Retention: time.Millisecond, Hook: h.Relay, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	n, err := relay.RunBatch(ctx)
	if n != 3 || err == nil {
		t.Fatalf("first batch: %d claimed, %v", n, err)
	}
	w.Batches++
	w.Published += 2
	w.Failures++
	w.Dead++
	if n, err := relay.Reap(ctx); n != 1 || err != nil {
		t.Fatalf("reap: %d, %v", n, err)
	}
	w.Reaped++
	if n, err := relay.RunBatch(ctx); n != 1 || err != nil {
		t.Fatalf("second batch: %d, %v", n, err)
	}
	w.Batches++
	w.Published++
	if n, err := relay.RunBatch(ctx); n != 0 || err != nil {
		t.Fatalf("idle batch: %d, %v", n, err)
	}
	poll(t, "the outbox purge", func() bool {
		n, err := relay.Purge(ctx)
		if err != nil {
			t.Fatal(err)
		}
		w.OutboxPurged += int(n)
		return w.OutboxPurged == 3
	})

	// The consumer, and a redelivered copy of ev-1 (a duplicate publish).
	var failures atomic.Int32
	handle := func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		if kafka.RecordEventID(rec) == "ev-3" {
			failures.Add(1)
			return errors.New("poison")
		}
		return nil
	}
	cons, err := kafka.NewConsumer(db.Pool, handle, &kafka.ConsumerConfig{Brokers: kc.Addrs, Group: Group, Topics: []string{Topic},
		MaxAttempts: 2, BackoffMin: time.Millisecond, BackoffMax: 2 * time.Millisecond, Hook: h.Consumer, Logger: quiet,
		ClientOpts: []kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}})
	if err != nil {
		t.Fatal(err)
	}
	if err := cons.Start(ctx); err != nil {
		t.Fatal(err)
	}
	copyOf := kc.ReadAll(t, Topic, 3, 20*time.Second)[0]
	if kafka.RecordEventID(copyOf) != "ev-1" {
		t.Fatalf("first record %s", kafka.RecordEventID(copyOf))
	}
	dup := &kgo.Record{Topic: Topic, Key: copyOf.Key, Value: copyOf.Value, Headers: copyOf.Headers}
	if err := prod.ProduceSync(ctx, dup).FirstErr(); err != nil {
		t.Fatal(err)
	}
	kc.ReadAll(t, Topic+kafka.DeadLetterSuffixDefault, 1, 20*time.Second)
	adm := kadm.NewClient(kc.Client(t))
	poll(t, "the duplicate", func() bool {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM processed_event WHERE consumer_id = $1`, Group).Scan(&n); err != nil {
			t.Fatal(err)
		}
		// ev-1 and ev-2 processed, ev-3 dead-lettered (marked done); the
		// duplicate adds no row, so wait for the consumer's commit of it.
		return n >= 2 && committed(t, adm, Group) == 4
	})
	stop, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := cons.Stop(stop); err != nil {
		t.Fatal(err)
	}
	w.Records["processed"] += 2
	w.Records["duplicate"]++
	w.Records["dead_lettered"]++
	w.Duplicates++
	w.DeadLetters++
	w.Retries++ // two handler failures: the first retried, the second dead-letters
	if f := failures.Load(); f != 2 {
		t.Fatalf("the handler failed %d times on ev-3, want 2", f)
	}

	var rows int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM processed_event`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	purger, err := inbox.NewPurger(db.Pool, &inbox.PurgerConfig{Hook: h.InboxPurge, Logger: quiet, Retention: time.Minute,
		Now: func() time.Time { return time.Now().Add(time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	if err := purger.Start(ctx); err != nil {
		t.Fatal(err)
	}
	poll(t, "the inbox purge", func() bool {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM processed_event`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	if err := purger.Stop(stop); err != nil {
		t.Fatal(err)
	}
	w.InboxPurged = rows
}

// committed is the group's committed offset of partition 0 of Topic, -1
// when there is none yet.
func committed(t *testing.T, adm *kadm.Client, group string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	offs, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		return -1
	}
	o, ok := offs.Lookup(Topic, 0)
	if !ok || o.Err != nil {
		return -1
	}
	return o.At
}

// client: a call whose first attempt gets 503 and second 201 (2 attempts,
// 1 retry), then a call answered as replayed (1 attempt).
func client(t *testing.T, h Hooks, w *Want) {
	var mu sync.Mutex
	seen := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		mu.Lock()
		key := r.Header.Get(idem.HeaderKey)
		seen[key]++
		n := seen[key]
		mu.Unlock()
		switch {
		case key == "c-1" && n == 1:
			rw.Header().Set("Retry-After", "0")
			rw.WriteHeader(http.StatusServiceUnavailable)
		case key == "c-2":
			rw.Header().Set(idem.HeaderReplayed, "true")
			rw.WriteHeader(http.StatusCreated)
		default:
			rw.WriteHeader(http.StatusCreated)
		}
	}))
	t.Cleanup(srv.Close)
	hc := srv.Client()
	ic, err := idemclient.New(hc, &idemclient.Config{BackoffMin: time.Millisecond, BackoffMax: time.Millisecond, Hook: h.Client})
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"c-1", "c-2"} {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/x", strings.NewReader("{}"))
		resp, err := ic.Do(req, key)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	w.Attempts["status"]++
	w.Attempts["ok"] += 2
	w.ClientRetries["status"]++
}

// poll checks cond every 10ms until it holds, failing the test after 20s.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond) // a polling interval, not a wait for an event
	}
}
