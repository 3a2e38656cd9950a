package httpapi_test

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/billing/adapters/in/httpapi"
	"github.com/idemkit/idem/examples/billing/domain"
	"github.com/idemkit/idem/internal/testdb"
)

// randomToken is n random characters that are valid in an HTTP method (a
// token), so that net/http would accept them from the wire.
func randomToken(n int) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789!#$%&'*+-.^_`|~"
	b := make([]byte, n)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// TestMetricLabelsAreBounded sends 1,000 requests with random 64 KiB
// methods, with and without a token, to routes and to no route: the
// request counter keeps a handful of series, and /metrics stays small.
// (On main every method became a series kept for good: 65 MB of /metrics.)
func TestMetricLabelsAreBounded(t *testing.T) {
	t.Parallel()
	f := setup(t)
	paths := []string{"/orders", "/orders/ord_x", "/payments", "/nope", "/metrics"}
	for i := range 1000 {
		r := httptest.NewRequest("GET", paths[i%len(paths)], nil)
		r.Method = randomToken(64 << 10)
		if i%2 == 0 {
			r.Header.Set("Authorization", "Bearer "+aliceSecret)
		}
		w := httptest.NewRecorder()
		f.h.ServeHTTP(w, r)
		if w.Code >= 500 {
			t.Fatalf("odd method: %d %s", w.Code, w.Body)
		}
	}
	for _, m := range []string{"GET", "HEAD", "DELETE", "OPTIONS"} {
		f.do(m, "/orders/ord_x", "", "")
	}
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	body := w.Body.String()
	if w.Code != 200 || len(body) > 64<<10 {
		t.Fatalf("/metrics: %d, %d bytes", w.Code, len(body))
	}
	series := 0
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, "billing_http_requests_total{") {
			series++
			if len(line) > 200 {
				t.Errorf("a series carries raw input: %.200s…", line)
			}
		}
	}
	// other×(3 routes' worth of statuses) plus the four fixed methods.
	if series == 0 || series > 12 {
		t.Fatalf("%d request series, want a handful:\n%s", series, body)
	}
	if !strings.Contains(body, `method="other"`) {
		t.Errorf("no method=\"other\" series:\n%s", body)
	}
}

// TestHEADIsARead: HEAD of an order or a payment answers like GET (it used
// to be a 500: the repository picker took only GET for a read).
func TestHEADIsARead(t *testing.T) {
	t.Parallel()
	f := setup(t)
	id := f.order(t, "o1", 1000)
	pay := f.do("POST", "/payments", "p1", `{"order_id":"`+id+`","customer_id":"c1","amount_kopecks":500}`)
	if pay.Code != http.StatusCreated {
		t.Fatalf("payment: %d %s", pay.Code, pay.Body)
	}
	var payID struct{ ID string }
	_ = json.Unmarshal(pay.Body.Bytes(), &payID)
	for _, path := range []string{"/orders/" + id, "/payments/" + payID.ID, "/healthz", "/readyz", "/metrics"} {
		if w := f.do("HEAD", path, "", ""); w.Code != http.StatusOK {
			t.Errorf("HEAD %s: %d %s", path, w.Code, w.Body)
		}
	}
	problem(t, "HEAD unknown order", f.do("HEAD", "/orders/ord_nope", "", ""), 404, httpapi.CodeOrderNotFound)
	problem(t, "HEAD unknown payment", f.do("HEAD", "/payments/pay_nope", "", ""), 404, httpapi.CodePaymentNotFound)
	if strings.Contains(f.log.String(), "level=ERROR") {
		t.Errorf("errors logged:\n%s", f.log.String())
	}
}

