package paysim_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/paysim"
	"github.com/idemkit/idem/paysim/paysimtest"
)

// TestStrictChargeBody: what encoding/json would let through, POST
// /charges refuses with a problem naming the member, never its value: ids
// over MaxFieldLength, a member twice or spelled in another case, invalid
// UTF-8, control characters, values of another shape (however deep).
func TestStrictChargeBody(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	hc := httpClient(t, nil)
	long := strings.Repeat("o", paysim.MaxFieldLength+1)
	testCases := []struct {
		name, body string
		wantStatus int
		wantCode   string
	}{
		{"order id one byte too long", chargeBody(long, "c", 1), 400, "FIELD_TOO_LONG"},
		{"customer id one byte too long", chargeBody("o", long, 1), 400, "FIELD_TOO_LONG"},
		{"order id too long once escaped", `{"order_id":"` + strings.Repeat(`\u00e9`, 128) + `","customer_id":"c","amount_kopecks":1}`, 400, "FIELD_TOO_LONG"},
		{"member twice", `{"order_id":"a","order_id":"b","customer_id":"c","amount_kopecks":1}`, 400, "MALFORMED_JSON"},
		{"member in another case", `{"ORDER_ID":"a","customer_id":"c","amount_kopecks":1}`, 400, "MALFORMED_JSON"},
		{"member in another case beside the real one", `{"order_id":"a","Order_Id":"b","customer_id":"c","amount_kopecks":1}`, 400, "MALFORMED_JSON"},
		{"invalid UTF-8", "{\"order_id\":\"\xff\xfe\",\"customer_id\":\"c\",\"amount_kopecks\":1}", 400, "MALFORMED_JSON"},
		{"NUL in an id", `{"order_id":"a\u0000b","customer_id":"c","amount_kopecks":1}`, 422, "INVALID_CHARGE"},
		{"newline in an id", `{"order_id":"a\nb","customer_id":"c","amount_kopecks":1}`, 422, "INVALID_CHARGE"},
		{"deep nesting", `{"order_id":` + strings.Repeat("[", 30000) + strings.Repeat("]", 30000) + `}`, 400, "MALFORMED_JSON"},
		{"body over 64 KiB", `{"order_id":"` + strings.Repeat("o", 70<<10) + `"}`, 413, "REQUEST_BODY_TOO_LARGE"},
		{"nested value", `{"order_id":{"a":[[[[1]]]]},"customer_id":"c","amount_kopecks":1}`, 400, "MALFORMED_JSON"},
		{"amount beyond int64", `{"order_id":"o","customer_id":"c","amount_kopecks":9223372036854775808}`, 400, "MALFORMED_JSON"},
		{"amount with exponent", `{"order_id":"o","customer_id":"c","amount_kopecks":1e3}`, 400, "MALFORMED_JSON"},
		{"null members", `{"order_id":null,"customer_id":"c","amount_kopecks":1}`, 422, "INVALID_CHARGE"},
	}
	for i, tt := range testCases {
		key := fmt.Sprintf("strict-%d", i)
		r, err := send(t, hc, "POST", b.url+"/charges", tt.body, map[string]string{"Idempotency-Key": key})
		if err != nil {
			t.Fatal(err)
		}
		if r.status != tt.wantStatus || r.problem.Code != tt.wantCode {
			t.Errorf("%s: %d %q, want %d %s", tt.name, r.status, r.body, tt.wantStatus, tt.wantCode)
		}
		if strings.Contains(r.body, "ooooooooooooooooooooooooooooooooooooooooooooooooo") {
			t.Errorf("%s: the problem echoes the value: %s", tt.name, r.body)
		}
		// Refused before anything ran: nothing stored under the key, so
		// the corrected request with the same key is charged.
		ok, err := send(t, hc, "POST", b.url+"/charges", chargeBody("o-"+key, "c", 1), map[string]string{"Idempotency-Key": key})
		if err != nil || ok.status != 201 || ok.header.Get("Idempotent-Replayed") != "" {
			t.Errorf("%s: the corrected retry with the same key got %+v %v, want a fresh 201", tt.name, ok, err)
		}
	}
	at := strings.Repeat("o", paysim.MaxFieldLength)
	if r, err := send(t, hc, "POST", b.url+"/charges", chargeBody(at, at, 1), map[string]string{"Idempotency-Key": "at-bound"}); err != nil || r.status != 201 {
		t.Fatalf("ids at MaxFieldLength: %+v %v, want 201", r, err)
	}
	if n := b.sim.Ledger().Len(); n != len(testCases)+1 {
		t.Fatalf("%d ledger rows, want one per corrected retry and the one at the bound (%d)", n, len(testCases)+1)
	}
}

