package paysim

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
)

// TestLedgerBudgetCoversTheHeap: the ledger's byte estimate is what its
// keys really cost on the heap (the ledger, its indexes, the fault counters
// and the idempotency middleware's records), so that MaxLedgerBytes bounds
// the memory and not just a count. Short and long fields, one principal
// and many, charges, declines and faults: the heap grows by no more than
// the estimate, and the estimate is not wildly above it either.
//
// Not parallel: it measures the process's heap, so it runs before the
// package's parallel tests start.
func TestLedgerBudgetCoversTheHeap(t *testing.T) {
	for _, tt := range []struct {
		name       string
		field      int // bytes of each id and key
		principals int
		cfg        Config
	}{
		{"short ids, one principal", 8, 1, Config{}},
		{"long ids, one principal", 250, 1, Config{}},
		{"short ids, a principal per key", 8, 0, Config{}},
		{"declines and faults", 40, 10, Config{DeclineRate: 0.5, FailRate: 0.3, DropRate: 0.3}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sim, err := New(&tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			const n = 4000
			pad := strings.Repeat("x", tt.field)
			before := heap()
			for i := range n {
				id := fmt.Sprintf("%06d%s", i, pad)[:tt.field]
				body := fmt.Sprintf(`{"order_id":%q,"customer_id":%q,"amount_kopecks":1}`, id, id)
				r := httptest.NewRequest("POST", "/charges", strings.NewReader(body))
				r.Header.Set("Idempotency-Key", id)
				p := i % max(tt.principals, 1)
				if tt.principals == 0 {
					p = i
				}
				r.Header.Set("Authorization", fmt.Sprintf("Bearer %06d%s", p, pad))
				serveAborting(sim, r)
			}
			grown := heap() - before
			u := sim.Ledger().Usage()
			runtime.KeepAlive(sim)
			t.Logf("%d keys: heap %+d B (%d/key), estimate %d B (%d/key), ratio %.2f",
				u.Keys, grown, grown/int64(u.Keys), u.Bytes, u.Bytes/int64(u.Keys), float64(u.Bytes)/float64(grown))
			if u.Keys < n*6/10 {
				t.Fatalf("only %d of %d keys reached the ledger", u.Keys, n)
			}
			if grown > u.Bytes {
				t.Errorf("the heap grew by %d bytes, more than the %d the ledger counted", grown, u.Bytes)
			}
			if u.Bytes > 3*grown {
				t.Errorf("the ledger counted %d bytes, over 3 times the %d the heap grew: a budget that pessimistic wastes most of itself", u.Bytes, grown)
			}
		})
	}
}

// serveAborting serves r, absorbing the http.ErrAbortHandler panic of a
// dropped answer as net/http would.
func serveAborting(h http.Handler, r *http.Request) {
	defer func() {
		if v := recover(); v != nil && v != http.ErrAbortHandler {
			panic(v)
		}
	}()
	h.ServeHTTP(noResponse{}, r)
}

func heap() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// noResponse is a ResponseWriter that keeps nothing, so that only what
// the simulator keeps is measured. It cannot be hijacked: a drop fault
// aborts the handler instead (http.ErrAbortHandler), as over HTTP/2.
type noResponse struct{}

func (noResponse) Header() http.Header         { return http.Header{} }
func (noResponse) Write(p []byte) (int, error) { return len(p), nil }
func (noResponse) WriteHeader(int)             {}