// TestBadTextIs400BeforeSQL: a NUL byte or invalid UTF-8 in an id of the
// path or in a JSON string is a 400 problem+json, never PostgreSQL's
// SQLSTATE 22021 as a 500 with an ERROR log; and nothing is stored.
func TestBadTextIs400BeforeSQL(t *testing.T) {
	t.Parallel()
	f := setup(t)
	id := f.order(t, "o1", 1000)
	testCases := []struct {
		name, method, path, body string
		code                     string
	}{
		{"NUL in an order id", "GET", "/orders/ord%00x", "", httpapi.CodeInvalidText},
		{"invalid UTF-8 in an order id", "GET", "/orders/%FF%FE", "", httpapi.CodeInvalidText},
		{"NUL in a payment id", "GET", "/payments/pay%00", "", httpapi.CodeInvalidText},
		{"control character in an id", "GET", "/orders/ord%07", "", httpapi.CodeInvalidText},
		{"NUL in a confirmed id", "POST", "/orders/ord%00/confirm", "", httpapi.CodeInvalidText},
		{"NUL in customer_id", "POST", "/orders", `{"customer_id":"c\u0000","total_kopecks":5}`, httpapi.CodeInvalidText},
		{"NUL in order_id", "POST", "/payments", `{"order_id":"` + id + `\u0000","customer_id":"c1","amount_kopecks":5}`, httpapi.CodeInvalidText},
		{"invalid UTF-8 in a string", "POST", "/orders", "{\"customer_id\":\"c\xff\xfe\",\"total_kopecks\":5}", httpapi.CodeMalformedJSON},
		{"lone surrogate escape", "POST", "/orders", `{"customer_id":"c\ud800","total_kopecks":5}`, ""},
	}
	for i, tt := range testCases {
		w := f.do(tt.method, tt.path, fmt.Sprintf("k%d", i), tt.body)
		if tt.code == "" {
			// encoding/json turns a lone surrogate into U+FFFD: valid
			// text, so any 4xx or a 201 is fine; never a 5xx.
			if w.Code >= 500 {
				t.Errorf("%s: %d %s", tt.name, w.Code, w.Body)
			}
			continue
		}
		problem(t, tt.name, w, http.StatusBadRequest, tt.code)
	}
	if strings.Contains(f.log.String(), "level=ERROR") || strings.Contains(f.log.String(), "22021") {
		t.Errorf("errors logged:\n%s", f.log.String())
	}
	// Only o1 and, maybe, the surrogate's order are stored.
	if n := f.count(t, `SELECT count(*) FROM idempotency_key`); n > 2 {
		t.Errorf("%d idempotency records: refused input was stored", n)
	}
}

// TestRefusedInputIsBoundedAndNotStored: a 400 never echoes unbounded input
// (a ~900 KB member name, a 100,000-digit number), and a request refused
// before the handler acted (malformed JSON, a validation failure) stores
// nothing, so that the same key then serves the corrected request; a
// refusal that depends on the database (an unknown order) is stored and
// replayed like any answer.
func TestRefusedInputIsBoundedAndNotStored(t *testing.T) {
	t.Parallel()
	f := setup(t)
	long := strings.Repeat("x", 900<<10)
	testCases := []struct {
		name, body string
		status     int
		code       string
	}{
		{"huge unknown member", `{"` + long + `":1,"customer_id":"c1","total_kopecks":5}`, 400, httpapi.CodeMalformedJSON},
		{"huge number", `{"customer_id":"c1","total_kopecks":` + strings.Repeat("9", 100000) + `}`, 400, httpapi.CodeMalformedJSON},
		{"huge string where a number goes", `{"customer_id":"c1","total_kopecks":"` + long + `"}`, 400, httpapi.CodeMalformedJSON},
		{"huge customer id", `{"customer_id":"` + long + `","total_kopecks":5}`, 422, httpapi.CodeValidation},
		// The idempotency middleware refuses these two before the handler
		// reads them (their fingerprint would not be trustworthy).
		{"repeated member", `{"customer_id":"c1","total_kopecks":5,"total_kopecks":7}`, 400, idem.CodeBodyAmbiguous},
		{"case-folded member", `{"Customer_ID":"c1","total_kopecks":5}`, 400, httpapi.CodeMalformedJSON},
		{"not an object", `[1,2]`, 400, httpapi.CodeMalformedJSON},
		{"trailing data", `{"customer_id":"c1","total_kopecks":5} {}`, 400, httpapi.CodeMalformedJSON},
		{"deep nesting", `{"customer_id":` + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + `,"total_kopecks":5}`, 400, idem.CodeBodyTooDeep},
		{"zero total", `{"customer_id":"c1","total_kopecks":0}`, 422, httpapi.CodeValidation},
		{"total above the bound", `{"customer_id":"c1","total_kopecks":9223372036854775807}`, 422, httpapi.CodeAmountTooLarge},
	}
	for i, tt := range testCases {
		key := fmt.Sprintf("bad-%d", i)
		w := f.do("POST", "/orders", key, tt.body)
		detail := problem(t, tt.name, w, tt.status, tt.code)
		if len(detail) > httpapi.MaxDetailLen || w.Body.Len() > 1024 {
			t.Errorf("%s: a %d-byte answer with a %d-byte detail: %.300s", tt.name, w.Body.Len(), len(detail), w.Body)
		}
		// Not stored: the same key now takes the corrected request.
		if ok := f.do("POST", "/orders", key, `{"customer_id":"c1","total_kopecks":5}`); ok.Code != http.StatusCreated || ok.Header().Get("Idempotent-Replayed") != "" {
			t.Errorf("%s: the corrected request under the same key: %d %s", tt.name, ok.Code, ok.Body)
		}
	}
	if n := f.count(t, `SELECT count(*) FROM idempotency_key WHERE octet_length(response_body) > 1024`); n != 0 {
		t.Errorf("%d stored answers over 1 KiB", n)
	}
	// A refusal that read the database is an answer: stored, replayed.
	body := `{"order_id":"ord_nope","customer_id":"c1","amount_kopecks":5}`
	problem(t, "unknown order", f.do("POST", "/payments", "p-nope", body), 404, httpapi.CodeOrderNotFound)
	if again := f.do("POST", "/payments", "p-nope", body); again.Code != 404 || again.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("unknown order, again: %d %v", again.Code, again.Header())
	}
}

