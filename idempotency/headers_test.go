package idempotency_test

import (
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/lifecycle"
)

// The Middleware is a lifecycle component with a hard stop, as is, with no
// adapter.
var (
	_ lifecycle.Component   = (*idempotency.Middleware)(nil)
	_ lifecycle.HardStopper = (*idempotency.Middleware)(nil)
)

// TestStoredHeadersAreText: an allow-listed response header whose value is
// not text PostgreSQL can store (a NUL, invalid UTF-8) is left out of the
// stored response; the response itself is stored and replayed. Before, the
// whole completion failed on the NUL (every retry ran the handler again)
// and invalid UTF-8 came back as U+FFFD, a value the handler never sent.
func TestStoredHeadersAreText(t *testing.T) {
	t.Parallel()
	for _, mode := range []idempotency.Mode{idempotency.ModeTwoStep, idempotency.ModeTransactional} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			var runs atomic.Int64
			ev := &events{}
			h := newMW(t, idempotency.NewPostgresStore(db.Pool), idempotency.Config{Mode: mode, Hook: ev.hook}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				w.Header()["Location"] = []string{"/orders/1\x00", "/orders/1"}
				w.Header().Set("Content-Language", "d\xffe")
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusCreated)
			}))
			do(h, post("/x", "alice", "k", `{}`))
			w := do(h, post("/x", "alice", "k", `{}`))
			if runs.Load() != 1 || w.Header().Get(idem.HeaderReplayed) != "true" || ev.count(idempotency.EventStoreError) != 0 {
				t.Fatalf("runs %d, replayed %q, %d store errors: the completion failed on the headers", runs.Load(), w.Header().Get(idem.HeaderReplayed), ev.count(idempotency.EventStoreError))
			}
			if got := w.Header().Values("Location"); len(got) != 1 || got[0] != "/orders/1" {
				t.Fatalf("replayed Location %q, want only the text value", got)
			}
			if got, ok := w.Header()["Content-Language"]; ok {
				t.Fatalf("replayed Content-Language %q, want it left out", got)
			}
			if w.Header().Get("Content-Type") != "application/json" {
				t.Fatalf("replayed Content-Type %q", w.Header().Get("Content-Type"))
			}
		})
	}
}
