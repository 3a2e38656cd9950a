package outbox_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// conn opens a session of its own on db (the doorbell's locks are the
// session's).
func conn(t *testing.T, db *testdb.DB) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), db.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// The arm's three outcomes, each for its reason: armed when nobody else
// is; other while another relay is armed; busy while an enqueue that rang
// no bell is uncommitted, and armed once it has committed.
func TestDoorbellArmStates(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	a, b := conn(t, db), conn(t, db)
	arm := func(c *pgx.Conn, want string) {
		t.Helper()
		got, err := outbox.ArmDoorbell(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("arm = %q, want %q", got, want)
		}
	}
	arm(a, "armed")
	arm(b, "other")
	if err := outbox.DisarmDoorbell(ctx, a); err != nil {
		t.Fatal(err)
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := outbox.EnqueueTx(ctx, tx, msg("x", 1)); err != nil {
		t.Fatal(err)
	}
	arm(b, "busy")
	arm(a, "busy") // busy let the relays' lock go again: a gets as far as b
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	arm(b, "armed")
}

// An enqueue rings (sends the NOTIFY) exactly when a relay is armed, one
// event or many. A listener proves it without a timeout: after each
// enqueue a marker NOTIFY is sent, and notifications arrive in commit
// order, so the enqueue rang iff something arrives before the marker.
func TestEnqueueRingsOnlyWhileARelayIsArmed(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	listener, relay := conn(t, db), conn(t, db)
	if _, err := listener.Exec(ctx, "LISTEN "+outbox.NotifyChannel); err != nil {
		t.Fatal(err)
	}
	// The channel is the database's: other tests' enqueues ring on it too,
	// with their table's oid.
	var oid string
	if err := db.Pool.QueryRow(ctx, "SELECT 'outbox_event'::regclass::oid::text").Scan(&oid); err != nil {
		t.Fatal(err)
	}
	next := func(ctx context.Context) string {
		t.Helper()
		for {
			n, err := listener.WaitForNotification(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if n.Payload == oid || n.Payload == "marker "+oid {
				return n.Payload
			}
		}
	}
	rang := func(msgs ...outbox.Message) bool {
		t.Helper()
		enqueue(t, db.Pool, msgs...)
		if _, err := db.Pool.Exec(ctx, "SELECT pg_notify($1, 'marker ' || $2)", outbox.NotifyChannel, oid); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if next(wctx) != oid {
			return false
		}
		if m := next(wctx); m != "marker "+oid {
			t.Fatalf("after the enqueue's NOTIFY: %q; want the marker", m)
		}
		return true
	}
	if rang(msg("a", 1)) || rang(msg("b", 1), msg("c", 1)) {
		t.Fatal("an enqueue rang with no relay armed")
	}
	if st, err := outbox.ArmDoorbell(ctx, relay); err != nil || st != "armed" {
		t.Fatalf("arm: %q, %v", st, err)
	}
	if !rang(msg("a", 2)) || !rang(msg("b", 2), msg("c", 2)) {
		t.Fatal("an enqueue did not ring with a relay armed")
	}
	if err := outbox.DisarmDoorbell(ctx, relay); err != nil {
		t.Fatal(err)
	}
	if rang(msg("a", 3)) {
		t.Fatal("an enqueue rang after the relay disarmed")
	}
}

// No event waits for the poll interval: with PollInterval an hour, two
// relays and enqueuers committing at random moments (some keeping their
// transaction open a while after the enqueue, some in bursts, some after
// a pause long enough for both relays to fall asleep), every event is
// delivered. An event committed in the gap between a relay's last claim
// and its sleep, without a NOTIFY, would wait the hour and fail the test.
func TestDoorbellStrandsNoEvent(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, testdb.MaxConns(20))
	ctx := context.Background()
	rec := newRecorder()
	for i := range 2 {
		r := newRelay(t, db, rec, outbox.RelayConfig{PollInterval: time.Hour, Owner: fmt.Sprintf("bell-%d", i)})
		if err := r.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	const writers, each = 6, 40
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), 7))
			for i := range each {
				if rnd.IntN(8) == 0 {
					time.Sleep(time.Duration(rnd.IntN(40)) * time.Millisecond) // both relays asleep
				}
				err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					if _, err := outbox.EnqueueTx(ctx, tx, msg(fmt.Sprintf("w%d", w), i)); err != nil {
						return err
					}
					if rnd.IntN(3) == 0 {
						time.Sleep(time.Duration(rnd.IntN(3000)) * time.Microsecond) // open after the enqueue
					}
					return nil
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	eventually(t, "every event delivered", func() bool { return len(rec.deliveredIDs()) >= writers*each })
	got := rec.deliveredIDs()
	for w := range writers {
		for i := range each {
			if id := fmt.Sprintf("w%d-%d", w, i); !slices.Contains(got, id) {
				t.Fatalf("%s not delivered", id)
			}
		}
	}
}