// TestPaymentRules: a payment must be for a NEW order of the same customer
// and fit in what the order still owes; amounts have an upper bound; each
// refusal has its own code; a confirm of an order with payments is refused
// (it would charge the whole total again). On main two payments of
// 9,223,372,036,854,775,807 kopecks on an order CHARGED for 1,000 were
// accepted. It runs on both data layers.
func TestPaymentRules(t *testing.T) {
	t.Parallel()
	forLayers(t, paymentRules)
}

func paymentRules(t *testing.T, layer string) {
	f := setupOn(t, layer)
	pay := func(key, orderID, customer string, amount int64) *httptest.ResponseRecorder {
		return f.do("POST", "/payments", key, fmt.Sprintf(`{"order_id":%q,"customer_id":%q,"amount_kopecks":%d}`, orderID, customer, amount))
	}
	charged := f.order(t, "o-charged", 1000)
	if w := f.do("POST", "/orders/"+charged+"/confirm", "c-charged", ""); w.Code != 200 {
		t.Fatalf("confirm: %d %s", w.Code, w.Body)
	}
	if _, err := f.db.Pool.Exec(t.Context(), `UPDATE orders SET status = 'CHARGED' WHERE id = $1`, charged); err != nil {
		t.Fatal(err)
	}
	problem(t, "max int64 on a CHARGED order", pay("p1", charged, "c1", 1<<63-1), 422, httpapi.CodeAmountTooLarge)
	problem(t, "max int64 again", pay("p2", charged, "c1", 1<<63-1), 422, httpapi.CodeAmountTooLarge)
	problem(t, "a CHARGED order", pay("p3", charged, "c1", 1000), 409, httpapi.CodeOrderState)
	confirmed := f.order(t, "o-confirmed", 1000)
	if w := f.do("POST", "/orders/"+confirmed+"/confirm", "c-confirmed", ""); w.Code != 200 {
		t.Fatalf("confirm: %d %s", w.Code, w.Body)
	}
	problem(t, "a CONFIRMED order", pay("p4", confirmed, "c1", 10), 409, httpapi.CodeOrderState)

	o := f.order(t, "o-new", 1000)
	problem(t, "above the bound", pay("p5", o, "c1", domain.MaxAmountKopecks+1), 422, httpapi.CodeAmountTooLarge)
	problem(t, "another customer", pay("p6", o, "c2", 10), 422, httpapi.CodeCustomerMismatch)
	problem(t, "above the total", pay("p7", o, "c1", 1001), 409, httpapi.CodeExceedsOutstanding)
	if w := pay("p8", o, "c1", 600); w.Code != http.StatusCreated {
		t.Fatalf("600 of 1000: %d %s", w.Code, w.Body)
	}
	problem(t, "above the rest", pay("p9", o, "c1", 401), 409, httpapi.CodeExceedsOutstanding)
	if w := pay("p10", o, "c1", 400); w.Code != http.StatusCreated {
		t.Fatalf("the last 400: %d %s", w.Code, w.Body)
	}
	problem(t, "nothing left", pay("p11", o, "c1", 1), 409, httpapi.CodeExceedsOutstanding)
	problem(t, "confirm with payments", f.do("POST", "/orders/"+o+"/confirm", "c-new", ""), 409, httpapi.CodeOrderHasPayments)

	// A FAILED payment no longer counts: its amount may be paid again.
	if _, err := f.db.Pool.Exec(t.Context(), `UPDATE payments SET status = 'FAILED' WHERE order_id = $1 AND amount_kopecks = 400`, o); err != nil {
		t.Fatal(err)
	}
	if w := pay("p12", o, "c1", 400); w.Code != http.StatusCreated {
		t.Fatalf("after a failed payment: %d %s", w.Code, w.Body)
	}
	if n := f.count(t, `SELECT count(*) FROM payments`); n != 3 {
		t.Fatalf("%d payments, want 3", n)
	}
	if n := f.count(t, `SELECT count(*) FROM outbox_event WHERE event_type = 'ChargeRequested'`); n != 3 {
		t.Fatalf("%d ChargeRequested, want 3", n)
	}
}