// TestLedgerFullIsClear507: on a full ledger a new key is 507 LEDGER_FULL
// (ErrLedgerFull for the client, not retryable), nothing charged, nothing
// recorded; a key charged before is still answered, and so is a decline.
func TestLedgerFullIsClear507(t *testing.T) {
	t.Parallel()
	b := setup(t, &paysim.Config{MaxLedgerEntries: 3})
	c, err := paysim.NewClient(b.url, fastIdem(t, httpClient(t, nil)))
	if err != nil {
		t.Fatal(err)
	}
	cmd := func(i int) paysim.ChargeCommand {
		return paysim.ChargeCommand{IdempotencyKey: fmt.Sprintf("k-%d", i), OrderID: fmt.Sprintf("o-%d", i), CustomerID: "c", AmountKopecks: 10}
	}
	var first paysim.ChargeResult
	for i := range 3 {
		res, err := c.Charge(t.Context(), cmd(i))
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = res
		}
	}
	_, err = c.Charge(t.Context(), cmd(3))
	var se *idemclient.StatusError
	if !errors.Is(err, paysim.ErrLedgerFull) || idemclient.IsRetryable(err) || !errors.As(err, &se) || se.StatusCode != 507 || se.Code != paysim.CodeLedgerFull {
		t.Fatalf("a new key on a full ledger: %v, want ErrLedgerFull (507 LEDGER_FULL), not retryable", err)
	}
	if res, err := c.Charge(t.Context(), cmd(0)); err != nil || res.ChargeID != first.ChargeID || !res.Replayed {
		t.Fatalf("retry of a charged key on a full ledger: %+v, %v; want the replay of %s", res, err, first.ChargeID)
	}
	if n := b.sim.Ledger().Len(); n != 3 {
		t.Fatalf("%d rows, want 3", n)
	}
	if st := b.sim.Stats(); st.LedgerFull != 1 || st.Charged != 3 {
		t.Fatalf("stats %+v", st)
	}
	// The Go API refuses the same way, and keeps answering known keys.
	if _, _, err := b.sim.Ledger().Insert(paysim.Charge{IdempotencyKey: "new", Principal: paysim.ScopeDefault, OrderID: "o", CustomerID: "c", AmountKopecks: 1}); !errors.Is(err, paysim.ErrLedgerFull) {
		t.Fatalf("Insert of a new key on a full ledger: %v", err)
	}
	if ch, ok, err := b.sim.Ledger().Insert(paysim.Charge{IdempotencyKey: "k-1", Principal: paysim.ScopeDefault, OrderID: "o-1", CustomerID: "c", AmountKopecks: 10}); err != nil || ok || ch.ChargeID == "" {
		t.Fatalf("Insert of a known key on a full ledger: %+v %v %v", ch, ok, err)
	}
	u := b.sim.Ledger().Usage()
	if u.Keys != 3 || u.MaxKeys != 3 || u.Bytes <= 0 || u.Bytes > u.MaxBytes {
		t.Fatalf("usage %+v", u)
	}
}

// TestLedgerBytesBound: MaxLedgerBytes bounds the ledger by what its keys
// hold, not their number: long ids fill it sooner than short ones.
func TestLedgerBytesBound(t *testing.T) {
	t.Parallel()
	fill := func(field int) int {
		b := setup(t, &paysim.Config{MaxLedgerBytes: 256 << 10})
		hc := httpClient(t, nil)
		pad := strings.Repeat("x", field)
		for i := 0; ; i++ {
			id := fmt.Sprintf("%d-%s", i, pad)[:field]
			r, err := send(t, hc, "POST", b.url+"/charges", chargeBody(id, id, 1), map[string]string{"Idempotency-Key": id})
			if err != nil {
				t.Fatal(err)
			}
			if r.status == 507 && r.problem.Code == "LEDGER_FULL" {
				if u := b.sim.Ledger().Usage(); u.Bytes > u.MaxBytes || u.Keys != i || b.sim.Ledger().Len() != i {
					t.Fatalf("usage %+v after %d charges", u, i)
				}
				return i
			}
			if r.status != 201 {
				t.Fatalf("charge %d: %d %s", i, r.status, r.body)
			}
		}
	}
	short, long := fill(10), fill(250)
	if short == 0 || long == 0 || long >= short {
		t.Fatalf("256 KiB holds %d short keys and %d long ones", short, long)
	}
	t.Logf("256 KiB holds %d keys with 10-byte ids, %d with 250-byte ids", short, long)
}