// The last look: an event committed after a relay's claim came back empty
// and before the relay armed the doorbell rang nothing (nobody was armed),
// so only the claim the relay runs after arming can find it. Once the
// listener is up, a bare NOTIFY makes the relay run an empty batch, and the
// hook commits such an event at exactly that moment (the end of that
// batch, before the arm); with PollInterval an hour the event is delivered
// only if that claim runs.
func TestDoorbellLastLookFindsTheEventBeforeTheArm(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	rec := newRecorder()
	owner := uniqueOwner("last-look")
	var armedHook atomic.Bool
	var once sync.Once
	hook := func(ctx context.Context, e outbox.RelayEvent) context.Context {
		if armedHook.Load() && e.Kind == outbox.RelayBatchDone && e.Count == 0 && e.Err == nil {
			once.Do(func() { // the relay's goroutine: t.Error, not t.Fatal
				if _, err := outbox.Enqueue(context.WithoutCancel(ctx), db.Pool, msg("late", 1)); err != nil {
					t.Error(err)
				}
			})
		}
		return ctx
	}
	r := newRelay(t, db, rec, outbox.RelayConfig{PollInterval: time.Hour, Owner: owner, Hook: hook})
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "listener", func() bool {
		var n int
		_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND query LIKE 'LISTEN%'`, outbox.ListenerApplicationName(owner)).Scan(&n)
		return n == 1
	})
	armedHook.Store(true)
	// The table's oid, not an empty payload, which would wake the relays
	// of every test in the database.
	if _, err := db.Pool.Exec(ctx, "SELECT pg_notify($1, 'outbox_event'::regclass::oid::text)", outbox.NotifyChannel); err != nil {
		t.Fatal(err)
	}
	eventually(t, "late-1 delivered", func() bool { return slices.Contains(rec.deliveredIDs(), "late-1") })
}

// A relay that finds another one armed still takes a last look before it
// sleeps. The armed relay's own last look can have found an aggregate
// locked by this relay's batch; the events committed behind it during
// that batch rang no bell (nobody was armed then) and would wait for the
// poll interval. Here: relay 1, armed and asleep, is rung awake by x-1 and
// holds it in its publish while x-2 commits; relay 2 arms and sleeps (x-2
// is behind a locked head); relay 1 finishes, finds relay 2 armed, and
// must take x-2 itself.
func TestDoorbellOtherArmedStillLooks(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	slow := newRecorder()
	slow.entered = make(chan []outbox.Event, 1)
	slow.release = make(chan struct{})
	fast := newRecorder()
	// Each relay says when it goes to sleep armed: relay 1 must be asleep
	// (not in its last look, which would take x-1 while still armed) when
	// x-1 rings it, and relay 2 asleep armed before relay 1 finishes.
	sleptArmed := func(r *outbox.Relay) chan struct{} {
		c := make(chan struct{}, 64)
		outbox.OnSleep(r, func(armed bool) {
			if armed {
				select {
				case c <- struct{}{}:
				default:
				}
			}
		})
		return c
	}
	wait := func(c chan struct{}, what string) {
		t.Helper()
		select {
		case <-c:
		case <-time.After(20 * time.Second):
			t.Fatalf("timed out waiting for %s", what)
		}
	}
	r1 := newRelay(t, db, slow, outbox.RelayConfig{PollInterval: time.Hour, Owner: uniqueOwner("r1")})
	asleep1 := sleptArmed(r1)
	if err := r1.Start(ctx); err != nil {
		t.Fatal(err)
	}
	wait(asleep1, "relay 1 asleep armed")
	enqueue(t, db.Pool, msg("x", 1)) // rings relay 1 awake
	<-slow.entered                   // relay 1 holds x-1, disarmed
	enqueue(t, db.Pool, msg("x", 2)) // nobody armed: no bell
	r2 := newRelay(t, db, fast, outbox.RelayConfig{PollInterval: time.Hour, Owner: uniqueOwner("r2")})
	asleep2 := sleptArmed(r2)
	if err := r2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	wait(asleep2, "relay 2 asleep armed")
	close(slow.release)
	eventually(t, "x-2 delivered", func() bool {
		return slices.Contains(slow.deliveredIDs(), "x-2") || slices.Contains(fast.deliveredIDs(), "x-2")
	})
}

// uniqueOwner names a relay for this run only: tests in other schemas of
// the database run at the same time, and pg_stat_activity is the server's.
func uniqueOwner(prefix string) string { return fmt.Sprintf("%s-%d", prefix, rand.Int64()) }

// armedBy reports whether the relay of owner holds the doorbell armed.
func armedBy(t *testing.T, db *testdb.DB) func(owner string) func() bool {
	return func(owner string) func() bool {
		return func() bool {
			var n int
			if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
				WHERE l.locktype = 'advisory' AND l.granted AND l.mode = 'ExclusiveLock'
				  AND l.classid = 1768189184 AND l.objid = 'outbox_event'::regclass::oid
				  AND a.application_name = $1`, outbox.DoorbellApplicationName(owner)).Scan(&n); err != nil {
				t.Error(err)
			}
			return n == 1
		}
	}
}

