package idempotency_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempotency"
)

// bufHandler is a framework handler for Serve: it buffers what it writes.
type bufHandler struct {
	runs int
	resp idempotency.Response
	w    http.ResponseWriter
}

func (h *bufHandler) Run(ctx context.Context) {
	h.runs++
	p, _ := idempotency.PrincipalFromContext(ctx)
	h.resp = idempotency.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}, "X-Secret": {"x"}}, Body: []byte(`{"for":"` + p + `"}`)}
}

func (h *bufHandler) Response() (*idempotency.Response, bool) { return &h.resp, false }

func (h *bufHandler) Send() {
	h.w.Header().Set("Content-Type", h.resp.Header.Get("Content-Type"))
	h.w.WriteHeader(h.resp.Status)
	_, _ = h.w.Write(h.resp.Body)
}

// TestServe: the engine behind Wrap, for a request that is not an
// *http.Request: the handler runs once under a key, its response (the
// allow-listed headers only) is replayed with Idempotent-Replayed, another
// body is IDEMPOTENCY_KEY_REUSED, a request without a key is refused
// before the handler.
func TestServe(t *testing.T) {
	t.Parallel()
	mw, err := idempotency.New(idempotency.NewMemoryStore(), &idempotency.Config{
		Scope: func(*http.Request) (string, error) { panic("Serve must not call Config.Scope") },
	})
	if err != nil {
		t.Fatal(err)
	}
	h := &bufHandler{}
	serve := func(key, body string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.w = w
		hdr := http.Header{"Content-Type": {"application/json"}}
		if key != "" {
			hdr.Set(idem.HeaderKey, key)
		}
		mw.Serve(t.Context(), &idempotency.Request{
			Method: http.MethodPost, Route: "/orders/:id", Path: "/orders/1",
			Header: hdr.Values, Body: []byte(body),
			Scope: func() (string, error) { return "alice", nil },
		}, h, w)
		return w
	}
	first := serve("k1", `{"a":1}`)
	if first.Code != http.StatusCreated || first.Body.String() != `{"for":"alice"}` || first.Header().Get(idem.HeaderReplayed) != "" {
		t.Fatalf("first: %d %q %v", first.Code, first.Body, first.Header())
	}
	again := serve("k1", `{ "a": 1 }`) // the same JSON, another spelling
	if again.Code != http.StatusCreated || again.Body.String() != first.Body.String() || again.Header().Get(idem.HeaderReplayed) != "true" || again.Header().Get("X-Secret") != "" {
		t.Fatalf("replay: %d %q %v", again.Code, again.Body, again.Header())
	}
	if other := serve("k1", `{"a":2}`); other.Code != http.StatusConflict || !strings.Contains(other.Body.String(), idem.CodeKeyReused) {
		t.Fatalf("another body: %d %q", other.Code, other.Body)
	}
	if none := serve("", `{"a":1}`); none.Code != http.StatusBadRequest || !strings.Contains(none.Body.String(), idem.CodeKeyRequired) {
		t.Fatalf("no key: %d %q", none.Code, none.Body)
	}
	if h.runs != 1 {
		t.Fatalf("%d runs, want 1", h.runs)
	}
	if !mw.Guards(http.MethodPost) || mw.Guards(http.MethodGet) {
		t.Fatal("Guards: want POST guarded and GET not")
	}
}
