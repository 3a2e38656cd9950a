package idempotency_test

import (
	"fmt"
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

// benchBodies are JSON bodies of about size bytes: flat (one object of
// many members, out of order) and deep (64 levels, the default limit, out
// of order at every level, the bulk spread over the levels).
func benchBodies(size int) map[string][]byte {
	var flat strings.Builder
	flat.WriteByte('{')
	for i := 0; flat.Len() < size; i++ {
		if i > 0 {
			flat.WriteByte(',')
		}
		fmt.Fprintf(&flat, `"k%d":"%s"`, (i*7919)%100003, strings.Repeat("v", 24))
	}
	flat.WriteByte('}')
	filler := strings.Repeat("f", max(1, size/64-16))
	return map[string][]byte{
		"flat": []byte(flat.String()),
		"deep": []byte(nestedUnsorted(64, `"end"`, filler)),
	}
}

// BenchmarkCanonicalJSON shows the canonical form's cost per byte for
// flat and deep bodies of 10 KB, 100 KB and 1 MB: linear means the ns/B
// column stays flat as the size grows tenfold. hostile are the bodies that
// were quadratic before (10,000 levels deep); they are refused now.
func BenchmarkCanonicalJSON(b *testing.B) {
	for _, size := range []int{10 << 10, 100 << 10, 1 << 20} {
		bodies := benchBodies(size)
		for _, shape := range []string{"flat", "deep"} {
			in := bodies[shape]
			b.Run(fmt.Sprintf("%s/%dKB", shape, size>>10), func(b *testing.B) {
				benchCanonical(b, in)
			})
		}
	}
	for name, in := range map[string][]byte{
		"hostile/10000-deep-60KB":  []byte(nested(10000, "1")),
		"hostile/10000-deep-981KB": []byte(nested(10000, longString(920<<10))),
	} {
		b.Run(name, func(b *testing.B) { benchCanonical(b, in) })
	}
}

func benchCanonical(b *testing.B, in []byte) {
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		_, _ = idempotency.CanonicalJSON(in)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(in)), "ns/B")
}
