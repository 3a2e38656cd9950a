package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// poisonSetup enqueues p-1..p-3 and q-1 and runs a relay whose publisher
// refuses p-1 until cure is called, until p-1 is DEAD.
type poisonSetup struct {
	db    *testdb.DB
	rec   *recorder
	relay *outbox.Relay
	admin *outbox.Admin
	cure  func()
}

func setupPoison(t *testing.T, mode outbox.Mode) *poisonSetup {
	t.Helper()
	db := testdb.New(t)
	rec := newRecorder()
	var mu sync.Mutex
	poisoned := true
	rec.fail = func(e outbox.Event) error {
		mu.Lock()
		defer mu.Unlock()
		if e.EventID == "p-1" && poisoned {
			return fmt.Errorf("cannot encode %s", e.EventID)
		}
		return nil
	}
	r := newRelay(t, db, rec, outbox.RelayConfig{Mode: mode, DisableNotify: true, MaxAttempts: 2,
		BackoffMin: time.Millisecond, BackoffMax: time.Millisecond})
	m := msg("p", 1)
	m.Payload = []byte(`{"order":"p","n":1}`)
	m.Headers = map[string]string{"trace": "abc"}
	enqueue(t, db.Pool, m, msg("p", 2), msg("p", 3), msg("q", 1))
	eventually(t, "p-1 DEAD", func() bool {
		_, _ = r.RunBatch(context.Background())
		return statuses(t, db)["p-1"] == outbox.StatusDead
	})
	drain(t, r)
	return &poisonSetup{db: db, rec: rec, relay: r, admin: outbox.NewAdmin(db.Pool), cure: func() {
		mu.Lock()
		poisoned = false
		mu.Unlock()
	}}
}

func (s *poisonSetup) delivered(agg string) []string {
	var out []string
	for _, e := range s.rec.snapshot() {
		if e.AggregateID == agg {
			out = append(out, e.EventID)
		}
	}
	return out
}

func TestAdminListShow(t *testing.T) {
	t.Parallel()
	s := setupPoison(t, outbox.TwoPhase)
	ctx := context.Background()
	dead, err := s.admin.List(ctx, outbox.ListFilter{Status: outbox.StatusDead})
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != 1 || dead[0].EventID != "p-1" || dead[0].Attempts != 2 || !strings.Contains(dead[0].LastError, "cannot encode p-1") {
		t.Fatalf("dead: %+v", dead)
	}
	testCases := []struct {
		name string
		f    outbox.ListFilter
		want []string
	}{
		{"all", outbox.ListFilter{}, []string{"p-1", "p-2", "p-3", "q-1"}},
		{"pending", outbox.ListFilter{Status: outbox.StatusPending}, []string{"p-2", "p-3"}},
		{"aggregate", outbox.ListFilter{AggregateType: "order", AggregateID: "q"}, []string{"q-1"}},
		{"topic none", outbox.ListFilter{Topic: "other"}, nil},
		{"limit", outbox.ListFilter{Limit: 2}, []string{"p-1", "p-2"}},
	}
	for _, tt := range testCases {
		got, err := s.admin.List(ctx, tt.f)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		var ids []string
		for _, e := range got {
			ids = append(ids, e.EventID)
		}
		if !slices.Equal(ids, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, ids, tt.want)
		}
	}
	page, err := s.admin.List(ctx, outbox.ListFilter{AfterID: dead[0].ID, Limit: 1})
	if err != nil || len(page) != 1 || page[0].EventID != "p-2" {
		t.Errorf("page after p-1: %+v, %v", page, err)
	}
	for _, f := range []outbox.ListFilter{{Status: "GONE"}, {Limit: -1}, {Limit: outbox.ListLimitMax + 1}} {
		if _, err := s.admin.List(ctx, f); !errors.Is(err, outbox.ErrInvalidFilter) {
			t.Errorf("%+v: %v, want ErrInvalidFilter", f, err)
		}
	}

	e, err := s.admin.Show(ctx, "p-1")
	if err != nil {
		t.Fatal(err)
	}
	if e.Status != outbox.StatusDead || e.Headers["trace"] != "abc" || !e.PayloadIsJSON() {
		t.Errorf("show: %+v", e)
	}
	b, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	if p, ok := raw["payload"].(map[string]any); !ok || p["order"] != "p" {
		t.Errorf("JSON payload not shown as JSON: %s", b)
	}
	e2, err := s.admin.Show(ctx, "p-2")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = json.Marshal(e2)
	if !strings.Contains(string(b), `"payload_base64":"cC8y"`) { // "p/2" is not JSON
		t.Errorf("non-JSON payload: %s", b)
	}
	if _, err := s.admin.Show(ctx, "nope"); !errors.Is(err, outbox.ErrEventNotFound) {
		t.Errorf("unknown id: %v", err)
	}
}