// TestConcurrentPaymentsOnOneOrder races 16 payments of the whole total
// on one order, each under its own key (so the idempotency layer does not
// order them): exactly one is accepted and one charge commanded. Then a
// payment and a confirm race on fresh orders: exactly one of the two wins
// each time. It runs on both data layers: on database/sql the order's row
// lock is taken through the *sql.Tx of the middleware.
func TestConcurrentPaymentsOnOneOrder(t *testing.T) {
	t.Parallel()
	forLayers(t, concurrentPaymentsOnOneOrder)
}

func concurrentPaymentsOnOneOrder(t *testing.T, layer string) {
	f := setupOn(t, layer, testdb.MaxConns(20))
	o := f.order(t, "o1", 1000)
	const n = 16
	codes := make([]int, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			w := f.do("POST", "/payments", fmt.Sprintf("race-%d", i), `{"order_id":"`+o+`","customer_id":"c1","amount_kopecks":1000}`)
			codes[i] = w.Code
			if w.Code != http.StatusCreated {
				problem(t, "racing payment", w, 409, httpapi.CodeExceedsOutstanding)
			}
		}()
	}
	close(start)
	wg.Wait()
	accepted := 0
	for _, c := range codes {
		if c == http.StatusCreated {
			accepted++
		}
	}
	if accepted != 1 {
		t.Fatalf("%d of %d racing payments accepted (%v), want 1", accepted, n, codes)
	}
	if got := f.count(t, `SELECT count(*) FROM payments WHERE order_id = $1`, o); got != 1 {
		t.Fatalf("%d payments stored, want 1", got)
	}
	if got := f.count(t, `SELECT count(*) FROM outbox_event WHERE event_type = 'ChargeRequested'`); got != 1 {
		t.Fatalf("%d charges commanded, want 1", got)
	}

	for round := range 8 {
		o := f.order(t, fmt.Sprintf("o-round-%d", round), 1000)
		var confirm, payment *httptest.ResponseRecorder
		start := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			confirm = f.do("POST", "/orders/"+o+"/confirm", fmt.Sprintf("rc-%d", round), "")
		}()
		go func() {
			defer wg.Done()
			<-start
			payment = f.do("POST", "/payments", fmt.Sprintf("rp-%d", round), `{"order_id":"`+o+`","customer_id":"c1","amount_kopecks":500}`)
		}()
		close(start)
		wg.Wait()
		switch {
		case confirm.Code == 200 && payment.Code == 409:
			problem(t, "payment after the confirm", payment, 409, httpapi.CodeOrderState)
		case confirm.Code == 409 && payment.Code == 201:
			problem(t, "confirm after the payment", confirm, 409, httpapi.CodeOrderHasPayments)
		default:
			t.Fatalf("round %d: confirm %d %s, payment %d %s: want exactly one to win", round, confirm.Code, confirm.Body, payment.Code, payment.Body)
		}
	}
}

func TestCheckTokens(t *testing.T) {
	t.Parallel()
	demo, _ := httpapi.ParseTokens(httpapi.DefaultTokens)
	short := []httpapi.Token{{Secret: "short", Principal: "alice"}}
	long := []httpapi.Token{{Secret: strings.Repeat("s", httpapi.MinTokenLength), Principal: "alice"}}
	for _, tt := range []struct {
		name   string
		tokens []httpapi.Token
		public bool
		err    bool
		warns  int
	}{
		{"demo on a public listener", demo, true, true, 0},
		{"demo on loopback", demo, false, false, 2},
		{"short on a public listener", short, true, true, 0},
		{"short on loopback", short, false, false, 1},
		{"long on a public listener", long, true, false, 0},
		{"long on loopback", long, false, false, 0},
	} {
		warns, err := httpapi.CheckTokens(tt.tokens, tt.public)
		if tt.err != (err != nil) || (err != nil && !errors.Is(err, httpapi.ErrUnsafeTokens)) || len(warns) != tt.warns {
			t.Errorf("%s: warnings %q, error %v", tt.name, warns, err)
		}
		for _, s := range append(warns, fmt.Sprint(err)) {
			for _, tok := range tt.tokens {
				if strings.Contains(s, tok.Secret) {
					t.Errorf("%s: %q shows a secret", tt.name, s)
				}
			}
		}
	}
}