// TestLedgerCapUnderRace: 200 goroutines with 200 keys race on a ledger
// of 50: exactly 50 are charged, the other 150 told LEDGER_FULL.
func TestLedgerCapUnderRace(t *testing.T) {
	t.Parallel()
	b := setup(t, &paysim.Config{MaxLedgerEntries: 50})
	hc := httpClient(t, &http.Transport{MaxIdleConnsPerHost: 200})
	var wg sync.WaitGroup
	start := make(chan struct{})
	statuses := make([]int, 200)
	for i := range statuses {
		wg.Go(func() {
			<-start
			r, err := send(t, hc, "POST", b.url+"/charges", chargeBody(fmt.Sprintf("o-%d", i), "c", 1), map[string]string{"Idempotency-Key": fmt.Sprintf("k-%d", i)})
			if err != nil {
				t.Error(err)
				return
			}
			statuses[i] = r.status
		})
	}
	close(start)
	wg.Wait()
	count := map[int]int{}
	for _, s := range statuses {
		count[s]++
	}
	if count[201] != 50 || count[507] != 150 || b.sim.Ledger().Len() != 50 {
		t.Fatalf("statuses %v, %d rows; want 50×201, 150×507, 50 rows", count, b.sim.Ledger().Len())
	}
}

// TestLedgerViews: GET /ledger shows a principal its own entries only,
// pages them, and shows every principal's to Config.LedgerToken.
func TestLedgerViews(t *testing.T) {
	t.Parallel()
	const token = "0123456789abcdef-token"
	b := setup(t, &paysim.Config{LedgerToken: token})
	hc := httpClient(t, nil)
	for i := range 5 {
		for _, who := range []string{"Bearer alice", "Bearer bob"} {
			if _, err := send(t, hc, "POST", b.url+"/charges", chargeBody(fmt.Sprintf("%s-%d", who, i), "c", 1), map[string]string{"Idempotency-Key": fmt.Sprint(i), "Authorization": who}); err != nil {
				t.Fatal(err)
			}
		}
	}
	get := func(query, auth string) paysim.Entries {
		t.Helper()
		h := map[string]string{}
		if auth != "" {
			h["Authorization"] = auth
		}
		r, err := send(t, hc, "GET", b.url+"/ledger"+query, "", h)
		if err != nil || r.status != 200 {
			t.Fatalf("GET /ledger%s as %q: %+v %v", query, auth, r, err)
		}
		var e paysim.Entries
		if err := jsonUnmarshal(r.body, &e); err != nil {
			t.Fatal(err)
		}
		return e
	}
	alice := get("", "Bearer alice")
	if len(alice.Charges) != 5 || alice.Next != "" {
		t.Fatalf("alice sees %+v", alice)
	}
	for _, c := range alice.Charges {
		if c.Principal != "Bearer alice" {
			t.Fatalf("alice sees %+v", c)
		}
	}
	if e := get("", ""); len(e.Charges) != 0 {
		t.Fatalf("an anonymous caller sees %d of alice's and bob's charges", len(e.Charges))
	}
	p1 := get("?limit=2", "Bearer bob")
	p2 := get("?limit=2&after="+p1.Next, "Bearer bob")
	p3 := get("?limit=2&after="+p2.Next, "Bearer bob")
	if len(p1.Charges) != 2 || len(p2.Charges) != 2 || len(p3.Charges) != 1 || p3.Next != "" || p1.Charges[0].ChargeID == p2.Charges[0].ChargeID {
		t.Fatalf("bob's pages %+v %+v %+v", p1, p2, p3)
	}
	if e := get("", "Bearer "+token); len(e.Charges) != 10 {
		t.Fatalf("the ledger token sees %d charges, want 10", len(e.Charges))
	}
	// Without a token configured, a bearer of any value is a principal.
	open := setup(t, nil)
	if _, err := send(t, hc, "POST", open.url+"/charges", chargeBody("o", "c", 1), map[string]string{"Idempotency-Key": "k", "Authorization": "Bearer alice"}); err != nil {
		t.Fatal(err)
	}
	if r, _ := send(t, hc, "GET", open.url+"/ledger", "", map[string]string{"Authorization": "Bearer "}); r == nil || strings.Contains(r.body, "alice") {
		t.Fatalf("an empty bearer sees alice's charges: %+v", r)
	}
}

