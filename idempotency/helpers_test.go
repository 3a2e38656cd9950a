package idempotency_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/problem"
	"github.com/idemkit/idem/internal/testdb"
)

// storeCase builds one fresh store of a kind; pool is nil for memory.
type storeCase struct {
	name string
	new  func(t *testing.T) (idempotency.Store, *pgxpool.Pool)
}

var storeCases = []storeCase{
	{"memory", func(t *testing.T) (idempotency.Store, *pgxpool.Pool) {
		return idempotency.NewMemoryStore(), nil
	}},
	{"postgres", func(t *testing.T) (idempotency.Store, *pgxpool.Pool) {
		db := testdb.New(t, testdb.MaxConns(16))
		return idempotency.NewPostgresStore(db.Pool), db.Pool
	}},
}

// modeCase is a store kind plus a middleware mode.
type modeCase struct {
	name  string
	store storeCase
	mode  idempotency.Mode
}

var modeCases = []modeCase{
	{"memory/two-step", storeCases[0], idempotency.ModeTwoStep},
	{"postgres/two-step", storeCases[1], idempotency.ModeTwoStep},
	{"postgres/transactional", storeCases[1], idempotency.ModeTransactional},
}

// principal is the test Scope: the X-User header.
func principal(r *http.Request) (string, error) {
	if u := r.Header.Get("X-User"); u != "" {
		return u, nil
	}
	return "", errNoUser
}

type testErr string

func (e testErr) Error() string { return string(e) }

const errNoUser = testErr("no user")

// events records hook events.
type events struct {
	mu sync.Mutex
	ev []idempotency.Event
}

func (e *events) hook(ctx context.Context, ev idempotency.Event) context.Context {
	e.mu.Lock()
	e.ev = append(e.ev, ev)
	e.mu.Unlock()
	return ctx
}

// fence is the fence of the last event of kind k.
func (e *events) fence(k idempotency.EventKind) int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i := len(e.ev) - 1; i >= 0; i-- {
		if e.ev[i].Kind == k {
			return e.ev[i].Fence
		}
	}
	return 0
}

func (e *events) count(k idempotency.EventKind) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, ev := range e.ev {
		if ev.Kind == k {
			n++
		}
	}
	return n
}

func newMW(t *testing.T, store idempotency.Store, cfg idempotency.Config) *idempotency.Middleware {
	t.Helper()
	if cfg.Scope == nil {
		cfg.Scope = principal
	}
	mw, err := idempotency.New(store, &cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return mw
}

func post(path, user, key, body string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	if user != "" {
		r.Header.Set("X-User", user)
	}
	if key != "" {
		r.Header.Set(idem.HeaderKey, key)
	}
	return r
}

func do(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func problemCode(t *testing.T, w *httptest.ResponseRecorder) string {
	t.Helper()
	if ct := w.Header().Get("Content-Type"); ct != idem.ProblemContentType {
		t.Fatalf("Content-Type = %q, want problem+json (status %d, body %s)", ct, w.Code, w.Body)
	}
	var p problem.Details
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body: %v", err)
	}
	if p.Type == "" || p.Title == "" || p.Status != w.Code || p.Code == "" {
		t.Fatalf("incomplete problem %+v (status %d)", p, w.Code)
	}
	return p.Code
}

// eventually polls f until it returns true or the deadline passes.
func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond) // polling interval, not a wait for an event
	}
}
