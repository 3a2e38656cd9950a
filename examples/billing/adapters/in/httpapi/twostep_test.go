package httpapi_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"sync"
	"testing"

	"github.com/idemkit/idem/examples/billing/adapters/in/httpapi"
	"github.com/idemkit/idem/examples/billing/adapters/out/postgres"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/testbin"
	"github.com/idemkit/idem/internal/testdb"
)

// instance is one billing API in two-step mode over a store of its own,
// on a shared database: two instances with two stores are what a Redis
// that lost its records looks like to the second request.
func (f *fixture) instance(t *testing.T, store idempotency.Store) *fixture {
	t.Helper()
	g := &fixture{db: f.db, m: httpapi.NewMetrics(), log: &testbin.Buffer{}}
	h, _, err := httpapi.NewHandler(httpapi.Config{
		DB:      f.db.Pool,
		Store:   store,
		Tokens:  []httpapi.Token{{Secret: aliceSecret, Principal: "alice"}, {Secret: bobSecret, Principal: "bob"}},
		Ready:   http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}),
		Metrics: g.m,
		Logger:  slog.New(slog.NewTextHandler(g.log, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	g.h = h
	return g
}

func twoStepSetup(t *testing.T) *fixture {
	t.Helper()
	db := testdb.New(t)
	if err := postgres.Migrate(context.Background(), db.Pool); err != nil {
		t.Fatal(err)
	}
	return (&fixture{db: db}).instance(t, idempotency.NewMemoryStore())
}

func idOf(t *testing.T, what string, w interface{ Result() *http.Response }, body []byte) string {
	t.Helper()
	var v struct{ ID, Status string }
	if err := json.Unmarshal(body, &v); err != nil || v.ID == "" {
		t.Fatalf("%s: %s (%v)", what, body, err)
	}
	return v.ID
}

// In two-step mode (a store other than PostgreSQL's) the API behaves as in
// transactional mode for a client: a replay, a conflict, a refusal.
func TestTwoStepStoreReplaysAndRefuses(t *testing.T) {
	t.Parallel()
	f := twoStepSetup(t)
	w := f.do("POST", "/orders", "o-1", `{"customer_id":"c1","total_kopecks":1000}`)
	if w.Code != http.StatusCreated {
		t.Fatalf("create: %d %s", w.Code, w.Body)
	}
	id := idOf(t, "create", w, w.Body.Bytes())
	again := f.do("POST", "/orders", "o-1", `{"customer_id":"c1","total_kopecks":1000}`)
	if again.Code != http.StatusCreated || again.Header().Get("Idempotent-Replayed") != "true" || again.Body.String() != w.Body.String() {
		t.Errorf("replay: %d %q %s", again.Code, again.Header().Get("Idempotent-Replayed"), again.Body)
	}
	problem(t, "another body", f.do("POST", "/orders", "o-1", `{"customer_id":"c1","total_kopecks":2000}`), http.StatusConflict, "IDEMPOTENCY_KEY_REUSED")
	problem(t, "payment above the total", f.do("POST", "/payments", "p-1", `{"order_id":"`+id+`","customer_id":"c1","amount_kopecks":5000}`), http.StatusConflict, httpapi.CodeExceedsOutstanding)
	// The refusal rolled its operation mark back: the corrected request
	// under another key runs.
	if n := f.count(t, `SELECT count(*) FROM processed_event WHERE consumer_id = $1`, httpapi.HTTPOperationsConsumer); n != 1 {
		t.Errorf("%d operation marks, want 1 (the order; the refused payment's rolled back)", n)
	}
	if n := f.count(t, `SELECT count(*) FROM orders`); n != 1 {
		t.Errorf("%d orders, want 1", n)
	}
}

// The store forgot a completed key (a Redis restarted without persistence,
// or the completion lost to a crash): the retry runs the handler again, on
// another instance whose store has no record. It must make nothing twice:
// the same order, the same payment, one ChargeRequested, one
// OrderConfirmed.
func TestTwoStepRerunAfterALostRecordMakesNothingTwice(t *testing.T) {
	t.Parallel()
	a := twoStepSetup(t)
	forget := func() *fixture { return a.instance(t, idempotency.NewMemoryStore()) }

	w := a.do("POST", "/orders", "o-1", `{"customer_id":"c1","total_kopecks":1000}`)
	orderID := idOf(t, "create", w, w.Body.Bytes())
	b := forget()
	w2 := b.do("POST", "/orders", "o-1", `{"customer_id":"c1","total_kopecks":1000}`)
	if w2.Code != http.StatusCreated || w2.Header().Get("Idempotent-Replayed") == "true" || idOf(t, "re-run", w2, w2.Body.Bytes()) != orderID {
		t.Fatalf("re-run of the create: %d %s; want 201 with order %s, not a replay", w2.Code, w2.Body, orderID)
	}
	if n := a.count(t, `SELECT count(*) FROM orders`); n != 1 {
		t.Fatalf("%d orders after the re-run, want 1", n)
	}

	pay := `{"order_id":"` + orderID + `","customer_id":"c1","amount_kopecks":400}`
	w = a.do("POST", "/payments", "p-1", pay)
	if w.Code != http.StatusCreated {
		t.Fatalf("payment: %d %s", w.Code, w.Body)
	}
	payID := idOf(t, "payment", w, w.Body.Bytes())
	w2 = forget().do("POST", "/payments", "p-1", pay)
	if w2.Code != http.StatusCreated || idOf(t, "re-run", w2, w2.Body.Bytes()) != payID {
		t.Fatalf("re-run of the payment: %d %s; want 201 with payment %s", w2.Code, w2.Body, payID)
	}
	if n := a.count(t, `SELECT count(*) FROM payments`); n != 1 {
		t.Errorf("%d payments after the re-run, want 1", n)
	}
	if n := a.count(t, `SELECT count(*) FROM outbox_event WHERE event_type = 'ChargeRequested'`); n != 1 {
		t.Errorf("%d ChargeRequested events, want 1", n)
	}

	o2 := a.order(t, "o-2", 700)
	if w := a.do("POST", "/orders/"+o2+"/confirm", "c-1", ""); w.Code != http.StatusOK {
		t.Fatalf("confirm: %d %s", w.Code, w.Body)
	}
	w2 = forget().do("POST", "/orders/"+o2+"/confirm", "c-1", "")
	if w2.Code != http.StatusOK || idOf(t, "re-run", w2, w2.Body.Bytes()) != o2 {
		t.Fatalf("re-run of the confirm: %d %s; want 200 with order %s", w2.Code, w2.Body, o2)
	}
	if n := a.count(t, `SELECT count(*) FROM outbox_event WHERE event_type = 'OrderConfirmed'`); n != 1 {
		t.Errorf("%d OrderConfirmed events, want 1", n)
	}
	// A confirm of the same order under another key is another operation:
	// refused, as in transactional mode.
	problem(t, "second confirm, new key", a.do("POST", "/orders/"+o2+"/confirm", "c-2", ""), http.StatusConflict, httpapi.CodeOrderState)

	// The confirm's key sent to another order's confirm, on an instance
	// that has no record of it: another operation, which confirms that
	// order; never the first confirm's mark answering for it.
	o3 := a.order(t, "o-3", 300)
	w3 := forget().do("POST", "/orders/"+o3+"/confirm", "c-1", "")
	var got struct{ ID, Status string }
	if err := json.Unmarshal(w3.Body.Bytes(), &got); err != nil || w3.Code != http.StatusOK || got.ID != o3 || got.Status != "CONFIRMED" {
		t.Errorf("confirm of another order with a used key: %d %s; want 200 with %s CONFIRMED", w3.Code, w3.Body, o3)
	}
	if n := a.count(t, `SELECT count(*) FROM outbox_event WHERE event_type = 'OrderConfirmed'`); n != 2 {
		t.Errorf("%d OrderConfirmed events, want 2", n)
	}
}

// Many re-runs at once, each on an instance that forgot the key: one
// payment.
func TestTwoStepConcurrentRerunsMakeOnePayment(t *testing.T) {
	t.Parallel()
	a := twoStepSetup(t)
	orderID := a.order(t, "o-1", 1000)
	pay := `{"order_id":"` + orderID + `","customer_id":"c1","amount_kopecks":1000}`
	const n = 16
	codes := make([]int, n)
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		inst := a.instance(t, idempotency.NewMemoryStore())
		wg.Go(func() {
			w := inst.do("POST", "/payments", "p-1", pay)
			codes[i] = w.Code
			var v struct{ ID string }
			_ = json.Unmarshal(w.Body.Bytes(), &v)
			ids[i] = v.ID
		})
	}
	wg.Wait()
	for i := range n {
		if codes[i] != http.StatusCreated || ids[i] != ids[0] {
			t.Errorf("run %d: %d %s; want 201 with the one payment %s", i, codes[i], ids[i], ids[0])
		}
	}
	if c := a.count(t, `SELECT count(*) FROM payments`); c != 1 {
		t.Errorf("%d payments, want 1", c)
	}
}
