package paysim_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/paysim"
)

func TestChargeAndReplay(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	hc := httpClient(t, nil)
	body := chargeBody("o-1", "c-1", 1500)
	first, err := send(t, hc, "POST", b.url+"/charges", body, map[string]string{"Idempotency-Key": "o-1:charge:r-1"})
	if err != nil {
		t.Fatal(err)
	}
	if first.status != 201 || first.chargeID == "" || first.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first: %d %q replayed=%q", first.status, first.body, first.header.Get("Idempotent-Replayed"))
	}
	// Same key, same body (reformatted JSON is the same request).
	again, err := send(t, hc, "POST", b.url+"/charges", `{ "amount_kopecks": 1500, "customer_id": "c-1", "order_id": "o-1" }`,
		map[string]string{"Idempotency-Key": "o-1:charge:r-1"})
	if err != nil {
		t.Fatal(err)
	}
	if again.status != 201 || again.chargeID != first.chargeID || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d %q replayed=%q, want 201 with charge %s replayed", again.status, again.body, again.header.Get("Idempotent-Replayed"), first.chargeID)
	}
	// Same key, different body: the middleware's mismatch.
	other, err := send(t, hc, "POST", b.url+"/charges", chargeBody("o-1", "c-1", 9999), map[string]string{"Idempotency-Key": "o-1:charge:r-1"})
	if err != nil {
		t.Fatal(err)
	}
	if other.status != 409 || other.problem.Code != "IDEMPOTENCY_KEY_REUSED" {
		t.Fatalf("reused key: %d %q", other.status, other.body)
	}
	rows := b.sim.Ledger().Charges()
	if len(rows) != 1 || rows[0].ChargeID != first.chargeID || rows[0].AmountKopecks != 1500 || rows[0].IdempotencyKey != "o-1:charge:r-1" {
		t.Fatalf("ledger = %+v", rows)
	}
	m, err := send(t, hc, "GET", b.url+"/metrics", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"\npaysim_charges_total 1\n",
		"\npaysim_replays_total 1\n",
		`paysim_conflicts_total{code="IDEMPOTENCY_KEY_REUSED"} 1` + "\n",
		`paysim_conflicts_total{code="IDEMPOTENCY_KEY_IN_PROGRESS"} 0` + "\n",
		`paysim_faults_total{kind="drop"} 0` + "\n",
		"\npaysim_ledger_rows 1\n",
	} {
		if !strings.Contains(m.body, want) {
			t.Errorf("GET /metrics lacks %q:\n%s", want, m.body)
		}
	}
}

// TestPrincipalsHaveSeparateKeys: keys are scoped by principal in the
// middleware and in the ledger, so two merchants using one key are charged
// independently, and each replays only its own charge.
func TestPrincipalsHaveSeparateKeys(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	hc := httpClient(t, nil)
	body := chargeBody("o-1", "c-1", 100)
	alice, _ := send(t, hc, "POST", b.url+"/charges", body, map[string]string{"Idempotency-Key": "k", "Authorization": "Bearer alice"})
	bob, _ := send(t, hc, "POST", b.url+"/charges", body, map[string]string{"Idempotency-Key": "k", "Authorization": "Bearer bob"})
	if alice == nil || bob == nil || alice.status != 201 || bob.status != 201 || bob.chargeID == alice.chargeID {
		t.Fatalf("alice %+v, bob %+v: want two charges", alice, bob)
	}
	again, _ := send(t, hc, "POST", b.url+"/charges", body, map[string]string{"Idempotency-Key": "k", "Authorization": "Bearer alice"})
	if again == nil || again.chargeID != alice.chargeID || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("alice's retry = %+v, want a replay of %s", again, alice.chargeID)
	}
	rows := b.sim.Ledger().Charges()
	if len(rows) != 2 || rows[0].Principal == rows[1].Principal {
		t.Fatalf("ledger = %+v, want one row per principal", rows)
	}
	if audit := paysim.Audit(rows); len(audit.DuplicateKeys) != 0 {
		t.Fatalf("audit flags keys of different principals: %s", audit)
	}
}

