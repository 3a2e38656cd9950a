package idempotency_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempotency"
)

// TestFingerprintOptions: FingerprintFields narrows the body to chosen
// members; FingerprintHeaders adds headers.
func TestFingerprintOptions(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	h := newMW(t, idempotency.NewMemoryStore(), idempotency.Config{
		FingerprintFields:  []string{"amount"},
		FingerprintHeaders: []string{"X-Tenant"},
	}).Wrap(created(&runs))
	req := func(body, tenant string) *http.Request {
		r := post("/x", "alice", "k", body)
		r.Header.Set("X-Tenant", tenant)
		return r
	}
	do(h, req(`{"amount":1,"note":"a"}`, "t1"))
	if w := do(h, req(`{"note":"b","amount":1}`, "t1")); w.Header().Get(idem.HeaderReplayed) != "true" {
		t.Fatalf("other unfingerprinted field: %d %s, want a replay", w.Code, w.Body)
	}
	if w := do(h, req(`{"amount":2,"note":"a"}`, "t1")); w.Code != 409 || problemCode(t, w) != idem.CodeKeyReused {
		t.Fatalf("other amount: %d %s, want reused", w.Code, w.Body)
	}
	if w := do(h, req(`{"amount":1,"note":"a"}`, "t2")); w.Code != 409 || problemCode(t, w) != idem.CodeKeyReused {
		t.Fatalf("other header: %d %s, want reused", w.Code, w.Body)
	}
	if runs.Load() != 1 {
		t.Fatalf("runs %d", runs.Load())
	}
}

// TestResponseController: the recording writer unwraps to the real one for
// deadlines, and swallows Flush, which would otherwise send a 200 header
// before the handler's real status.
func TestResponseController(t *testing.T) {
	t.Parallel()
	h := newMW(t, idempotency.NewMemoryStore(), idempotency.Config{}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if err := rc.SetWriteDeadline(time.Now().Add(time.Minute)); err != nil {
			t.Errorf("SetWriteDeadline through Unwrap: %v", err)
		}
		if err := rc.Flush(); err != nil { // must not send a 200 header now
			t.Errorf("Flush: %v", err)
		}
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte("done"))
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
	req.Header.Set("X-User", "alice")
	req.Header.Set(idem.HeaderKey, "k")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("status %d", resp.StatusCode)
	}
}