// TestClientEntriesPagesThrough: the typed client reads a ledger larger
// than a page, each entry once.
func TestClientEntriesPagesThrough(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	const n = paysim.LedgerPageMax + 50
	for i := range n {
		if _, _, err := b.sim.Ledger().Insert(paysim.Charge{IdempotencyKey: fmt.Sprint(i), Principal: paysim.ScopeDefault, OrderID: fmt.Sprint(i), CustomerID: "c", AmountKopecks: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := b.sim.Ledger().Decline(paysim.Decline{IdempotencyKey: "d", Principal: paysim.ScopeDefault, OrderID: "d", CustomerID: "c", AmountKopecks: 1}); err != nil {
		t.Fatal(err)
	}
	c, err := paysim.NewClient(b.url, fastIdem(t, httpClient(t, nil)))
	if err != nil {
		t.Fatal(err)
	}
	e, err := c.Entries(t.Context())
	if err != nil || len(e.Charges) != n || len(e.Declines) != 1 || e.Next != "" {
		t.Fatalf("Entries: %d charges, %d declines, %v", len(e.Charges), len(e.Declines), err)
	}
	seen := map[string]bool{}
	for _, ch := range e.Charges {
		if seen[ch.ChargeID] {
			t.Fatalf("%s twice", ch.ChargeID)
		}
		seen[ch.ChargeID] = true
	}
}

// serve runs sim with Serve on a loopback listener, as `idem paysim`
// does, and returns its host:port.
func serve(t *testing.T, cfg *paysim.Config) (*paysim.Server, string) {
	t.Helper()
	sim, url := paysimtest.Start(t, cfg)
	return sim, strings.TrimPrefix(url, "http://")
}

// TestFullLedgerAnswersBeforeTheBody: a new key on a full ledger is
// refused on its header: a body that never comes does not delay the 507.
// The read timeout is an hour, so an answer that waited for the body would
// not come within the test's wait.
func TestFullLedgerAnswersBeforeTheBody(t *testing.T) {
	t.Parallel()
	sim, addr := serve(t, &paysim.Config{MaxLedgerEntries: 1, ReadTimeout: time.Hour, WriteTimeout: 2 * time.Hour})
	if _, _, err := sim.Ledger().Insert(paysim.Charge{IdempotencyKey: "k", Principal: paysim.ScopeDefault, OrderID: "o", CustomerID: "c", AmountKopecks: 1}); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "POST /charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: new\r\nContent-Length: 100\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer before the body: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 507 || !resp.Close {
		t.Fatalf("answer %d %v, want 507 with Connection: close", resp.StatusCode, resp.Header)
	}
}

// TestServeRefusesOverMaxConns: Serve's connection bound, in process:
// the connection over it gets 503 TOO_MANY_CONNECTIONS, counted, and
// Shutdown waits for the refusal (goleak checks nothing is left).
func TestServeRefusesOverMaxConns(t *testing.T) {
	t.Parallel()
	sim, addr := serve(t, &paysim.Config{MaxConns: 1, ReadHeaderTimeout: time.Hour, ReadTimeout: time.Hour, WriteTimeout: 2 * time.Hour})
	held, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	io.WriteString(held, "GET /healthz HTTP/1.1\r\nHost: x\r\n") // never ends
	hc := httpClient(t, &http.Transport{DisableKeepAlives: true})
	r, err := send(t, hc, "GET", "http://"+addr+"/healthz", "", nil)
	if err != nil || r.status != 503 || r.problem.Code != paysim.CodeTooManyConns || r.header.Get("Retry-After") != "1" {
		t.Fatalf("over the limit: %+v %v", r, err)
	}
	if st := sim.Stats(); st.Refused != 1 {
		t.Fatalf("stats %+v, want 1 refused", st)
	}
	held.Close()
}

// TestEchoedInputIsClipped: the 404 and 405 problems quote the path and
// the method, within problem.MaxDetail (200) bytes, cut on a character
// boundary (no U+FFFD made by the cut), and marked no-store.
func TestEchoedInputIsClipped(t *testing.T) {
	t.Parallel()
	sim, err := paysim.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	testCases := []struct {
		name, method, target string
		status               int
		code, want           string
	}{
		{"10 KiB method", strings.Repeat("M", 10<<10), "/charges", 405, "METHOD_NOT_ALLOWED", " is not allowed on /charges"},
		{"long path of two-byte characters", "GET", "/" + strings.Repeat("%C3%A9", 3000), 404, "NOT_FOUND", "no such resource: /éé"},
		{"long path after one byte", "GET", "/a" + strings.Repeat("%C3%A9", 3000), 404, "NOT_FOUND", "no such resource: /aé"},
		{"long path on a route", "GET", "/ledger/" + strings.Repeat("%E2%82%AC", 3000), 404, "NOT_FOUND", "no such resource: /ledger/€"},
	}
	for _, tt := range testCases {
		w := httptest.NewRecorder()
		sim.ServeHTTP(w, httptest.NewRequest(tt.method, tt.target, nil))
		var p struct {
			Code, Detail string
		}
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
			t.Fatalf("%s: %v: %q", tt.name, err, w.Body)
		}
		if w.Code != tt.status || p.Code != tt.code || w.Header().Get("Cache-Control") != "no-store" {
			t.Errorf("%s: %d %v %+v", tt.name, w.Code, w.Header(), p)
		}
		if len(p.Detail) > 200 || w.Body.Len() > 1024 || !utf8.ValidString(p.Detail) || strings.ContainsRune(p.Detail, utf8.RuneError) || !strings.Contains(p.Detail, tt.want) {
			t.Errorf("%s: a %d-byte answer with the %d-byte detail %q", tt.name, w.Body.Len(), len(p.Detail), p.Detail)
		}
	}
}