func TestBadInputIsProblem4xxWithoutCharge(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	hc := httpClient(t, nil)
	key := map[string]string{"Idempotency-Key": "k-1"}
	testCases := []struct {
		name, method, path, body string
		header                   map[string]string
		wantStatus               int
		wantCode                 string
	}{
		{"malformed JSON", "POST", "/charges", `{"order_id":`, key, 400, "MALFORMED_JSON"},
		{"not an object", "POST", "/charges", `[1,2]`, key, 400, "MALFORMED_JSON"},
		{"empty body", "POST", "/charges", ``, key, 400, "MALFORMED_JSON"},
		{"unknown member (amount instead of amount_kopecks)", "POST", "/charges", `{"order_id":"o","customer_id":"c","amount":100}`, key, 400, "MALFORMED_JSON"},
		{"trailing data", "POST", "/charges", `{"order_id":"o","customer_id":"c","amount_kopecks":1} {}`, key, 400, "MALFORMED_JSON"},
		{"amount as string", "POST", "/charges", `{"order_id":"o","customer_id":"c","amount_kopecks":"100"}`, key, 400, "MALFORMED_JSON"},
		{"fractional amount", "POST", "/charges", `{"order_id":"o","customer_id":"c","amount_kopecks":1.5}`, key, 400, "MALFORMED_JSON"},
		{"missing order", "POST", "/charges", `{"customer_id":"c","amount_kopecks":100}`, key, 422, "INVALID_CHARGE"},
		{"blank customer", "POST", "/charges", `{"order_id":"o","customer_id":"  ","amount_kopecks":100}`, key, 422, "INVALID_CHARGE"},
		{"null", "POST", "/charges", `null`, key, 422, "INVALID_CHARGE"},
		{"zero amount", "POST", "/charges", chargeBody("o", "c", 0), key, 422, "INVALID_CHARGE"},
		{"negative amount", "POST", "/charges", chargeBody("o", "c", -100), key, 422, "INVALID_CHARGE"},
		{"missing key", "POST", "/charges", chargeBody("o", "c", 100), nil, 400, "IDEMPOTENCY_KEY_REQUIRED"},
		{"key with a space", "POST", "/charges", chargeBody("o", "c", 100), map[string]string{"Idempotency-Key": "a b"}, 400, "IDEMPOTENCY_KEY_INVALID"},
		{"key too long", "POST", "/charges", chargeBody("o", "c", 100), map[string]string{"Idempotency-Key": strings.Repeat("k", 256)}, 400, "IDEMPOTENCY_KEY_INVALID"},
		{"body too large", "POST", "/charges", `{"order_id":"` + strings.Repeat("o", 2<<20) + `"}`, key, 413, "REQUEST_BODY_TOO_LARGE"},
		{"GET /charges", "GET", "/charges", ``, nil, 405, "METHOD_NOT_ALLOWED"},
		{"POST /ledger", "POST", "/ledger", `{}`, key, 405, "METHOD_NOT_ALLOWED"},
		{"unknown path", "GET", "/refunds", ``, nil, 404, "NOT_FOUND"},
	}
	for i, tt := range testCases {
		t.Run(tt.name, func(t *testing.T) {
			// Not parallel: one key per case keeps the middleware's stored
			// 4xx of one case from answering another.
			h := map[string]string{}
			for k, v := range tt.header {
				h[k] = v
			}
			if h["Idempotency-Key"] == "k-1" {
				h["Idempotency-Key"] = fmt.Sprintf("k-%d", i)
			}
			r, err := send(t, hc, tt.method, b.url+tt.path, tt.body, h)
			if err != nil {
				t.Fatal(err)
			}
			if r.status != tt.wantStatus || r.header.Get("Content-Type") != "application/problem+json" || r.problem.Code != tt.wantCode {
				t.Errorf("got %d %s %q, want %d problem+json %s", r.status, r.header.Get("Content-Type"), r.body, tt.wantStatus, tt.wantCode)
			}
		})
	}
	if n := b.sim.Ledger().Len(); n != 0 {
		t.Fatalf("bad input charged: %d ledger rows", n)
	}
	if st := b.sim.Stats(); st.Charged != 0 || st.Invalid == 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestConcurrentSameKeyOneRow: 100 goroutines post one key at once. The
// latency keeps the first charge in progress while the others arrive.
func TestConcurrentSameKeyOneRow(t *testing.T) {
	t.Parallel()
	b := setup(t, &paysim.Config{Latency: 200 * time.Millisecond})
	hc := httpClient(t, &http.Transport{MaxIdleConnsPerHost: 100})
	body := chargeBody("o-1", "c-1", 700)
	start := make(chan struct{})
	var wg sync.WaitGroup
	replies := make([]*reply, 100)
	errs := make([]error, 100)
	for i := range 100 {
		wg.Go(func() {
			<-start
			replies[i], errs[i] = send(t, hc, "POST", b.url+"/charges", body, map[string]string{"Idempotency-Key": "one-key"})
		})
	}
	close(start)
	wg.Wait()
	ids := map[string]int{}
	inProgress := 0
	for i, r := range replies {
		switch {
		case errs[i] != nil:
			t.Fatalf("goroutine %d: %v", i, errs[i])
		case r.status == 201:
			ids[r.chargeID]++
		case r.status == 409 && r.problem.Code == "IDEMPOTENCY_KEY_IN_PROGRESS" && r.header.Get("Retry-After") != "":
			inProgress++
		default:
			t.Fatalf("goroutine %d: %d %q", i, r.status, r.body)
		}
	}
	if len(ids) != 1 {
		t.Fatalf("charge ids %v, want exactly one", ids)
	}
	if n := b.sim.Ledger().Len(); n != 1 {
		t.Fatalf("%d ledger rows for one key, want 1", n)
	}
	t.Logf("%d answered 201, %d in progress", 100-inProgress, inProgress)
}

func TestLedgerInsertConcurrentOneRow(t *testing.T) {
	t.Parallel()
	l := paysim.NewLedger()
	var wg sync.WaitGroup
	start := make(chan struct{})
	ids := make([]string, 100)
	inserted := make([]bool, 100)
	for i := range 100 {
		wg.Go(func() {
			<-start
			c, ok, err := l.Insert(paysim.Charge{IdempotencyKey: "k", OrderID: "o", CustomerID: "c", AmountKopecks: 1})
			if err != nil {
				t.Error(err)
			}
			ids[i], inserted[i] = c.ChargeID, ok
		})
	}
	close(start)
	wg.Wait()
	n := 0
	for i := range ids {
		if ids[i] != ids[0] {
			t.Fatalf("charge ids differ: %q vs %q", ids[i], ids[0])
		}
		if inserted[i] {
			n++
		}
	}
	if n != 1 || l.Len() != 1 {
		t.Fatalf("inserted %d times, %d rows; want 1 and 1", n, l.Len())
	}
	if _, _, err := l.Insert(paysim.Charge{IdempotencyKey: "k", OrderID: "o", CustomerID: "c", AmountKopecks: 2}); !errors.Is(err, paysim.ErrLedgerConflict) {
		t.Fatalf("different amount, same key: err = %v, want ErrLedgerConflict", err)
	}
}

func TestLedgerJSONContract(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	hc := httpClient(t, nil)
	if _, err := send(t, hc, "POST", b.url+"/charges", chargeBody("o-1", "c-1", 100), map[string]string{"Idempotency-Key": "k"}); err != nil {
		t.Fatal(err)
	}
	r, err := send(t, hc, "GET", b.url+"/ledger", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Charges []map[string]any `json:"charges"`
	}
	if err := json.Unmarshal([]byte(r.body), &got); err != nil || len(got.Charges) != 1 {
		t.Fatalf("GET /ledger = %q (%v)", r.body, err)
	}
	row := got.Charges[0]
	want := []string{"charge_id", "idempotency_key", "order_id", "customer_id", "principal", "amount_kopecks", "created_at"}
	if len(row) != len(want) {
		t.Errorf("row has members %v, want exactly %v", row, want)
	}
	for _, k := range want {
		if _, ok := row[k]; !ok {
			t.Errorf("row lacks %q: %v", k, row)
		}
	}
	if _, err := time.Parse(time.RFC3339Nano, fmt.Sprint(row["created_at"])); err != nil {
		t.Errorf("created_at: %v", err)
	}
	if row["idempotency_key"] != "k" || row["order_id"] != "o-1" || row["customer_id"] != "c-1" ||
		row["principal"] != paysim.ScopeDefault || row["amount_kopecks"] != 100.0 {
		t.Errorf("row = %v", row)
	}

	// An empty ledger is empty lists, not null.
	empty := setup(t, nil)
	r, _ = send(t, hc, "GET", empty.url+"/ledger", "", nil)
	if strings.TrimSpace(r.body) != `{"charges":[],"declines":[]}` {
		t.Errorf("empty ledger = %q", r.body)
	}
}

func TestFaultFailBeforeCharging(t *testing.T) {
	t.Parallel()
	b := setup(t, &paysim.Config{FailRate: 1})
	hc := httpClient(t, nil)
	for range 2 { // the key is released after a 500, so the retry runs again
		r, err := send(t, hc, "POST", b.url+"/charges", chargeBody("o", "c", 1), map[string]string{"Idempotency-Key": "k"})
		if err != nil || r.status != 500 || r.problem.Code != "PROVIDER_FAULT" {
			t.Fatalf("got %+v %v, want 500 PROVIDER_FAULT", r, err)
		}
	}
	if st := b.sim.Stats(); st.Failed != 2 || b.sim.Ledger().Len() != 0 {
		t.Fatalf("stats %+v, %d rows; want 2 failures and no charge", st, b.sim.Ledger().Len())
	}
}

func TestFaultDropAfterCharging(t *testing.T) {
	t.Parallel()
	b := setup(t, &paysim.Config{DropRate: 1})
	// No keep-alive: each request on a fresh connection, so that net/http
	// does not resend the dropped request by itself.
	hc := httpClient(t, &http.Transport{DisableKeepAlives: true})
	for range 2 {
		r, err := send(t, hc, "POST", b.url+"/charges", chargeBody("o", "c", 1), map[string]string{"Idempotency-Key": "k"})
		if err == nil {
			t.Fatalf("got %d %q, want the connection dropped", r.status, r.body)
		}
	}
	if st := b.sim.Stats(); st.Dropped != 2 || st.Charged != 1 || b.sim.Ledger().Len() != 1 {
		t.Fatalf("stats %+v, %d rows; want 2 drops and one charge", st, b.sim.Ledger().Len())
	}
}

// TestFaultsAreReproducible: the same seed and keys give the same faults;
// another seed gives others.
func TestFaultsAreReproducible(t *testing.T) {
	t.Parallel()
	run := func(seed uint64) string {
		b := setup(t, &paysim.Config{FailRate: 0.3, DropRate: 0.3, Seed: seed})
		hc := httpClient(t, &http.Transport{DisableKeepAlives: true})
		var out strings.Builder
		for i := range 60 {
			key := fmt.Sprintf("k-%d", i%20) // each key three times
			r, err := send(t, hc, "POST", b.url+"/charges", chargeBody(key, "c", 1), map[string]string{"Idempotency-Key": key})
			if err != nil {
				out.WriteString("drop ")
				continue
			}
			fmt.Fprintf(&out, "%d ", r.status)
		}
		return out.String()
	}
	a, again, other := run(7), run(7), run(8)
	if a != again {
		t.Fatalf("seed 7 twice:\n%s\n%s", a, again)
	}
	if a == other {
		t.Fatalf("seeds 7 and 8 gave the same faults: %s", a)
	}
	if !strings.Contains(a, "drop") || !strings.Contains(a, "500") || !strings.Contains(a, "201") {
		t.Fatalf("seed 7 exercised too little: %s", a)
	}
}

// TestLatencyAbandonedChargeIsNotCharged: a client that gives up during
// the latency leaves no ledger row and a released key.
func TestLatencyAbandonedChargeIsNotCharged(t *testing.T) {
	t.Parallel()
	b := setup(t, &paysim.Config{Latency: time.Hour})
	hc := httpClient(t, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", b.url+"/charges", strings.NewReader(chargeBody("o", "c", 1)))
	req.Header.Set("Idempotency-Key", "k")
	if resp, err := hc.Do(req); err == nil {
		resp.Body.Close()
		t.Fatal("the request finished despite an hour of latency")
	}
	b.srv.Close() // waits for the handler to return
	if n := b.sim.Ledger().Len(); n != 0 {
		t.Fatalf("%d ledger rows after an abandoned charge", n)
	}
}

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		cfg  paysim.Config
		want string
	}{
		{paysim.Config{FailRate: 1.5}, "FailRate"},
		{paysim.Config{FailRate: -0.1}, "FailRate"},
		{paysim.Config{DropRate: 2}, "DropRate"},
		{paysim.Config{Latency: -1}, "Latency"},
		{paysim.Config{Lease: -1}, "Lease"},
		{paysim.Config{DeclineRate: 1.01}, "DeclineRate"},
		{paysim.Config{DeclineRate: -1}, "DeclineRate"},
		{paysim.Config{MaxLedgerEntries: -1}, "MaxLedgerEntries"},
		{paysim.Config{MaxLedgerEntries: 1 << 31}, "MaxLedgerEntries"},
		{paysim.Config{MaxLedgerBytes: -1}, "MaxLedgerBytes"},
		{paysim.Config{LedgerToken: "short"}, "LedgerToken"},
		{paysim.Config{LedgerToken: "sixteen chars with spaces"}, "LedgerToken"},
		{paysim.Config{ReadHeaderTimeout: -1}, "ReadHeaderTimeout"},
		{paysim.Config{ReadTimeout: -1}, "ReadTimeout"},
		{paysim.Config{WriteTimeout: -1}, "WriteTimeout"},
		{paysim.Config{IdleTimeout: -1}, "IdleTimeout"},
		{paysim.Config{MaxConns: -1}, "MaxConns"},
		{paysim.Config{MaxHeaderBytes: -1}, "MaxHeaderBytes"},
		// The HTTP bounds are checked against each other as billing's are.
		{paysim.Config{MaxHeaderBytes: 100}, "MaxHeaderBytes"},
		{paysim.Config{ReadHeaderTimeout: time.Hour}, "ReadHeaderTimeout"},
		{paysim.Config{ReadTimeout: time.Hour}, "WriteTimeout 30s must exceed ReadTimeout 1h"},
		{paysim.Config{ReadTimeout: time.Hour, Latency: time.Minute}, "WriteTimeout 30s plus Latency 1m"},
	} {
		if _, err := paysim.New(&tt.cfg); !errors.Is(err, paysim.ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig naming %s", tt.cfg, err, tt.want)
		}
	}
	// Latency counts toward the write timeout: a charge that waits it is
	// still answered.
	if _, err := paysim.New(&paysim.Config{ReadTimeout: time.Minute, WriteTimeout: time.Second, Latency: time.Minute}); err != nil {
		t.Errorf("WriteTimeout 1s plus Latency 1m over ReadTimeout 1m: %v", err)
	}
}

