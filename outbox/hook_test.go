package outbox_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// hookLog records a relay's hook events.
type hookLog struct {
	mu     sync.Mutex
	events []outbox.RelayEvent
}

type spanKey struct{}

func (h *hookLog) hook(ctx context.Context, e outbox.RelayEvent) context.Context {
	h.mu.Lock()
	defer h.mu.Unlock()
	e.Events = slices.Clone(e.Events) // the relay may reuse it
	h.events = append(h.events, e)
	if e.Kind == outbox.RelayBatchBegin {
		return context.WithValue(ctx, spanKey{}, "span")
	}
	return nil
}

func (h *hookLog) kinds() []outbox.RelayEventKind {
	h.mu.Lock()
	defer h.mu.Unlock()
	var ks []outbox.RelayEventKind
	for _, e := range h.events {
		ks = append(ks, e.Kind)
	}
	return ks
}

func (h *hookLog) of(kind outbox.RelayEventKind) []outbox.RelayEvent {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []outbox.RelayEvent
	for _, e := range h.events {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

func eventIDs(infos []outbox.EventInfo) []string {
	var ids []string
	for _, i := range infos {
		ids = append(ids, i.EventID)
	}
	slices.Sort(ids)
	return ids
}

// One batch reports, in order: its begin (whose returned ctx reaches the
// publisher), its claim, the delivered and the failed events with their
// errors, the events that went DEAD, and its end with the tally. Counts
// and ids are the ones the table shows.
func TestRelayHookBatch(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			rec := newRecorder()
			rec.fail = func(e outbox.Event) error {
				if e.AggregateID == "p" {
					return errors.New("poison")
				}
				return nil
			}
			h := &hookLog{}
			r := newRelay(t, db, rec, outbox.RelayConfig{Mode: mode, DisableNotify: true, MaxAttempts: 1,
				Owner: "hooked", Hook: h.hook})
			enqueue(t, db.Pool, msg("a", 1), msg("p", 1), msg("a", 2), msg("p", 2))
			if n, err := r.RunBatch(context.Background()); n != 4 || err == nil || !strings.Contains(err.Error(), "poison") {
				t.Fatalf("RunBatch = %d, %v", n, err)
			}
			want := []outbox.RelayEventKind{outbox.RelayBatchBegin, outbox.RelayBatchClaimed, outbox.RelayPublished,
				outbox.RelayFailed, outbox.RelayDead, outbox.RelayBatchDone}
			if got := h.kinds(); !slices.Equal(got, want) {
				t.Fatalf("kinds %v, want %v", got, want)
			}
			if v := rec.ctxs[0].Value(spanKey{}); v != "span" {
				t.Fatalf("the publisher's ctx lacks the value the begin hook added (%v)", v)
			}
			for _, e := range h.of(outbox.RelayBatchBegin) {
				if e.Mode != mode || e.Owner != "hooked" {
					t.Fatalf("begin: mode %v owner %q", e.Mode, e.Owner)
				}
			}
			claimed := h.of(outbox.RelayBatchClaimed)[0]
			if claimed.Count != 4 || !slices.Equal(eventIDs(claimed.Events), []string{"a-1", "a-2", "p-1", "p-2"}) {
				t.Fatalf("claimed: %+v", claimed)
			}
			pub := h.of(outbox.RelayPublished)[0]
			if pub.Count != 2 || pub.Calls != 1 || !slices.Equal(eventIDs(pub.Events), []string{"a-1", "a-2"}) {
				t.Fatalf("published: %+v", pub)
			}
			failed := h.of(outbox.RelayFailed)[0]
			if failed.Count != 1 || !slices.Equal(eventIDs(failed.Events), []string{"p-1"}) ||
				failed.Events[0].Err == nil || !strings.Contains(failed.Err.Error(), "poison") {
				t.Fatalf("failed: %+v", failed)
			}
			dead := h.of(outbox.RelayDead)[0]
			if dead.Count != 1 || !slices.Equal(eventIDs(dead.Events), []string{"p-1"}) || dead.Events[0].Attempts != 1 {
				t.Fatalf("dead: %+v", dead)
			}
			done := h.of(outbox.RelayBatchDone)[0]
			if done.Count != 4 || done.Published != 2 || done.Failed != 1 || done.Held != 1 || done.Calls != 1 ||
				done.Err == nil || done.Duration <= 0 {
				t.Fatalf("done: %+v", done)
			}
			if st := statuses(t, db); st["p-1"] != "DEAD" || st["p-2"] != "PENDING" || st["a-2"] != "PUBLISHED" {
				t.Fatalf("statuses %v", st)
			}
			// An idle poll is a batch too: begin and done, nothing between.
			h.mu.Lock()
			h.events = nil
			h.mu.Unlock()
			if n, err := r.RunBatch(context.Background()); n != 0 || err != nil {
				t.Fatalf("idle RunBatch = %d, %v", n, err)
			}
			if got := h.kinds(); !slices.Equal(got, []outbox.RelayEventKind{outbox.RelayBatchBegin, outbox.RelayBatchDone}) {
				t.Fatalf("idle kinds %v", got)
			}
		})
	}
}

