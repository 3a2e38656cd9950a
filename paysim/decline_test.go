package paysim_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/paysim"
)

// TestDeclineIsAStoredAnswer proves what a decline is: a definitive 402
// problem (CARD_DECLINED) that charges nothing, is recorded in the ledger
// as a decline, and is the key's answer for ever: the retry replays it.
func TestDeclineIsAStoredAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t, &paysim.Config{DeclineRate: 1})
	hc := httpClient(t, nil)
	hdr := map[string]string{"Idempotency-Key": "o-1:charge", "Authorization": "Bearer shop"}
	first, err := send(t, hc, "POST", b.url+"/charges", chargeBody("o-1", "c-1", 700), hdr)
	if err != nil {
		t.Fatal(err)
	}
	if first.status != http.StatusPaymentRequired || first.problem.Code != paysim.CodeCardDeclined ||
		first.header.Get("Content-Type") != "application/problem+json" || first.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first: %d %s %q", first.status, first.header.Get("Content-Type"), first.body)
	}
	again, err := send(t, hc, "POST", b.url+"/charges", chargeBody("o-1", "c-1", 700), hdr)
	if err != nil {
		t.Fatal(err)
	}
	if again.status != http.StatusPaymentRequired || again.body != first.body || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d replayed=%q %q, want the stored 402", again.status, again.header.Get("Idempotent-Replayed"), again.body)
	}
	if n := b.sim.Ledger().Len(); n != 0 {
		t.Fatalf("a decline charged: %d ledger rows", n)
	}
	ds := b.sim.Ledger().Declines()
	if len(ds) != 1 || ds[0].IdempotencyKey != "o-1:charge" || ds[0].OrderID != "o-1" || ds[0].CustomerID != "c-1" ||
		ds[0].AmountKopecks != 700 || ds[0].Principal != "Bearer shop" || ds[0].Code != paysim.CodeCardDeclined || ds[0].DeclineID == "" {
		t.Fatalf("declines = %+v", ds)
	}
	if st := b.sim.Stats(); st.Declined != 1 || st.Charged != 0 {
		t.Fatalf("stats %+v, want 1 decline and no charge", st)
	}

	// GET /ledger lists it beside the (empty) charges, to its principal;
	// another sees nothing of it.
	if r, err := send(t, hc, "GET", b.url+"/ledger", "", nil); err != nil || strings.TrimSpace(r.body) != `{"charges":[],"declines":[]}` {
		t.Fatalf("GET /ledger without the principal = %v, %v", r, err)
	}
	r, err := send(t, hc, "GET", b.url+"/ledger", "", map[string]string{"Authorization": "Bearer shop"})
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Charges  []map[string]any `json:"charges"`
		Declines []map[string]any `json:"declines"`
	}
	if err := json.Unmarshal([]byte(r.body), &got); err != nil || got.Charges == nil || len(got.Charges) != 0 || len(got.Declines) != 1 {
		t.Fatalf("GET /ledger = %q (%v)", r.body, err)
	}
	for _, k := range []string{"decline_id", "idempotency_key", "order_id", "customer_id", "principal", "amount_kopecks", "code", "created_at"} {
		if _, ok := got.Declines[0][k]; !ok {
			t.Errorf("decline lacks %q: %v", k, got.Declines[0])
		}
	}
	m, _ := send(t, hc, "GET", b.url+"/metrics", "", nil)
	if m == nil || !strings.Contains(m.body, "\npaysim_declines_total 1\n") {
		t.Errorf("metrics lack paysim_declines_total 1:\n%v", m)
	}
}

// TestDeclineIsDeterministicPerKey proves that whether a key is declined
// depends on the seed and the key only: two simulators with one seed
// decline the same keys (so a restarted provider, whose idempotency store
// is empty, declines a retried key again rather than charging it), every
// arrival of a key gets the same decision even between injected 500s, and
// the rate is roughly what was asked.
func TestDeclineIsDeterministicPerKey(t *testing.T) {
	t.Parallel()
	decide := func(seed uint64) map[string]bool {
		b := setup(t, &paysim.Config{DeclineRate: 0.3, FailRate: 0.5, Seed: seed})
		c, err := paysim.NewClient(b.url, fastIdem(t, httpClient(t, nil)))
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for i := range 200 {
			o := fmt.Sprintf("o-%d", i)
			for range 2 { // the second call is a retry after the answer
				_, err := c.Charge(t.Context(), paysim.ChargeCommand{IdempotencyKey: o + ":charge", OrderID: o, CustomerID: "c", AmountKopecks: 1})
				declined := errors.Is(err, paysim.ErrDeclined)
				if err != nil && !declined {
					t.Fatalf("%s: %v", o, err)
				}
				if prev, seen := out[o]; seen && prev != declined {
					t.Fatalf("%s: declined %v, then %v", o, prev, declined)
				}
				out[o] = declined
			}
		}
		if n := b.sim.Ledger().Len() + len(b.sim.Ledger().Declines()); n != 200 {
			t.Fatalf("%d ledger entries for 200 keys", n)
		}
		return out
	}
	a, again, other := decide(11), decide(11), decide(12)
	declined := 0
	for k, d := range a {
		if again[k] != d {
			t.Fatalf("seed 11: %s declined %v, then %v by a fresh simulator", k, d, again[k])
		}
		if d {
			declined++
		}
	}
	if declined < 30 || declined > 90 {
		t.Fatalf("%d of 200 declined at rate 0.3", declined)
	}
	same := true
	for k := range a {
		same = same && a[k] == other[k]
	}
	if same {
		t.Fatal("seeds 11 and 12 declined the same keys")
	}
}

