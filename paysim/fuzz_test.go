package paysim_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkit/idem/paysim"
)

// FuzzChargeBody: whatever the body, POST /charges answers 201 (and then
// exactly one row exists) or a problem+json 4xx (and no row), never a 5xx
// or a panic.
func FuzzChargeBody(f *testing.F) {
	f.Add(`{"order_id":"o","customer_id":"c","amount_kopecks":100}`)
	f.Add(`{"order_id":"o","customer_id":"c","amount_kopecks":-1}`)
	f.Add(`{"order_id":`)
	f.Add(`null`)
	f.Add(`{"order_id":"o","customer_id":"c","amount_kopecks":1e3}`)
	f.Add(`{"order_id":"a","order_id":"b","customer_id":"c","amount_kopecks":1}`)
	f.Add(`{"ORDER_ID":"a","customer_id":"c","amount_kopecks":1}`)
	f.Add("{\"order_id\":\"\xff\",\"customer_id\":\"c\",\"amount_kopecks\":1}")
	f.Add(`{"order_id":[[[[[[[[[[]]]]]]]]]],"customer_id":"c","amount_kopecks":1}`)
	f.Add(`{"order_id":"\u0000","customer_id":"c","amount_kopecks":1}`)
	f.Fuzz(func(t *testing.T, body string) {
		sim, err := paysim.New(nil)
		if err != nil {
			t.Fatal(err)
		}
		req := httptest.NewRequest("POST", "/charges", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", "k")
		rec := httptest.NewRecorder()
		sim.ServeHTTP(rec, req)
		rows := sim.Ledger().Len()
		switch {
		case rec.Code == http.StatusCreated:
			if rows != 1 {
				t.Fatalf("201 with %d rows", rows)
			}
		case rec.Code >= 400 && rec.Code < 500:
			if rows != 0 || rec.Header().Get("Content-Type") != "application/problem+json" {
				t.Fatalf("%d %s with %d rows", rec.Code, rec.Header().Get("Content-Type"), rows)
			}
		default:
			t.Fatalf("status %d for body %q: %s", rec.Code, body, rec.Body)
		}
	})
}

// FuzzLedgerQuery: whatever the query, GET /ledger answers 200 with the
// contract's shape or 400 INVALID_PAGE, never a 5xx or a panic.
func FuzzLedgerQuery(f *testing.F) {
	f.Add("")
	f.Add("limit=1&after=0")
	f.Add("limit=10000&after=2147483647")
	f.Add("after=99999999999999999999")
	f.Add("limit=%00&after=%ff")
	f.Add("after=&limit=")
	sim, err := paysim.New(nil)
	if err != nil {
		f.Fatal(err)
	}
	for i := range 3 {
		if _, _, err := sim.Ledger().Insert(paysim.Charge{IdempotencyKey: strings.Repeat("k", i+1), Principal: paysim.ScopeDefault, OrderID: "o", CustomerID: "c", AmountKopecks: 1}); err != nil {
			f.Fatal(err)
		}
	}
	f.Fuzz(func(t *testing.T, query string) {
		req := httptest.NewRequest("GET", "/ledger", nil)
		req.URL.RawQuery = query
		rec := httptest.NewRecorder()
		sim.ServeHTTP(rec, req)
		switch rec.Code {
		case http.StatusOK:
			var e paysim.Entries
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Charges == nil || e.Declines == nil || len(e.Charges) > 3 {
				t.Fatalf("?%s: %s (%v)", query, rec.Body, err)
			}
		case http.StatusBadRequest:
			if !strings.Contains(rec.Body.String(), `"code":"INVALID_PAGE"`) {
				t.Fatalf("?%s: 400 %s", query, rec.Body)
			}
		default:
			t.Fatalf("?%s: %d %s", query, rec.Code, rec.Body)
		}
	})
}