func TestClientCharge(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	c, err := paysim.NewClient(b.url, fastIdem(t, httpClient(t, nil)))
	if err != nil {
		t.Fatal(err)
	}
	cmd := paysim.ChargeCommand{IdempotencyKey: idemclient.Key("o-1", "charge", "r-1"), OrderID: "o-1", CustomerID: "c-1", AmountKopecks: 500}
	first, err := c.Charge(t.Context(), cmd)
	if err != nil || first.ChargeID == "" || first.Replayed || first.Attempts != 1 {
		t.Fatalf("first = %+v, %v", first, err)
	}
	again, err := c.Charge(t.Context(), cmd)
	if err != nil || again.ChargeID != first.ChargeID || !again.Replayed {
		t.Fatalf("again = %+v, %v; want the replay of %s", again, err, first.ChargeID)
	}
	cmd.AmountKopecks = 600
	_, err = c.Charge(t.Context(), cmd)
	var se *idemclient.StatusError
	if !errors.As(err, &se) || se.StatusCode != 409 || se.Code != idem.CodeKeyReused || idemclient.IsRetryable(err) {
		t.Fatalf("reused key: err = %v, want definitive 409 IDEMPOTENCY_KEY_REUSED", err)
	}
	for _, bad := range []paysim.ChargeCommand{
		{OrderID: "o", CustomerID: "c", AmountKopecks: 1},
		{IdempotencyKey: "k", CustomerID: "c", AmountKopecks: 1},
		{IdempotencyKey: "k", OrderID: "o", AmountKopecks: 1},
		{IdempotencyKey: "k", OrderID: "o", CustomerID: "c"},
		{IdempotencyKey: "k k", OrderID: "o", CustomerID: "c", AmountKopecks: 1},
	} {
		if _, err := c.Charge(t.Context(), bad); !errors.Is(err, paysim.ErrInvalidCharge) || idemclient.IsRetryable(err) {
			t.Errorf("Charge(%+v) = %v, want ErrInvalidCharge", bad, err)
		}
	}
	rows, err := c.Ledger(t.Context())
	if err != nil || len(rows) != 1 || rows[0].ChargeID != first.ChargeID {
		t.Fatalf("Ledger = %+v, %v", rows, err)
	}
	if _, err := paysim.NewClient("ftp://x", nil); err == nil {
		t.Error("NewClient accepted an ftp URL")
	}
}