// Requeue puts the DEAD head back; the relay publishes it and the events
// it held back, in order; the trail records who and why.
func TestAdminRequeuePublishes(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			s := setupPoison(t, mode)
			ctx := context.Background()
			if got := s.delivered("p"); len(got) != 0 {
				t.Fatalf("p delivered while dead: %v", got)
			}
			s.cure()
			if err := s.admin.Requeue(ctx, "p-1", outbox.Action{Actor: "alice", Reason: "topic created"}); err != nil {
				t.Fatal(err)
			}
			e, err := s.admin.Show(ctx, "p-1")
			if err != nil {
				t.Fatal(err)
			}
			if e.Status != outbox.StatusPending || e.Attempts != 0 || len(e.Audit) != 1 ||
				e.Audit[0].Action != "requeue" || e.Audit[0].Actor != "alice" || e.Audit[0].Reason != "topic created" ||
				e.Audit[0].From != outbox.StatusDead || e.Audit[0].At.IsZero() {
				t.Fatalf("after requeue: %+v", e)
			}
			drain(t, s.relay)
			if got := s.delivered("p"); !slices.Equal(got, []string{"p-1", "p-2", "p-3"}) {
				t.Fatalf("delivered %v", got)
			}
			var se *outbox.StateError
			err = s.admin.Requeue(ctx, "p-1", outbox.Action{Actor: "alice"})
			if !errors.As(err, &se) || !errors.Is(err, outbox.ErrWrongState) || se.Status != outbox.StatusPublished {
				t.Errorf("requeue of a PUBLISHED event: %v", err)
			}
			if err := s.admin.Requeue(ctx, "nope", outbox.Action{}); !errors.Is(err, outbox.ErrEventNotFound) {
				t.Errorf("requeue of an unknown event: %v", err)
			}
		})
	}
}

// Two operators requeue one event at once: exactly one succeeds, one
// audit entry is written, and the event is published once.
func TestAdminConcurrentRequeue(t *testing.T) {
	t.Parallel()
	s := setupPoison(t, outbox.TwoPhase)
	s.cure()
	ctx := context.Background()
	const n = 8
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = s.admin.Requeue(ctx, "p-1", outbox.Action{Actor: fmt.Sprintf("op%d", i)})
		}()
	}
	close(start)
	wg.Wait()
	ok := 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, outbox.ErrWrongState):
		default:
			t.Errorf("unexpected error: %v", err)
		}
	}
	if ok != 1 {
		t.Fatalf("%d requeues succeeded, want 1: %v", ok, errs)
	}
	e, err := s.admin.Show(ctx, "p-1")
	if err != nil || len(e.Audit) != 1 {
		t.Fatalf("audit after concurrent requeues: %+v, %v", e, err)
	}
	drain(t, s.relay)
	if got := s.delivered("p"); !slices.Equal(got, []string{"p-1", "p-2", "p-3"}) {
		t.Fatalf("delivered %v", got)
	}
}

