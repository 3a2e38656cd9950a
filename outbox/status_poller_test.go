package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/internal/testbin"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/lifecycle"
	"github.com/idemkit/idem/outbox"
)

var (
	_ lifecycle.Component   = (*outbox.StatusPoller)(nil)
	_ lifecycle.HardStopper = (*outbox.StatusPoller)(nil)
)

// pollerEvents is a StatusPoller hook that hands every event to a channel
// (buffered far beyond what a test reads), so that a test waits for a read
// by its event rather than by time.
type pollerEvents chan outbox.StatusEvent

func (ch pollerEvents) hook(ctx context.Context, e outbox.StatusEvent) context.Context {
	ch <- e
	return ctx
}

// next returns the next event of one of the kinds, skipping the others.
func (ch pollerEvents) next(t *testing.T, kinds ...outbox.StatusEventKind) outbox.StatusEvent {
	t.Helper()
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	for {
		select {
		case e := <-ch:
			for _, k := range kinds {
				if e.Kind == k {
					return e
				}
			}
		case <-deadline.C:
			t.Fatalf("no %v event within 20s", kinds)
		}
	}
}

// awaitClosed waits for ch to be closed, failing the test after 20s
// rather than hanging it.
func awaitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(20 * time.Second):
		t.Fatalf("no %s within 20s", what)
	}
}

func newPoller(t *testing.T, db outbox.DBTX, cfg outbox.StatusPollerConfig) *outbox.StatusPoller {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	p, err := outbox.NewStatusPoller(db, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := p.HardStop(ctx); err != nil {
			t.Errorf("hard stop: %v", err)
		}
	})
	return p
}

// heldPoller is a poller whose reads each wait, in the begin
// hook, until release is closed or the read's ctx ends (a hard stop);
// began is closed when the first read begins.
func heldPoller(t *testing.T, db outbox.DBTX, logger *slog.Logger) (p *outbox.StatusPoller, ev pollerEvents, began, release chan struct{}) {
	t.Helper()
	ev, began, release = make(pollerEvents, 16), make(chan struct{}), make(chan struct{})
	var once sync.Once
	p = newPoller(t, db, outbox.StatusPollerConfig{Interval: time.Hour, Logger: logger,
		Hook: func(ctx context.Context, e outbox.StatusEvent) context.Context {
			if e.Kind == outbox.StatusReadBegin {
				once.Do(func() { close(began) })
				select {
				case <-release:
				case <-ctx.Done():
				}
			}
			return ev.hook(ctx, e)
		}})
	return p, ev, began, release
}

func TestStatusPollerConfig(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	for _, tt := range []struct {
		db    outbox.DBTX
		cfg   *outbox.StatusPollerConfig
		field string
	}{
		{nil, nil, "db"},
		{db.Pool, &outbox.StatusPollerConfig{Interval: -time.Second}, "Interval"},
		{db.Pool, &outbox.StatusPollerConfig{LeaseTTL: -time.Second}, "LeaseTTL"},
	} {
		_, err := outbox.NewStatusPoller(tt.db, tt.cfg)
		if !errors.Is(err, outbox.ErrInvalidConfig) || !strings.Contains(err.Error(), tt.field) {
			t.Errorf("%+v: err = %v, want ErrInvalidConfig naming %s", tt.cfg, err, tt.field)
		}
	}
	// A nil config is all defaults, and the defaults are valid.
	if _, err := outbox.NewStatusPoller(db.Pool, nil); err != nil {
		t.Errorf("nil config: %v", err)
	}
}

