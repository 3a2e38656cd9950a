package redisstore_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/testdb"
)

// BenchmarkMiddleware: the two-step middleware over this store and over
// PostgresStore (the baseline), in the same run, 32 concurrent callers,
// in process (no HTTP transport), a handler that does nothing else.
// fresh: a new key per request (claim + completion); replay: repeats of
// 1000 completed keys, with the in-process replay cache off so that every
// replay reads the store.
//
//	go test -run '^$' -bench Middleware -benchtime 3s ./redisstore
func BenchmarkMiddleware(b *testing.B) {
	stores := []struct {
		name string
		new  func(b *testing.B) idempotency.Store
	}{
		{"postgres", func(b *testing.B) idempotency.Store {
			return idempotency.NewPostgresStore(testdb.New(b, testdb.MaxConns(32)).Pool)
		}},
		{"redis", func(b *testing.B) idempotency.Store { return newSetup(b, nil).store }},
	}
	for _, st := range stores {
		for _, replay := range []bool{false, true} {
			name := st.name + "/fresh"
			if replay {
				name = st.name + "/replay"
			}
			b.Run(name, func(b *testing.B) {
				store := st.new(b)
				mw, err := idempotency.New(store, &idempotency.Config{
					Scope:            func(*http.Request) (string, error) { return "bench", nil },
					ReplayCacheBytes: -1,
				})
				if err != nil {
					b.Fatal(err)
				}
				h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusCreated)
					_, _ = w.Write([]byte(`{"id":1,"status":"NEW"}`))
				}))
				const body = `{"amount_kopecks":1000,"customer_id":"c1","note":"bench"}`
				post := func(key string) int {
					r := httptest.NewRequest(http.MethodPost, "/rows", strings.NewReader(body))
					r.Header.Set("Content-Type", "application/json")
					r.Header.Set("Idempotency-Key", key)
					w := httptest.NewRecorder()
					h.ServeHTTP(w, r)
					return w.Code
				}
				run := strconv.FormatInt(int64(b.N), 36) + "-" + name
				const keys = 1000
				if replay {
					for i := range keys {
						if c := post(run + strconv.Itoa(i)); c != http.StatusCreated {
							b.Fatalf("prepare: %d", c)
						}
					}
				}
				var seq atomic.Int64
				var failed atomic.Int64
				b.SetParallelism(16)
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						n := seq.Add(1)
						k := run + "-" + strconv.FormatInt(n, 10)
						if replay {
							k = run + strconv.FormatInt(n%keys, 10)
						}
						if post(k) != http.StatusCreated {
							failed.Add(1)
						}
					}
				})
				if n := failed.Load(); n > 0 {
					b.Fatalf("%d requests failed", n)
				}
			})
		}
	}
}
