package paysim_test

import (
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