// Last is nil before the first read has succeeded, including while the
// first read is in hand, and the snapshot of the database once it has.
func TestStatusPollerLastBeforeFirstRead(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	enqueue(t, db.Pool, msg("a", 1), msg("b", 1))
	p, ev, began, release := heldPoller(t, db.Pool, nil)
	if st := p.Last(); st != nil {
		t.Fatalf("Last before Start = %+v, want nil", st)
	}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	awaitClosed(t, began, "the first read's begin")
	if st := p.Last(); st != nil {
		t.Fatalf("Last during the first read = %+v, want nil", st)
	}
	close(release)
	e := ev.next(t, outbox.StatusReadDone, outbox.StatusReadFailed)
	if e.Kind != outbox.StatusReadDone {
		t.Fatalf("first read: %+v", e)
	}
	st := p.Last()
	if st == nil || st != e.Status || st.Pending != 2 {
		t.Fatalf("Last after the first read = %+v, want the event's snapshot (%p) with 2 pending", st, e.Status)
	}
	if err := p.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Start twice is one run; Stop and HardStop twice are no-ops; a Start
// after a stop is a fresh run that reads again at once.
func TestStatusPollerStartStopTwice(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ev := make(pollerEvents, 64)
	p := newPoller(t, db.Pool, outbox.StatusPollerConfig{Interval: time.Hour, Hook: ev.hook})
	ctx := context.Background()
	if err := p.Stop(ctx); err != nil {
		t.Fatalf("Stop before Start: %v", err)
	}
	for i := range 2 {
		if err := p.Start(ctx); err != nil {
			t.Fatalf("run %d: Start: %v", i, err)
		}
		if err := p.Start(ctx); err != nil {
			t.Fatalf("run %d: Start on a running poller: %v", i, err)
		}
		if e := ev.next(t, outbox.StatusReadDone, outbox.StatusReadFailed); e.Kind != outbox.StatusReadDone {
			t.Fatalf("run %d: read: %+v", i, e)
		}
		enqueue(t, db.Pool, msg("a", i+1))
		stop := p.Stop
		if i == 1 {
			stop = p.HardStop
		}
		if err := stop(ctx); err != nil {
			t.Fatalf("run %d: stop: %v", i, err)
		}
		if err := stop(ctx); err != nil {
			t.Fatalf("run %d: second stop: %v", i, err)
		}
	}
	// The second run read after the first enqueue: its snapshot is Last.
	if st := p.Last(); st == nil || st.Pending != 1 {
		t.Fatalf("Last = %+v, want the second run's read (1 pending)", st)
	}
}

// The soft stop lets the read in hand finish and keeps its snapshot.
func TestStatusPollerStopFinishesRead(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	enqueue(t, db.Pool, msg("a", 1))
	p, ev, began, release := heldPoller(t, db.Pool, nil)
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	awaitClosed(t, began, "the first read's begin")
	// A Stop whose ctx has already ended begins the stop and returns at
	// once: the soft stop is in force while the read is still in hand.
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if err := p.Stop(ended); !errors.Is(err, context.Canceled) {
		t.Fatalf("Stop(ended ctx) = %v, want context.Canceled", err)
	}
	close(release)
	if err := p.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if e := ev.next(t, outbox.StatusReadDone, outbox.StatusReadFailed); e.Kind != outbox.StatusReadDone {
		t.Fatalf("the read in hand at the soft stop: %+v, want done", e)
	}
	if st := p.Last(); st == nil || st.Pending != 1 {
		t.Fatalf("Last = %+v, want the read in hand's snapshot", st)
	}
}

// The hard stop cancels the read in hand; the loop does not warn about
// it, and Last stays as it was.
func TestStatusPollerHardStopCancelsRead(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	var logs testbin.Buffer
	p, ev, began, _ := heldPoller(t, db.Pool, slog.New(slog.NewTextHandler(&logs, nil)))
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	awaitClosed(t, began, "the first read's begin")
	if err := p.HardStop(context.Background()); err != nil {
		t.Fatal(err)
	}
	e := ev.next(t, outbox.StatusReadDone, outbox.StatusReadFailed)
	if e.Kind != outbox.StatusReadFailed || !errors.Is(e.Err, context.Canceled) {
		t.Fatalf("the read in hand at the hard stop: %+v, want failed with context.Canceled", e)
	}
	if st := p.Last(); st != nil {
		t.Fatalf("Last = %+v after a cancelled first read, want nil", st)
	}
	if s := logs.String(); s != "" {
		t.Errorf("the hard stop's cancelled read was logged: %s", s)
	}
}

// Refresh from many goroutines at once, with the loop started: every read
// succeeds and is reported once, and the race detector sees the snapshot
// guarded.
func TestStatusPollerConcurrentRefresh(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	enqueue(t, db.Pool, msg("a", 1), msg("a", 2), msg("b", 1))
	const goroutines, reads = 8, 10
	ev := make(pollerEvents, 4*goroutines*reads)
	p := newPoller(t, db.Pool, outbox.StatusPollerConfig{Interval: time.Hour, Hook: ev.hook})
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The loop's first read, before any Refresh: so the count below is
	// exact.
	if e := ev.next(t, outbox.StatusReadDone, outbox.StatusReadFailed); e.Kind != outbox.StatusReadDone {
		t.Fatalf("the loop's first read: %+v", e)
	}
	errs := make(chan error, 2*goroutines*reads)
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range reads {
				errs <- p.Refresh(context.Background())
				if st := p.Last(); st == nil || st.Pending != 3 {
					errs <- fmt.Errorf("Last after a Refresh = %+v, want 3 pending", st)
				}
			}
		})
	}
	wg.Wait()
	if err := p.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	close(ev)
	count := map[outbox.StatusEventKind]int{}
	for e := range ev {
		count[e.Kind]++
	}
	// Every Refresh, and nothing else (the loop's begin was read above).
	if want := goroutines * reads; count[outbox.StatusReadBegin] != want || count[outbox.StatusReadDone] != want || count[outbox.StatusReadFailed] != 0 {
		t.Fatalf("events %v, want %d begins and %d done", count, want, want)
	}
}

