package idempotency_test

import (
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempotency"
)

// TestFingerprintCaseFolding: encoding/json matches member names to struct
// fields ignoring case, so two bodies whose names differ only in case can
// decode to different requests. Neither may get the other's replay.
func TestFingerprintCaseFolding(t *testing.T) {
	t.Parallel()
	t.Run("reordered case-folded duplicates are refused, not replayed", func(t *testing.T) {
		t.Parallel()
		var runs atomic.Int64
		h := newMW(t, idempotency.NewMemoryStore(), idempotency.Config{}).Wrap(created(&runs))
		// encoding/json: the last match wins, so these are amount 5 and
		// amount 100.
		w1 := do(h, post("/x", "alice", "k", `{"amount":100,"Amount":5}`))
		w2 := do(h, post("/x", "alice", "k", `{"Amount":5,"amount":100}`))
		if w2.Header().Get(idem.HeaderReplayed) == "true" {
			t.Fatalf("second body replayed the first's answer (%d %s): they decode differently", w2.Code, w2.Body)
		}
		if w1.Code != http.StatusBadRequest || problemCode(t, w1) != idem.CodeBodyAmbiguous || w2.Code != http.StatusBadRequest || problemCode(t, w2) != idem.CodeBodyAmbiguous {
			t.Fatalf("ambiguous bodies: %d %s then %d %s, want 400 %s each", w1.Code, w1.Body, w2.Code, w2.Body, idem.CodeBodyAmbiguous)
		}
		if runs.Load() != 0 {
			t.Fatalf("handler ran %d times on ambiguous bodies", runs.Load())
		}
	})
	t.Run("FingerprintFields match names as encoding/json does", func(t *testing.T) {
		t.Parallel()
		var runs atomic.Int64
		h := newMW(t, idempotency.NewMemoryStore(), idempotency.Config{FingerprintFields: []string{"amount"}}).Wrap(created(&runs))
		// A handler decoding into struct{ Amount int `json:"amount"` }
		// charges 1, then 2: the member counts although its case differs.
		do(h, post("/x", "alice", "k", `{"AMOUNT":1,"note":"a"}`))
		w := do(h, post("/x", "alice", "k", `{"AMOUNT":2,"note":"a"}`))
		if w.Code != http.StatusConflict || problemCode(t, w) != idem.CodeKeyReused {
			t.Fatalf("other AMOUNT under FingerprintFields [amount]: %d %s, want 409 %s", w.Code, w.Body, idem.CodeKeyReused)
		}
		if w := do(h, post("/x", "alice", "k", `{"note":"b","AMOUNT":1}`)); w.Header().Get(idem.HeaderReplayed) != "true" {
			t.Fatalf("same AMOUNT, other note: %d %s, want a replay", w.Code, w.Body)
		}
		if w := do(h, post("/x", "alice", "k2", `{"amount":1,"AMOUNT":2}`)); w.Code != http.StatusBadRequest {
			t.Fatalf("ambiguous fingerprinted member: %d %s, want 400", w.Code, w.Body)
		}
		if runs.Load() != 1 {
			t.Fatalf("runs %d, want 1", runs.Load())
		}
	})
}