// A relay that stops while armed rings the bell on its way out: relay 2,
// asleep because relay 1 was armed, wakes, arms in its turn, and is rung
// by the next enqueue.
func TestDoorbellArmedRelayRingsWhenItStops(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	rec := newRecorder()
	armedBy := armedBy(t, db)
	o1, o2 := uniqueOwner("r1"), uniqueOwner("r2")
	r1 := newRelay(t, db, rec, outbox.RelayConfig{PollInterval: time.Hour, Owner: o1})
	if err := r1.Start(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "relay 1 armed", armedBy(o1))
	r2 := newRelay(t, db, rec, outbox.RelayConfig{PollInterval: time.Hour, Owner: o2})
	if err := r2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "relay 2 listening", func() bool {
		var n int
		_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND query LIKE 'LISTEN%'`, outbox.ListenerApplicationName(o2)).Scan(&n)
		return n == 1
	})
	if err := r1.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "relay 2 armed", armedBy(o2))
	enqueue(t, db.Pool, msg("y", 1))
	eventually(t, "y-1 delivered", func() bool { return slices.Contains(rec.deliveredIDs(), "y-1") })
}

// The claim's predecessor check rests on this: within an aggregate, ids
// follow sequences (EnqueueTx takes both under the aggregate's counter row
// lock). Interleaved aggregates in one statement, single events, and
// concurrent transactions on the same aggregates: for every aggregate,
// ordering its events by id orders them by sequence.
func TestEnqueueIdsFollowSequences(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, testdb.MaxConns(16))
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				var msgs []outbox.Message
				for k := range 1 + (w+i)%4 { // one to four events, aggregates interleaved
					m := msg([]string{"a", "b", "c"}[(w+i+k)%3], 0)
					m.EventID = ""
					msgs = append(msgs, m)
				}
				if _, err := outbox.Enqueue(ctx, db.Pool, msgs...); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	var bad int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM (
		SELECT aggregate_seq, lag(aggregate_seq) OVER (PARTITION BY aggregate_type, aggregate_id ORDER BY id) AS prev
		FROM outbox_event) x WHERE prev IS NOT NULL AND aggregate_seq <> prev + 1`).Scan(&bad); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM outbox_event").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if bad != 0 || n == 0 {
		t.Fatalf("%d of %d events do not follow their predecessor by id", bad, n)
	}
}

// A cut doorbell connection (its backend terminated while the relay sleeps
// armed) drops the lock, so enqueues stop ringing: the relay finds the
// event (woken by the cut, or at the latest at its next poll), the failed
// disarm closes the dead connection, and the next arm opens another, so
// the bell works again.
func TestDoorbellConnectionCutRearms(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	rec := newRecorder()
	owner := uniqueOwner("cut")
	r := newRelay(t, db, rec, outbox.RelayConfig{PollInterval: 300 * time.Millisecond, Owner: owner})
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	bellPID := func() int {
		var pid int
		_ = db.Pool.QueryRow(ctx, `SELECT coalesce(max(l.pid), 0) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
			WHERE l.locktype = 'advisory' AND l.granted AND l.mode = 'ExclusiveLock'
			  AND l.classid = 1768189184 AND l.objid = 'outbox_event'::regclass::oid
			  AND a.application_name = $1`, outbox.DoorbellApplicationName(owner)).Scan(&pid)
		return pid
	}
	var pid int
	eventually(t, "armed", func() bool { pid = bellPID(); return pid != 0 })
	if _, err := db.Pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	enqueue(t, db.Pool, msg("c", 1)) // rings nobody: the lock went with the backend
	eventually(t, "c-1 delivered by the poll", func() bool { return slices.Contains(rec.deliveredIDs(), "c-1") })
	eventually(t, "armed again on another connection", func() bool { p := bellPID(); return p != 0 && p != pid })
}

