package idempotency_test

import (
	"bytes"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempotency"
)

// Hostile bodies: what a client that wants to burn the server's CPU or
// memory, or to confuse the fingerprint, sends. Each is built here, not
// stored, so that the sizes are exact.

// nested returns depth levels of {"a": around inner, 6 bytes a level.
func nested(depth int, inner string) string {
	return strings.Repeat(`{"a":`, depth) + inner + strings.Repeat("}", depth)
}

// nestedUnsorted returns depth levels whose members are out of order at
// every level, with filler beside each level: the worst case for a
// canonicaliser that reorders by copying subtrees.
func nestedUnsorted(depth int, inner, filler string) string {
	var b strings.Builder
	for range depth {
		b.WriteString(`{"z":"` + filler + `","a":`)
	}
	b.WriteString(inner)
	b.WriteString(strings.Repeat("}", depth))
	return b.String()
}

func manyKeys(n int) string {
	var b strings.Builder
	b.WriteByte('{')
	for i := n - 1; i >= 0; i-- { // reverse order: every member moves
		if i != n-1 {
			b.WriteByte(',')
		}
		b.WriteString(`"k` + strconv.Itoa(i) + `":` + strconv.Itoa(i))
	}
	b.WriteByte('}')
	return b.String()
}

func longString(n int) string { return `"` + strings.Repeat("x", n) + `"` }

// TestHostileBodies: every hostile body gets a clear answer: refused with a
// problem before the handler (too deep, ambiguous), or fingerprinted in
// time linear in its size and replayed only for the very same request.
func TestHostileBodies(t *testing.T) {
	t.Parallel()
	big := longString(981 << 10)
	refused := []struct {
		name, body, code string
	}{
		{"10,000 levels deep", nested(10000, "1"), "REQUEST_BODY_TOO_DEEP"},
		{"10,000 levels deep, 981 KB string at the bottom", nested(10000, longString(920<<10)), "REQUEST_BODY_TOO_DEEP"},
		{"10,000 levels of arrays", strings.Repeat("[", 10000) + strings.Repeat("]", 10000), "REQUEST_BODY_TOO_DEEP"},
		{"duplicate names", `{"amount":100,"amount":5}`, "REQUEST_BODY_AMBIGUOUS"},
		{"names equal ignoring case", `{"amount":100,"Amount":5}`, "REQUEST_BODY_AMBIGUOUS"},
		{"names equal ignoring case, nested", `{"order":{"id":"o-1","ID":"o-2"}}`, "REQUEST_BODY_AMBIGUOUS"},
		{"names equal under Unicode folding (Kelvin sign)", "{\"k\":1,\"\u212a\":2}", "REQUEST_BODY_AMBIGUOUS"},
		{"names equal under Unicode folding (long s)", "{\"S\":1,\"\u017f\":2}", "REQUEST_BODY_AMBIGUOUS"},
	}
	for _, tt := range refused {
		t.Run("refused/"+tt.name, func(t *testing.T) {
			t.Parallel()
			var runs atomic.Int64
			h := newMW(t, idempotency.NewMemoryStore(), idempotency.Config{MaxRequestBody: 2 << 20}).Wrap(created(&runs))
			w := do(h, post("/x", "alice", "k", tt.body))
			if w.Code != http.StatusBadRequest || problemCode(t, w) != tt.code || runs.Load() != 0 {
				t.Fatalf("%d %.200s, runs %d; want 400 %s before the handler", w.Code, w.Body, runs.Load(), tt.code)
			}
		})
	}

	accepted := []struct {
		name string
		// body and same fingerprint alike; other does not.
		body, same, other string
	}{
		{"64 levels deep, 981 KB string at the bottom", nested(64, big), " " + nested(64, big), nested(64, big[:len(big)-2]+`y"`)},
		{"64 unsorted levels", nestedUnsorted(64, big, "f"), nestedUnsorted(64, big, "f") + "\n", nestedUnsorted(64, big, "g")},
		{"many keys", manyKeys(50000), strings.Replace(manyKeys(50000), ",", " , ", -1), strings.Replace(manyKeys(50000), `"k7":7`, `"k7":8`, 1)},
		{"huge numbers", `{"n":1e999999999,"m":` + strings.Repeat("9", 100000) + `}`, `{"m":` + strings.Repeat("9", 100000) + `,"n":1e999999999}`, `{"n":1e999999999,"m":` + strings.Repeat("9", 99999) + `8}`},
		// Not equal under simple folding, nor for encoding/json.
		{"names that only full case mapping folds", "{\"i\":1,\"\u0130\":2}", "{\"\u0130\":2,\"i\":1}", "{\"i\":1,\"\u0130\":3}"},
		// encoding/json decodes both to U+FFFD: a canonical form would make
		// them one request. Not UTF-8 is not JSON: the raw bytes count.
		{"invalid UTF-8", "{\"a\":\"\xff\"}", "{\"a\":\"\xff\"}", "{\"a\":\"\xfe\"}"},
	}
	for _, tt := range accepted {
		t.Run("accepted/"+tt.name, func(t *testing.T) {
			t.Parallel()
			var runs atomic.Int64
			h := newMW(t, idempotency.NewMemoryStore(), idempotency.Config{MaxRequestBody: 2 << 20}).Wrap(created(&runs))
			w1 := do(h, post("/x", "alice", "k", tt.body))
			w2 := do(h, post("/x", "alice", "k", tt.same))
			w3 := do(h, post("/x", "alice", "k", tt.other))
			if w1.Code != 201 || w2.Code != 201 || w2.Header().Get(idem.HeaderReplayed) != "true" {
				t.Fatalf("first %d %.200s, same request %d replayed=%q", w1.Code, w1.Body, w2.Code, w2.Header().Get(idem.HeaderReplayed))
			}
			if w3.Code != 409 || problemCode(t, w3) != idem.CodeKeyReused || runs.Load() != 1 {
				t.Fatalf("other request %d %.200s, runs %d; want 409 %s and one run", w3.Code, w3.Body, runs.Load(), idem.CodeKeyReused)
			}
		})
	}
}

// TestCanonicalAllocLinear bounds the memory one canonicalisation takes by
// the body's size. It is not parallel: top-level tests that are not
// parallel run alone, so the process's allocation counter sees only this
// test.
func TestCanonicalAllocLinear(t *testing.T) {
	big := longString(900 << 10)
	for _, tt := range []struct{ name, body string }{
		{"64 levels, 900 KB string at the bottom", nested(64, big)},
		{"64 unsorted levels, filler at every level", nestedUnsorted(64, big, strings.Repeat("f", 1000))},
		{"10,000 levels", nested(10000, "1")},
		{"many keys", manyKeys(50000)},
		{"long string with escapes", `"` + strings.Repeat(`\u00e9\n`, 100000) + `"`},
	} {
		in := []byte(tt.body)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		_, _ = idempotency.CanonicalJSON(in)
		runtime.ReadMemStats(&after)
		alloc := after.TotalAlloc - before.TotalAlloc
		if limit := 16*uint64(len(in)) + 1<<20; alloc > limit {
			t.Errorf("%s: %d bytes allocated for a %d-byte body (%.1f per byte), want at most %d", tt.name, alloc, len(in), float64(alloc)/float64(len(in)), limit)
		}
		t.Logf("%s: %d bytes in, %d allocated (%.2f per byte)", tt.name, len(in), alloc, float64(alloc)/float64(len(in)))
	}
}

var _ = bytes.Equal
