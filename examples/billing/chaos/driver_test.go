package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// standin is an in-memory server of billing's HTTP contract, shared by
// several listeners (the "instances"), for testing the driver alone. It
// honours Idempotency-Key (replay, 409 in progress) and, to force retries,
// loses some answers after doing the work (503), the way a crash after the
// commit does.
type standin struct {
	loseRate      float64
	noFingerprint bool
	// fingerprintOnly, when set, fingerprints these members only.
	fingerprintOnly []string

	mu       sync.Mutex
	rng      *rand.Rand
	keys     map[string]*standinEntry
	orders   map[string]map[string]any
	payments map[string]map[string]any
	n        int
}

type standinEntry struct {
	req    string
	done   bool
	status int
	body   []byte
}

func newStandin(loseRate float64) *standin {
	return &standin{loseRate: loseRate, rng: rand.New(rand.NewPCG(1, 2)), keys: map[string]*standinEntry{},
		orders: map[string]map[string]any{}, payments: map[string]map[string]any{}}
}

func (s *standin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+TokenDefault {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	if r.Method == http.MethodGet {
		s.mu.Lock()
		defer s.mu.Unlock()
		id := r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:]
		m := s.orders[id]
		if strings.HasPrefix(r.URL.Path, "/payments/") {
			m = s.payments[id]
		}
		if m == nil {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		_ = json.NewEncoder(w).Encode(m)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	if e, ok := s.keys[key]; ok {
		if s.fingerprint(e.req) != s.fingerprint(string(body)) && !s.noFingerprint {
			s.mu.Unlock()
			w.WriteHeader(http.StatusConflict)
			io.WriteString(w, `{"code":"IDEMPOTENCY_KEY_REUSED"}`)
			return
		}
		done, status, body := e.done, e.status, e.body
		s.mu.Unlock()
		if !done {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusConflict)
			io.WriteString(w, `{"code":"IDEMPOTENCY_KEY_IN_PROGRESS"}`)
			return
		}
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(status)
		w.Write(body)
		return
	}
	e := &standinEntry{req: string(body)}
	s.keys[key] = e
	s.mu.Unlock()
	// Hold the key a moment: concurrent duplicates see it in progress.
	time.Sleep(2 * time.Millisecond)
	s.mu.Lock()
	var in map[string]any
	_ = json.Unmarshal(body, &in)
	s.n++
	switch {
	case r.URL.Path == "/orders":
		id := fmt.Sprintf("ord_%d", s.n)
		s.orders[id] = map[string]any{"id": id, "status": "NEW", "customer_id": in["customer_id"], "total_kopecks": in["total_kopecks"]}
		e.status = http.StatusCreated
		e.body, _ = json.Marshal(s.orders[id])
	case strings.HasSuffix(r.URL.Path, "/confirm"):
		id := strings.Split(r.URL.Path, "/")[2]
		o := s.orders[id]
		if o == nil || o["status"] != "NEW" {
			e.status, e.body = http.StatusConflict, []byte(`{"code":"ORDER_STATE"}`)
			break
		}
		o["status"] = "CHARGED" // charged at once: the stand-in has no worker
		e.status = http.StatusOK
		e.body, _ = json.Marshal(map[string]any{"id": id, "status": "CONFIRMED"})
	case r.URL.Path == "/payments":
		id := fmt.Sprintf("pay_%d", s.n)
		s.payments[id] = map[string]any{"id": id, "status": "CHARGED", "order_id": in["order_id"], "customer_id": in["customer_id"], "amount_kopecks": in["amount_kopecks"]}
		e.status = http.StatusCreated
		e.body, _ = json.Marshal(map[string]any{"id": id, "status": "PENDING"})
	}
	e.done = true
	lose := s.rng.Float64() < s.loseRate
	status, out := e.status, e.body
	s.mu.Unlock()
	if lose {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(status)
	w.Write(out)
}

// fingerprint is the part of a body that must match for a replay.
func (s *standin) fingerprint(body string) string {
	if s.fingerprintOnly == nil {
		return body
	}
	var m map[string]any
	_ = json.Unmarshal([]byte(body), &m)
	var out []string
	for _, f := range s.fingerprintOnly {
		out = append(out, fmt.Sprint(m[f]))
	}
	return strings.Join(out, "|")
}

// ledger is what a provider honouring the stand-in's charges holds: one
// charge per charged order and payment.
func (s *standin) ledger() ledger {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out ledger
	for id, o := range s.orders {
		if o["status"] == "CHARGED" {
			out.Charges = append(out.Charges, charge{OrderID: id, CustomerID: o["customer_id"].(string), Principal: providerPrincipal,
				AmountKopecks: int64(o["total_kopecks"].(float64)), IdempotencyKey: id})
		}
	}
	for id, p := range s.payments {
		out.Charges = append(out.Charges, charge{OrderID: p["order_id"].(string), CustomerID: p["customer_id"].(string), Principal: providerPrincipal,
			AmountKopecks: int64(p["amount_kopecks"].(float64)), IdempotencyKey: id})
	}
	return out
}

// runStandin drives the stand-in through three listeners and audits.
func runStandin(t *testing.T, unsafe string, fingerprintOnly ...string) (*driver, *standin, auditResult, []Violation) {
	t.Helper()
	s := newStandin(0.1)
	s.noFingerprint = unsafe == UnsafeFingerprint
	s.fingerprintOnly = fingerprintOnly
	var procs []*proc
	for i := range 3 {
		srv := httptest.NewServer(s)
		t.Cleanup(srv.Close)
		procs = append(procs, &proc{name: fmt.Sprint("standin-", i), addr: strings.TrimPrefix(srv.URL, "http://"), up: true})
	}
	cfg := (&Config{IdemBin: "x", BillingBin: "x", DatabaseURL: "x", Orders: 40, Payments: 20,
		Seed: 7, DuplicateRate: 0.3, ClientDropRate: 0.2, Unsafe: unsafe, LoadDuration: -1}).withDefaults()
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var vs []Violation
	d := newDriver(&cfg, "run1", procs, func(v Violation) {
		mu.Lock()
		vs = append(vs, v)
		mu.Unlock()
	})
	defer d.close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	d.run(ctx)
	statuses := map[string]string{}
	rng := rand.New(rand.NewPCG(1, 1))
	for _, e := range d.expected(nil) {
		path := "/orders/" + e.orderID
		if strings.HasPrefix(e.what, "payment ") {
			path = "/payments/" + strings.TrimPrefix(e.what, "payment ")
		}
		var res struct {
			Status string `json:"status"`
		}
		if err := d.get(ctx, rng, path, &res); err != nil {
			t.Fatal(err)
		}
		statuses[path] = res.Status
	}
	return d, s, check(d.expected(statuses), s.ledger()), vs
}

func TestDriverSafeKeysMakeEveryRetryHarmless(t *testing.T) {
	t.Parallel()
	d, s, res, vs := runStandin(t, "")
	if len(vs) > 0 || len(res.violations) > 0 {
		t.Fatalf("violations: driver %+v, audit %+v", vs, res.violations)
	}
	// Retries, drops and duplicates happened, and the key made each one a
	// replay: one order per order task, one payment per payment task.
	if d.retries.Load() == 0 || d.clientDrops.Load() == 0 || d.duplicates.Load() == 0 || d.replays.Load() == 0 || d.inProgress.Load() == 0 {
		t.Fatalf("no chaos on the client side: retries %d drops %d dups %d replays %d in-progress %d",
			d.retries.Load(), d.clientDrops.Load(), d.duplicates.Load(), d.replays.Load(), d.inProgress.Load())
	}
	if len(s.orders) != 60 || len(s.payments) != 20 {
		t.Fatalf("stand-in holds %d orders and %d payments, want 60 and 20", len(s.orders), len(s.payments))
	}
	if res.orders != 40 || res.payments != 20 || res.charged != 60 {
		t.Fatalf("audit counts %+v", res)
	}
	if d.reuseProbes.Load() == 0 || d.reuseRejected.Load() != d.reuseProbes.Load() {
		t.Fatalf("fingerprint probes %d, refused %d", d.reuseProbes.Load(), d.reuseRejected.Load())
	}
	if d.ops.Load() != 2*(40+20) {
		t.Fatalf("ops %d, want 120", d.ops.Load())
	}
}

func TestDriverUnsafeKeyIsCaught(t *testing.T) {
	t.Parallel()
	d, s, res, _ := runStandin(t, UnsafeKey)
	if d.freshKeys.Load() == 0 {
		t.Fatal("unsafe=key minted no fresh key")
	}
	if len(s.payments) <= 20 {
		t.Fatalf("fresh keys made no duplicate payment: %d payments", len(s.payments))
	}
	found := false
	for _, v := range res.violations {
		if v.Kind == "double-charge" {
			found = true
		}
	}
	if !found {
		t.Fatalf("audit found no double charge: %+v", res.violations)
	}
}

// A replay that differs from the first answer is a violation: its status,
// a replayed header, or a byte of its body, which the detail points at.
func TestDriverReplayMustBeIdentical(t *testing.T) {
	t.Parallel()
	var vs []Violation
	d := newDriver(&Config{}, "r", nil, func(v Violation) { vs = append(vs, v) })
	json := http.Header{"Content-Type": {"application/json"}, "Location": {"/orders/a"}, "Date": {"now"}}
	d.record("/orders", "k1", 201, json, []byte(`{"id":"a","status":"NEW"}`))
	// Headers off the allow-list (Date, Idempotent-Replayed) may differ.
	d.record("/orders", "k1", 201, http.Header{"Content-Type": {"application/json"}, "Location": {"/orders/a"}, "Idempotent-Replayed": {"true"}},
		[]byte(`{"id":"a","status":"NEW"}`))
	if len(vs) != 0 {
		t.Fatalf("identical replay flagged: %+v", vs)
	}
	testCases := []struct {
		hdr        http.Header
		st         int
		body, want string
	}{
		{json, 201, `{"id":"a","status":"NOW"}`, `bodies differ at byte 21 (of 25 and 25)`},
		{json, 409, `{"id":"a","status":"NEW"}`, `status 201 first, 409 later`},
		{http.Header{"Location": {"/orders/a"}}, 201, `{"id":"a","status":"NEW"}`, `header Content-Type "application/json" first, "" later`},
		{http.Header{"Content-Type": {"application/json"}}, 201, `{"id":"a","status":"NEW"}`, `header Location "/orders/a" first, "" later`},
		{json, 201, `{"id":"a","status":"NEW"} `, `bodies differ at byte 25 (of 25 and 26)`},
	}
	for i, tt := range testCases {
		d.record("/orders", "k1", tt.st, tt.hdr, []byte(tt.body))
		if len(vs) != i+1 || vs[i].Kind != "replay-differs" || !strings.Contains(vs[i].Detail, tt.want) {
			t.Fatalf("case %d: violations %+v, want replay-differs with %q", i, vs, tt.want)
		}
	}
}

// A server that ignores the request fingerprint replays the first answer
// to a key reused with another body: the driver's probe reports it.
func TestDriverUnsafeFingerprintIsCaught(t *testing.T) {
	t.Parallel()
	_, _, _, vs := runStandin(t, UnsafeFingerprint)
	found := false
	for _, v := range vs {
		if v.Kind == "key-reuse-accepted" {
			found = true
		}
	}
	if !found {
		t.Fatalf("no key-reuse-accepted among %+v", vs)
	}
}

// A fingerprint that covers the amounts only (a mutant of the proof):
// the probes that change another member get the first answer replayed.
func TestDriverAmountOnlyFingerprintIsCaught(t *testing.T) {
	t.Parallel()
	_, _, _, vs := runStandin(t, "", "amount_kopecks", "total_kopecks")
	fields := map[string]bool{}
	for _, v := range vs {
		if v.Kind != "key-reuse-accepted" {
			t.Errorf("unexpected violation %+v", v)
		}
		for _, f := range []string{"customer_id", "order_id", "amount_kopecks", "total_kopecks"} {
			if strings.Contains(v.Detail, "another "+f+" ") {
				fields[f] = true
			}
		}
	}
	if !fields["customer_id"] || !fields["order_id"] || fields["amount_kopecks"] || fields["total_kopecks"] {
		t.Fatalf("reuse accepted for %v, want customer_id and order_id only: %+v", fields, vs)
	}
}