// sleeps reports each time r's loop goes to sleep with its listener up,
// saying whether it sleeps armed. Set before Start.
func sleeps(r *outbox.Relay) chan bool {
	c := make(chan bool, 64)
	outbox.OnSleep(r, func(armed bool) {
		if outbox.Listening(r) {
			select {
			case c <- armed:
			default:
			}
		}
	})
	return c
}

// nextSleep waits for r's next sleep (see sleeps) and says whether it is
// armed.
func nextSleep(t *testing.T, c chan bool, what string) bool {
	t.Helper()
	select {
	case armed := <-c:
		return armed
	case <-time.After(20 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		return false
	}
}

// asleepArmed waits until r (see sleeps) has slept armed for a while with
// no other sleep since: a wake-up that was already due (the listener's
// first, say) has come and gone, so the relay is asleep, not about to
// wake. The pause only sets up the premise; nothing is timed.
func asleepArmed(t *testing.T, c chan bool) {
	t.Helper()
	armed := nextSleep(t, c, "relay asleep armed")
	for {
		select {
		case armed = <-c:
		case <-time.After(200 * time.Millisecond):
			if armed {
				return
			}
			armed = nextSleep(t, c, "relay asleep armed")
		}
	}
}

// pidOf is the backend pid of the session with application_name name, or 0.
func pidOf(t *testing.T, db *testdb.DB, name string) int {
	t.Helper()
	var pid int
	if err := db.Pool.QueryRow(context.Background(), `SELECT coalesce(max(pid), 0) FROM pg_stat_activity
		WHERE application_name = $1`, name).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

// A relay asleep because another one was armed ('other') relies on that
// relay: while it lives it takes its own last look before each sleep. When
// the armed relay wakes by other means than a NOTIFY (here its listener
// reconnects), the sleeper is not woken, and if the relay then stops
// before it arms again, nobody is armed and nobody rings: the stopping
// relay must ring even though it is not armed, or the sleeper waits for
// its PollInterval (an hour here).
func TestDoorbellRelayStoppingUnarmedWakesOtherSleepers(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	rec := newRecorder()
	o1, o2 := uniqueOwner("r1"), uniqueOwner("r2")
	var gate atomic.Bool
	inBatch := make(chan struct{}, 1)
	hook := func(ctx context.Context, e outbox.RelayEvent) context.Context {
		if e.Kind == outbox.RelayBatchBegin && gate.Load() {
			select {
			case inBatch <- struct{}{}:
			default:
			}
			<-ctx.Done() // the hard stop
		}
		return ctx
	}
	r1 := newRelay(t, db, rec, outbox.RelayConfig{PollInterval: time.Hour, Owner: o1, Hook: hook})
	s1 := sleeps(r1)
	if err := r1.Start(ctx); err != nil {
		t.Fatal(err)
	}
	asleepArmed(t, s1)
	r2 := newRelay(t, db, rec, outbox.RelayConfig{PollInterval: time.Hour, Owner: o2})
	s2 := sleeps(r2)
	if err := r2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if nextSleep(t, s2, "relay 2 asleep") {
		t.Fatal("relay 2 armed although relay 1 was")
	}
	// Wake relay 1 alone: its listener reconnects and wakes its loop.
	gate.Store(true)
	if _, err := db.Pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pidOf(t, db, outbox.ListenerApplicationName(o1))); err != nil {
		t.Fatal(err)
	}
	select {
	case <-inBatch: // relay 1 disarmed, in a batch
	case <-time.After(20 * time.Second):
		t.Fatal("relay 1 did not wake")
	}
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := r1.HardStop(sctx); err != nil {
		t.Fatal(err)
	}
	enqueue(t, db.Pool, msg("s", 1))
	eventually(t, "s-1 delivered", func() bool { return slices.Contains(rec.deliveredIDs(), "s-1") })
}

// A batch whose delivery failed (recorded: the event waits for its retry)
// is progress like any other: the relay arms before it sleeps. A relay
// that slept unarmed after it would not be rung by the next enqueue, of
// any aggregate, and that event would wait for PollInterval (an hour
// here).
func TestDoorbellArmsAfterAFailedDelivery(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			ctx := context.Background()
			rec := newRecorder()
			rec.fail = func(e outbox.Event) error {
				if e.AggregateID == "f" {
					return fmt.Errorf("broker refuses %s", e.EventID)
				}
				return nil
			}
			r := newRelay(t, db, rec, outbox.RelayConfig{
				Mode: mode, PollInterval: time.Hour, BackoffMin: time.Hour, BackoffMax: time.Hour,
				Owner: uniqueOwner("fail"),
			})
			s := sleeps(r)
			if err := r.Start(ctx); err != nil {
				t.Fatal(err)
			}
			asleepArmed(t, s)
			enqueue(t, db.Pool, msg("f", 1)) // rings; its delivery fails
			nextSleep(t, s, "relay asleep after the failure")
			enqueue(t, db.Pool, msg("g", 1))
			eventually(t, "g-1 delivered", func() bool { return slices.Contains(rec.deliveredIDs(), "g-1") })
		})
	}
}