// TestConcurrentDeclinesOneEntry: many clients racing on one declined key
// leave one decline and no charge, and each of them is answered with the
// decline or told to retry.
func TestConcurrentDeclinesOneEntry(t *testing.T) {
	t.Parallel()
	b := setup(t, &paysim.Config{DeclineRate: 1})
	hc := httpClient(t, &http.Transport{MaxIdleConnsPerHost: 32})
	var wg sync.WaitGroup
	statuses := make(chan int, 32)
	for range 32 {
		wg.Go(func() {
			r, err := send(t, hc, "POST", b.url+"/charges", chargeBody("o", "c", 5), map[string]string{"Idempotency-Key": "k"})
			if err != nil {
				t.Error(err)
				return
			}
			statuses <- r.status
		})
	}
	wg.Wait()
	close(statuses)
	for st := range statuses {
		if st != http.StatusPaymentRequired && st != http.StatusConflict {
			t.Errorf("status %d, want 402 or 409 (in progress)", st)
		}
	}
	if n, d := b.sim.Ledger().Len(), len(b.sim.Ledger().Declines()); n != 0 || d != 1 {
		t.Fatalf("%d charges and %d declines for one declined key, want 0 and 1", n, d)
	}
}

// TestLedgerKeyIsChargedOrDeclinedNotBoth: the ledger itself keeps the
// first answer of a key, whichever the layer in front asks for later.
func TestLedgerKeyIsChargedOrDeclinedNotBoth(t *testing.T) {
	t.Parallel()
	l := paysim.NewLedger()
	c := paysim.Charge{IdempotencyKey: "k", Principal: "p", OrderID: "o", CustomerID: "c", AmountKopecks: 1}
	if _, ok, err := l.Insert(c); !ok || err != nil {
		t.Fatalf("Insert = %v, %v", ok, err)
	}
	if _, _, err := l.Decline(paysim.Decline{IdempotencyKey: "k", Principal: "p", OrderID: "o", CustomerID: "c", AmountKopecks: 1}); !errors.Is(err, paysim.ErrKeyCharged) {
		t.Fatalf("Decline of a charged key = %v, want ErrKeyCharged", err)
	}
	d := paysim.Decline{IdempotencyKey: "k2", Principal: "p", OrderID: "o2", CustomerID: "c", AmountKopecks: 1}
	first, ok, err := l.Decline(d)
	if !ok || err != nil || first.Code != paysim.CodeCardDeclined {
		t.Fatalf("Decline = %+v, %v, %v", first, ok, err)
	}
	if again, ok, err := l.Decline(d); ok || err != nil || again.DeclineID != first.DeclineID {
		t.Fatalf("second Decline = %+v, %v, %v; want the first", again, ok, err)
	}
	if _, _, err := l.Decline(paysim.Decline{IdempotencyKey: "k2", Principal: "p", OrderID: "o2", CustomerID: "c", AmountKopecks: 2}); !errors.Is(err, paysim.ErrLedgerConflict) {
		t.Fatalf("Decline of the key for another amount = %v, want ErrLedgerConflict", err)
	}
	if _, _, err := l.Insert(paysim.Charge{IdempotencyKey: "k2", Principal: "p", OrderID: "o2", CustomerID: "c", AmountKopecks: 1}); !errors.Is(err, paysim.ErrKeyDeclined) {
		t.Fatalf("Insert of a declined key = %v, want ErrKeyDeclined", err)
	}
	if l.Len() != 1 || len(l.Declines()) != 1 {
		t.Fatalf("%d charges, %d declines", l.Len(), len(l.Declines()))
	}
}

// TestClientDeclineIsDefinitive: the typed client reports a decline as
// ErrDeclined, which is not retryable: the caller records the failure.
func TestClientDeclineIsDefinitive(t *testing.T) {
	t.Parallel()
	b := setup(t, &paysim.Config{DeclineRate: 1})
	c, err := paysim.NewClient(b.url, fastIdem(t, httpClient(t, nil)))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Charge(t.Context(), paysim.ChargeCommand{IdempotencyKey: "k", OrderID: "o", CustomerID: "c", AmountKopecks: 1})
	var se *idemclient.StatusError
	if !errors.Is(err, paysim.ErrDeclined) || idemclient.IsRetryable(err) || !errors.As(err, &se) || se.StatusCode != 402 {
		t.Fatalf("Charge = %v, want ErrDeclined, a 402, not retryable", err)
	}
	e, err := c.Entries(t.Context())
	if err != nil || e.Charges == nil || len(e.Charges) != 0 || len(e.Declines) != 1 || e.Declines[0].IdempotencyKey != "k" {
		t.Fatalf("Entries = %+v, %v", e, err)
	}
}