// A database error: Refresh returns it as GetStatus does ("outbox:
// status: …" wrapping the *pgconn.PgError), the hook reports it, Last
// keeps the snapshot before it, the loop logs it and goes on.
func TestStatusPollerDBError(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	var logs testbin.Buffer
	ev := make(pollerEvents, 64)
	p := newPoller(t, db.Pool, outbox.StatusPollerConfig{Interval: time.Hour,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), Hook: ev.hook})
	ctx := context.Background()
	if err := p.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	before := p.Last()
	// The test's own schema: the table is gone for this poller only.
	if _, err := db.Pool.Exec(ctx, "ALTER TABLE outbox_event RENAME TO outbox_event_away"); err != nil {
		t.Fatal(err)
	}
	err := p.Refresh(ctx)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42P01" || !strings.HasPrefix(err.Error(), "outbox: status: ") {
		t.Fatalf("Refresh on a missing table = %v, want outbox: status: wrapping undefined_table (42P01)", err)
	}
	if e := ev.next(t, outbox.StatusReadFailed); e.Err != err {
		t.Errorf("hook Err = %v, want Refresh's %v", e.Err, err)
	}
	if p.Last() != before {
		t.Fatalf("Last = %+v after a failed read, want the snapshot before it", p.Last())
	}

	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	ev.next(t, outbox.StatusReadFailed)
	// Stop waits for the loop, which logs a failed read before it waits
	// for the next.
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if s := logs.String(); !strings.Contains(s, "level=WARN") || !strings.Contains(s, "42P01") {
		t.Errorf("the loop's failed read was not logged as a warning with the error: %q", s)
	}
	if p.Last() != before {
		t.Fatalf("Last = %+v after the loop's failed read, want the snapshot before it", p.Last())
	}

	if _, err := db.Pool.Exec(ctx, "ALTER TABLE outbox_event_away RENAME TO outbox_event"); err != nil {
		t.Fatal(err)
	}
	enqueue(t, db.Pool, msg("a", 1))
	if err := p.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if st := p.Last(); st == before || st.Pending != 1 {
		t.Fatalf("Last = %+v after the table came back, want a fresh read with 1 pending", st)
	}
}