// A doorbell connection cut while the relay is awake (here: in a publish)
// makes its next arm fail. The relay must arm on a new connection rather
// than sleep unarmed, or the next enqueue rings nobody and its event waits
// for PollInterval (an hour here).
func TestDoorbellConnectionCutWhileAwakeRearmsAtOnce(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	rec := newRecorder()
	rec.entered = make(chan []outbox.Event, 1)
	rec.release = make(chan struct{})
	owner := uniqueOwner("cut-awake")
	r := newRelay(t, db, rec, outbox.RelayConfig{PollInterval: time.Hour, Owner: owner})
	s := sleeps(r)
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	asleepArmed(t, s)
	enqueue(t, db.Pool, msg("a", 1)) // rings
	<-rec.entered                    // the relay is in the publish, disarmed
	if _, err := db.Pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pidOf(t, db, outbox.DoorbellApplicationName(owner))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "doorbell backend gone", func() bool { return pidOf(t, db, outbox.DoorbellApplicationName(owner)) == 0 })
	close(rec.release)
	nextSleep(t, s, "relay asleep after the batch")
	enqueue(t, db.Pool, msg("b", 1))
	eventually(t, "b-1 delivered", func() bool { return slices.Contains(rec.deliveredIDs(), "b-1") })
}

// A doorbell connection cut while the relay sleeps armed drops its lock,
// so enqueues ring nobody: the relay must notice the cut while it sleeps,
// wake and arm again on a new connection, or the next event waits for
// PollInterval (an hour here). TestDoorbellConnectionCutRearms covers the
// same cut with a short PollInterval, found by the poll.
func TestDoorbellConnectionCutWhileArmedWakesTheRelay(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	rec := newRecorder()
	owner := uniqueOwner("cut-armed")
	r := newRelay(t, db, rec, outbox.RelayConfig{PollInterval: time.Hour, Owner: owner})
	s := sleeps(r)
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	asleepArmed(t, s)
	pid := pidOf(t, db, outbox.DoorbellApplicationName(owner))
	if _, err := db.Pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	eventually(t, "armed again on another connection", func() bool {
		p := pidOf(t, db, outbox.DoorbellApplicationName(owner))
		return p != 0 && p != pid && armedBy(t, db)(owner)()
	})
	enqueue(t, db.Pool, msg("c", 1))
	eventually(t, "c-1 delivered", func() bool { return slices.Contains(rec.deliveredIDs(), "c-1") })
}