// The reaper, the purge and a lost lease report through the hook too.
func TestRelayHookBackground(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	h := &hookLog{}
	r := newRelay(t, db, newRecorder(), outbox.RelayConfig{Mode: outbox.TwoPhase, DisableNotify: true, MaxAttempts: 2,
		Retention: time.Hour, PurgeBatchSize: 2, Hook: h.hook})
	enqueue(t, db.Pool, msg("a", 1), msg("b", 1), msg("c", 1), msg("d", 1), msg("e", 1))
	drain(t, r)
	if _, err := db.Pool.Exec(ctx, "UPDATE outbox_event SET published_at = now() - interval '2 hours'"); err != nil {
		t.Fatal(err)
	}
	if n, err := r.Purge(ctx); n != 5 || err != nil {
		t.Fatalf("purge = %d, %v", n, err)
	}
	if p := h.of(outbox.RelayPurged); len(p) != 1 || p[0].Count != 5 || p[0].Err != nil {
		t.Fatalf("purged: %+v", p)
	}

	enqueue(t, db.Pool, msg("x", 1), msg("y", 1))
	if _, err := db.Pool.Exec(ctx, `UPDATE outbox_event SET status = 'PUBLISHING', lease_owner = 'gone', lease_token = 7,
		locked_at = now() - interval '1 hour', attempts = CASE WHEN event_id = 'x-1' THEN 1 ELSE 2 END`); err != nil {
		t.Fatal(err)
	}
	if n, err := r.Reap(ctx); n != 2 || err != nil {
		t.Fatalf("reap = %d, %v", n, err)
	}
	if p := h.of(outbox.RelayReaped); len(p) != 1 || p[0].Count != 2 {
		t.Fatalf("reaped: %+v", p)
	}
	if p := h.of(outbox.RelayDead); len(p) != 1 || !slices.Equal(eventIDs(p[0].Events), []string{"y-1"}) {
		t.Fatalf("dead by the reaper: %+v", p)
	}

	// A lease lost mid-publish.
	slow := newRecorder()
	slow.entered = make(chan []outbox.Event, 1)
	slow.release = make(chan struct{})
	hs := &hookLog{}
	slowRelay := newRelay(t, db, slow, outbox.RelayConfig{Mode: outbox.TwoPhase, DisableNotify: true, Owner: "slow",
		BatchTimeout: time.Minute, LeaseTTL: 3 * time.Minute, Hook: hs.hook})
	done := make(chan error, 1)
	go func() { _, err := slowRelay.RunBatch(ctx); done <- err }()
	<-slow.entered
	if _, err := db.Pool.Exec(ctx, "UPDATE outbox_event SET locked_at = now() - interval '1 hour' WHERE status = 'PUBLISHING'"); err != nil {
		t.Fatal(err)
	}
	if n, err := r.Reap(ctx); n != 1 || err != nil {
		t.Fatalf("reap = %d, %v", n, err)
	}
	close(slow.release)
	if err := <-done; !errors.Is(err, outbox.ErrLeaseLost) {
		t.Fatalf("slow relay: %v", err)
	}
	if p := hs.of(outbox.RelayLeaseLost); len(p) != 1 || p[0].Count != 1 || !errors.Is(p[0].Err, outbox.ErrLeaseLost) {
		t.Fatalf("lease lost: %+v", p)
	}
}
