package idempotency_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempotency"
)

// BenchmarkMiddlewareOverhead is the middleware's own cost per request
// (parsing, fingerprint, recorder, replay) over MemoryStore, without I/O.
func BenchmarkMiddlewareOverhead(b *testing.B) {
	body := `{"amount_kopecks":1000,"customer_id":"c1","note":"bench"}`
	mw, err := idempotency.New(idempotency.NewMemoryStore(), &idempotency.Config{Scope: principal})
	if err != nil {
		b.Fatal(err)
	}
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/rows/1")
		w.WriteHeader(201)
		w.Write([]byte(`{"id":1,"status":"NEW"}`))
	}))
	b.ReportAllocs()
	b.Run("first", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			r := httptest.NewRequest(http.MethodPost, "/rows", strings.NewReader(body))
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("X-User", "bench")
			r.Header.Set(idem.HeaderKey, "k"+strconv.Itoa(i))
			h.ServeHTTP(httptest.NewRecorder(), r)
		}
	})
	b.Run("replay", func(b *testing.B) {
		for b.Loop() {
			r := httptest.NewRequest(http.MethodPost, "/rows", strings.NewReader(body))
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("X-User", "bench")
			r.Header.Set(idem.HeaderKey, "k1")
			h.ServeHTTP(httptest.NewRecorder(), r)
		}
	})
}