// Savepoints: an enqueue's shared lock and its NOTIFY belong to its
// subtransaction. Rolled back, the lock goes with the events (a relay can
// arm while the transaction stays open, instead of finding it busy until
// the commit), and so does the NOTIFY; an enqueue after it in the same
// transaction rings again, and the relay is woken at the commit.
func TestDoorbellSavepointRollback(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	relay, listener := conn(t, db), conn(t, db)
	if _, err := listener.Exec(ctx, "LISTEN "+outbox.NotifyChannel); err != nil {
		t.Fatal(err)
	}
	var oid string
	if err := db.Pool.QueryRow(ctx, "SELECT 'outbox_event'::regclass::oid::text").Scan(&oid); err != nil {
		t.Fatal(err)
	}
	arm := func(want string) {
		t.Helper()
		if got, err := outbox.ArmDoorbell(ctx, relay); err != nil || got != want {
			t.Fatalf("arm = %q, %v; want %q", got, err, want)
		}
	}
	exec := func(tx pgx.Tx, sql string) {
		t.Helper()
		if _, err := tx.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	exec(tx, "SAVEPOINT s")
	if _, err := outbox.EnqueueTx(ctx, tx, msg("sp", 1)); err != nil {
		t.Fatal(err)
	}
	arm("busy")
	exec(tx, "ROLLBACK TO SAVEPOINT s")
	arm("armed")
	exec(tx, "SAVEPOINT s2")
	if _, err := outbox.EnqueueTx(ctx, tx, msg("sp", 2)); err != nil { // rings
		t.Fatal(err)
	}
	// The rollback takes that ring back.
	exec(tx, "ROLLBACK TO SAVEPOINT s2")
	if _, err := outbox.EnqueueTx(ctx, tx, msg("sp", 3)); err != nil { // rings again
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for {
		n, err := listener.WaitForNotification(wctx)
		if err != nil {
			t.Fatalf("no NOTIFY for the committed enqueue: %v", err)
		}
		if n.Payload == oid {
			break
		}
	}
	var ids []string
	rows, err := db.Pool.Query(ctx, "SELECT event_id FROM outbox_event ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	if ids, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids, []string{"sp-3"}) {
		t.Fatalf("events %v, want [sp-3]", ids)
	}
}

// An event committed while the relay sleeps armed and its listener is down
// rings into the void (the relay holds the lock, nobody listens): the
// listener's reconnect must wake the loop, or the event waits for
// PollInterval (an hour here). The hook commits the event at exactly that
// moment: the listener has failed and not yet reconnected.
// TestNotifyWakesRelayAndListenerReconnects enqueues only once the
// listener is back.
func TestDoorbellEventWhileListenerIsDown(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	rec := newRecorder()
	owner := uniqueOwner("listen-down")
	var once sync.Once
	rang := make(chan struct{})
	hook := func(ctx context.Context, e outbox.RelayEvent) context.Context {
		if e.Kind == outbox.RelayListenFailed {
			once.Do(func() { // the listener's goroutine: t.Error, not t.Fatal
				defer close(rang)
				if _, err := outbox.Enqueue(context.WithoutCancel(ctx), db.Pool, msg("d", 1)); err != nil {
					t.Error(err)
				}
			})
		}
		return ctx
	}
	r := newRelay(t, db, rec, outbox.RelayConfig{PollInterval: time.Hour, Owner: owner, Hook: hook})
	s := sleeps(r)
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	asleepArmed(t, s)
	if _, err := db.Pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pidOf(t, db, outbox.ListenerApplicationName(owner))); err != nil {
		t.Fatal(err)
	}
	select {
	case <-rang:
	case <-time.After(20 * time.Second):
		t.Fatal("the listener did not fail")
	}
	eventually(t, "d-1 delivered", func() bool { return slices.Contains(rec.deliveredIDs(), "d-1") })
}

// The watch of an armed sleep (see TestDoorbellConnectionCutWhileArmedWakesTheRelay)
// ends with a read deadline, which must leave the connection usable: a
// relay woken again and again keeps its one doorbell connection. A watch
// that broke it would still deliver (the disarm fails, the arm reconnects)
// at the cost of a new connection per wake-up.
func TestDoorbellWatchKeepsTheConnection(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	rec := newRecorder()
	owner := uniqueOwner("watch")
	r := newRelay(t, db, rec, outbox.RelayConfig{PollInterval: time.Hour, Owner: owner})
	s := sleeps(r)
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	asleepArmed(t, s)
	pid := pidOf(t, db, outbox.DoorbellApplicationName(owner))
	for i := range 5 {
		enqueue(t, db.Pool, msg("w", i+1)) // rings
		id := fmt.Sprintf("w-%d", i+1)
		eventually(t, id+" delivered", func() bool { return slices.Contains(rec.deliveredIDs(), id) })
		asleepArmed(t, s)
		if p := pidOf(t, db, outbox.DoorbellApplicationName(owner)); p != pid {
			t.Fatalf("after wake-up %d the doorbell's backend is %d, was %d", i+1, p, pid)
		}
	}
}
