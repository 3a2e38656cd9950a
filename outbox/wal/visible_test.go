package wal_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/pgtemp"
	"github.com/idemkit/idem/internal/testkafka"
	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/wal"
)

// readBack is a publisher that, before handing a batch on, reads back the
// row each event's transaction wrote (payments.id = the aggregate id), as
// a consumer reacting to the event would: on a connection of its own, in
// a new snapshot.
type readBack struct {
	next outbox.Publisher
	conn *pgx.Conn

	mu        sync.Mutex
	invisible []string // events published before their row was visible
	delivered map[string]bool
	called    chan struct{}
}

func (p *readBack) Publish(ctx context.Context, events []outbox.Event) error {
	p.mu.Lock()
	for _, e := range events {
		var seen bool
		if err := p.conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM payments WHERE id = $1)", e.AggregateID).Scan(&seen); err != nil {
			p.mu.Unlock()
			return err
		}
		if !seen {
			p.invisible = append(p.invisible, e.EventID)
		}
	}
	p.mu.Unlock()
	select {
	case p.called <- struct{}{}:
	default:
	}
	err := p.next.Publish(ctx, events)
	if err == nil {
		p.mu.Lock()
		for _, e := range events {
			p.delivered[e.EventID] = true
		}
		p.mu.Unlock()
	}
	return err
}

func (p *readBack) state(id string) (invisible []string, delivered bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.invisible...), p.delivered[id]
}

// TestRelayPublishesOnlyVisibleTransactions: PostgreSQL flushes a commit
// record, and logical decoding hands the transaction to the slot's
// reader, before the committing backend leaves the running set; until
// then a new snapshot does not see the transaction's writes. A consumer
// that reads back what the event's transaction wrote (billing's charge
// worker settling the payment of a ChargeRequested) must find it, so the
// relay may publish only once the transaction is visible.
//
// Most of the time that window is microseconds (it lost a payment's
// settlement once in the WAL chaos run, with the committing backend
// short of CPU); a synchronous standby that does not answer holds a
// commit in it for as long as the test likes: the cluster names one
// that never connects, so the business transaction's COMMIT waits, its
// commit record decoded and its row invisible, until the test cancels
// the wait (the transaction then stays committed and becomes visible).
func TestRelayPublishesOnlyVisibleTransactions(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, err := pgtemp.Start(ctx, &pgtemp.Config{Settings: []string{"wal_level=logical", "synchronous_standby_names=never_connects"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	admin, err := pgx.Connect(ctx, cl.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	// This session's commits wait for the local flush only: the standby
	// never comes.
	for _, q := range []string{
		"SET synchronous_commit = local",
		"CREATE TABLE payments (id text PRIMARY KEY)",
		"CREATE PUBLICATION vis",
		"SELECT pg_create_logical_replication_slot('vis', 'pgoutput')",
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}

	kc := testkafka.New(t)
	kc.CreateTopic(t, "events", 1)
	kpub, err := kafka.NewPublisher(kc.Client(t, kafka.ProducerOpts()...), nil)
	if err != nil {
		t.Fatal(err)
	}
	check, err := pgx.Connect(ctx, cl.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer check.Close(context.Background())
	pub := &readBack{next: kpub, conn: check, delivered: map[string]bool{}, called: make(chan struct{}, 1)}
	var logBuf syncBuffer
	const prefix = "idem.test.vis"
	r, err := wal.NewRelay(cl.URL, pub, &wal.Config{
		Slot: "vis", Publication: "vis", Prefix: prefix, LagInterval: -1,
		StatusInterval: 50 * time.Millisecond, BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logBuf, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := r.HardStop(ctx); err != nil {
			t.Errorf("hard stop: %v", err)
		}
	})

	// The business transaction: the payment row and its event, committed
	// with synchronous_commit on (the default), so its COMMIT waits for
	// the standby.
	biz, err := pgx.Connect(ctx, cl.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer biz.Close(context.Background())
	tx, err := biz.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO payments (id) VALUES ('pay_1')"); err != nil {
		t.Fatal(err)
	}
	if _, err := (wal.Enqueuer{Prefix: prefix}).EnqueueTx(ctx, tx, msg("pay_1", "pay_1:charge")); err != nil {
		t.Fatal(err)
	}
	committed := make(chan error, 1)
	go func() { committed <- tx.Commit(ctx) }()
	// The hold ends when the wait is cancelled: the server then lets the
	// COMMIT return, the transaction committed locally and now visible.
	bizPID := biz.PgConn().PID()
	var releaseOnce sync.Once
	release := func() {
		releaseOnce.Do(func() {
			if _, err := admin.Exec(context.Background(), "SELECT pg_cancel_backend($1)", bizPID); err != nil {
				t.Errorf("cancel the wait for the standby: %v", err)
			}
		})
	}
	// On every way out, the COMMIT is let through and has returned before
	// its connection closes.
	var commitErr error
	commitDone := false
	defer func() {
		release()
		if !commitDone {
			<-committed
		}
	}()

	// The COMMIT must be held, or the test proves nothing.
	for held := false; !held; {
		if err := admin.QueryRow(ctx, "SELECT coalesce(wait_event = 'SyncRep', false) FROM pg_stat_activity WHERE pid = $1", bizPID).Scan(&held); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-committed:
			commitDone = true
			t.Fatalf("the COMMIT did not wait for the synchronous standby (%v): nothing was held", err)
		case <-time.After(5 * time.Millisecond):
		}
	}

	// Until the hold is lifted the transaction is invisible: the relay
	// either publishes it anyway (caught by readBack) or says that it
	// waits for it.
	const waits = "waits for decoded transactions to become visible"
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
wait:
	for !strings.Contains(logBuf.String(), waits) {
		select {
		case <-pub.called:
			break wait
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("the relay neither published the event nor waited for it:\n%s", logBuf.String())
		}
	}
	if invisible, _ := pub.state(""); len(invisible) > 0 {
		t.Fatalf("published %v while its transaction was not visible", invisible)
	}
	release()
	commitErr, commitDone = <-committed, true
	if commitErr != nil {
		t.Fatalf("commit: %v", commitErr)
	}
	for {
		invisible, delivered := pub.state("pay_1:charge")
		if len(invisible) > 0 {
			t.Fatalf("published %v before its transaction was visible", invisible)
		}
		if delivered {
			break
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("the event was not delivered once its transaction was visible:\n%s", logBuf.String())
		}
	}
}