// Discard is terminal: the event is never published, the ones it held
// back are, a second discard and a requeue of it are refused, and the
// row stays with its trail.
func TestAdminDiscardUnblocksAggregate(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			s := setupPoison(t, mode)
			ctx := context.Background()
			if err := s.admin.Discard(ctx, "p-1", outbox.Action{Actor: "bob"}); !errors.Is(err, outbox.ErrReasonRequired) {
				t.Fatalf("discard without a reason: %v", err)
			}
			if err := s.admin.Discard(ctx, "p-2", outbox.Action{Actor: "bob", Reason: "x"}); !errors.Is(err, outbox.ErrWrongState) {
				t.Fatalf("discard of a PENDING event: %v", err)
			}
			if err := s.admin.Discard(ctx, "p-1", outbox.Action{Actor: "bob", Reason: "order was cancelled by hand"}); err != nil {
				t.Fatal(err)
			}
			drain(t, s.relay)
			if got := s.delivered("p"); !slices.Equal(got, []string{"p-2", "p-3"}) {
				t.Fatalf("delivered %v, want p-2 p-3 (p-1 discarded)", got)
			}
			var se *outbox.StateError
			if err := s.admin.Discard(ctx, "p-1", outbox.Action{Actor: "bob", Reason: "again"}); !errors.As(err, &se) || se.Status != outbox.StatusDiscarded {
				t.Errorf("second discard: %v", err)
			}
			if err := s.admin.Requeue(ctx, "p-1", outbox.Action{Actor: "bob"}); !errors.Is(err, outbox.ErrWrongState) {
				t.Errorf("requeue of a DISCARDED event: %v", err)
			}
			if n, err := outbox.Requeue(ctx, s.db.Pool, "p-1"); err != nil || n != 0 {
				t.Errorf("outbox.Requeue of a DISCARDED event: %d, %v", n, err)
			}
			e, err := s.admin.Show(ctx, "p-1")
			if err != nil || e.Status != outbox.StatusDiscarded || e.PublishedAt != nil || len(e.Audit) != 1 ||
				e.Audit[0].Reason != "order was cancelled by hand" || string(e.Payload) != `{"order":"p","n":1}` {
				t.Fatalf("discarded row: %+v, %v", e, err)
			}
			st, err := outbox.GetStatus(ctx, s.db.Pool, time.Minute, 10)
			if err != nil || st.Discarded != 1 || st.Dead != 0 {
				t.Errorf("status: %+v, %v", st, err)
			}
		})
	}
}

// RequeueDead requeues only the DEAD events of the filter.
func TestAdminRequeueDead(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	enqueue(t, db.Pool, msg("a", 1), msg("b", 1), msg("c", 1))
	if _, err := db.Pool.Exec(ctx, `UPDATE outbox_event SET status = 'DEAD', attempts = 5 WHERE event_id IN ('a-1', 'b-1')`); err != nil {
		t.Fatal(err)
	}
	admin := outbox.NewAdmin(db.Pool)
	ids, err := admin.RequeueDead(ctx, outbox.ListFilter{AggregateType: "order", AggregateID: "a"}, outbox.Action{Actor: "x"})
	if err != nil || !slices.Equal(ids, []string{"a-1"}) {
		t.Fatalf("aggregate a: %v, %v", ids, err)
	}
	ids, err = admin.RequeueDead(ctx, outbox.ListFilter{}, outbox.Action{Actor: "x"})
	if err != nil || !slices.Equal(ids, []string{"b-1"}) {
		t.Fatalf("all: %v, %v", ids, err)
	}
	if _, err := admin.RequeueDead(ctx, outbox.ListFilter{Status: outbox.StatusPending}, outbox.Action{}); !errors.Is(err, outbox.ErrInvalidFilter) {
		t.Errorf("status PENDING: %v", err)
	}
	if st := statuses(t, db); st["a-1"] != "PENDING" || st["b-1"] != "PENDING" || st["c-1"] != "PENDING" {
		t.Errorf("statuses %v", st)
	}
}

// Audit text is stored whatever bytes it is given.
func TestAdminAuditTextIsStorable(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	enqueue(t, db.Pool, msg("a", 1))
	if _, err := db.Pool.Exec(ctx, `UPDATE outbox_event SET status = 'DEAD'`); err != nil {
		t.Fatal(err)
	}
	admin := outbox.NewAdmin(db.Pool)
	reason := "bad \x00 \xff " + strings.Repeat("é", 2000)
	if err := admin.Discard(ctx, "a-1", outbox.Action{Actor: "\xfe", Reason: reason}); err != nil {
		t.Fatal(err)
	}
	e, err := admin.Show(ctx, "a-1")
	if err != nil || len(e.Audit) != 1 || len(e.Audit[0].Reason) > 1024 || !strings.HasPrefix(e.Audit[0].Reason, "bad \uFFFD \uFFFD é") {
		t.Fatalf("%+v, %v", e, err)
	}
}
