package idempotency_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempotency"
)

// created answers 201 with a Location, a JSON body, a cookie and a header
// that is not on the replay allow-list; it counts its runs.
func created(runs *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", n))
		w.Header().Set("Set-Cookie", "session=secret")
		w.Header().Set("X-Private", "p")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d,"echo":%q}`, n, body)
	})
}

// TestMiddleware runs one table of cases in every mode over every store.
func TestMiddleware(t *testing.T) {
	t.Parallel()
	testCases := []struct {
		name string
		// only limits the case to some modes (nil: all).
		only func(mc modeCase) bool
		run  func(t *testing.T, mc modeCase, s idempotency.Store, pool *pgxpool.Pool)
	}{
		{name: "replay of a 201 is byte-identical with the header added", run: func(t *testing.T, mc modeCase, s idempotency.Store, _ *pgxpool.Pool) {
			var runs atomic.Int64
			h := newMW(t, s, idempotency.Config{Mode: mc.mode}).Wrap(created(&runs))
			w1 := do(h, post("/orders", "alice", "k1", `{"total":1}`))
			w2 := do(h, post("/orders", "alice", "k1", `{ "total" : 1 }`))
			if runs.Load() != 1 {
				t.Fatalf("handler ran %d times", runs.Load())
			}
			if w1.Code != 201 || w2.Code != 201 || !bytes.Equal(w1.Body.Bytes(), w2.Body.Bytes()) {
				t.Fatalf("first %d %q, replay %d %q", w1.Code, w1.Body, w2.Code, w2.Body)
			}
			if w1.Header().Get(idem.HeaderReplayed) != "" || w2.Header().Get(idem.HeaderReplayed) != "true" {
				t.Fatalf("Idempotent-Replayed: first %q, replay %q", w1.Header().Get(idem.HeaderReplayed), w2.Header().Get(idem.HeaderReplayed))
			}
			for _, h := range []string{"Content-Type", "Location"} {
				if w1.Header().Get(h) != w2.Header().Get(h) {
					t.Fatalf("%s: first %q, replay %q", h, w1.Header().Get(h), w2.Header().Get(h))
				}
			}
			if w2.Header().Get("Set-Cookie") != "" || w2.Header().Get("X-Private") != "" {
				t.Fatalf("replay leaked headers: %v", w2.Header())
			}
		}},
		{name: "50 concurrent requests on one key: one handler run", run: func(t *testing.T, mc modeCase, s idempotency.Store, _ *pgxpool.Pool) {
			var runs atomic.Int64
			gate := make(chan struct{})
			h := newMW(t, s, idempotency.Config{Mode: mc.mode}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				<-gate // hold the key until every other request has been answered
				w.WriteHeader(http.StatusCreated)
			}))
			var wg sync.WaitGroup
			codes := make(chan int, 50)
			start := make(chan struct{})
			for range 50 {
				wg.Go(func() {
					<-start
					w := do(h, post("/orders", "alice", "same", `{}`))
					if w.Code == http.StatusConflict {
						if problemCode(t, w) != idem.CodeKeyInProgress || w.Header().Get("Retry-After") == "" {
							t.Errorf("409 without in-progress code or Retry-After: %v %s", w.Header(), w.Body)
						}
					}
					codes <- w.Code
				})
			}
			close(start)
			got := map[int]int{}
			for range 49 {
				got[<-codes]++
			}
			close(gate)
			wg.Wait()
			got[<-codes]++
			if runs.Load() != 1 || got[http.StatusCreated] != 1 || got[http.StatusConflict] != 49 {
				t.Fatalf("runs %d, status counts %v; want 1 run, 1×201, 49×409", runs.Load(), got)
			}
		}},
		{name: "two principals with the same key are independent", run: func(t *testing.T, mc modeCase, s idempotency.Store, _ *pgxpool.Pool) {
			var runs atomic.Int64
			h := newMW(t, s, idempotency.Config{Mode: mc.mode}).Wrap(created(&runs))
			wa := do(h, post("/orders", "alice", "k", `{}`))
			wb := do(h, post("/orders", "bob", "k", `{"other":true}`))
			wa2 := do(h, post("/orders", "alice", "k", `{}`))
			if runs.Load() != 2 || wa.Code != 201 || wb.Code != 201 || wb.Header().Get(idem.HeaderReplayed) != "" {
				t.Fatalf("runs %d; alice %d, bob %d %v", runs.Load(), wa.Code, wb.Code, wb.Header())
			}
			if wa2.Body.String() != wa.Body.String() || wa2.Body.String() == wb.Body.String() {
				t.Fatalf("alice replay %q, alice %q, bob %q", wa2.Body, wa.Body, wb.Body)
			}
		}},
		{name: "same key, different body: reused", run: func(t *testing.T, mc modeCase, s idempotency.Store, _ *pgxpool.Pool) {
			var runs atomic.Int64
			h := newMW(t, s, idempotency.Config{Mode: mc.mode}).Wrap(created(&runs))
			do(h, post("/orders", "alice", "k", `{"total":1}`))
			w := do(h, post("/orders", "alice", "k", `{"total":2}`))
			if w.Code != http.StatusConflict || problemCode(t, w) != idem.CodeKeyReused || runs.Load() != 1 {
				t.Fatalf("status %d body %s runs %d", w.Code, w.Body, runs.Load())
			}
			h422 := newMW(t, s, idempotency.Config{Mode: mc.mode, MismatchStatus: 422}).Wrap(created(&runs))
			if w := do(h422, post("/orders", "alice", "k", `{"total":3}`)); w.Code != 422 || problemCode(t, w) != idem.CodeKeyReused {
				t.Fatalf("422 config: %d %s", w.Code, w.Body)
			}
		}},
		{name: "mismatch wins over in progress", only: twoStep, run: func(t *testing.T, mc modeCase, s idempotency.Store, _ *pgxpool.Pool) {
			entered, gate := make(chan struct{}), make(chan struct{})
			h := newMW(t, s, idempotency.Config{Mode: mc.mode}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				close(entered)
				<-gate
				w.WriteHeader(201)
			}))
			done := make(chan int)
			go func() { done <- do(h, post("/orders", "alice", "k", `{"a":1}`)).Code }()
			<-entered
			same := do(h, post("/orders", "alice", "k", `{"a":1}`))
			other := do(h, post("/orders", "alice", "k", `{"a":2}`))
			close(gate)
			if c := <-done; c != 201 {
				t.Fatalf("first = %d", c)
			}
			if problemCode(t, same) != idem.CodeKeyInProgress {
				t.Fatalf("same body during first: %d %s", same.Code, same.Body)
			}
			if problemCode(t, other) != idem.CodeKeyReused {
				t.Fatalf("other body during first: %d %s", other.Code, other.Body)
			}
		}},
		{name: "5xx, 408 and 429 release the key; 4xx is stored", run: func(t *testing.T, mc modeCase, s idempotency.Store, _ *pgxpool.Pool) {
			for _, tt := range []struct {
				status int
				stored bool
			}{{500, false}, {503, false}, {408, false}, {429, false}, {400, true}, {404, true}, {200, true}} {
				var runs atomic.Int64
				ev := &events{}
				h := newMW(t, s, idempotency.Config{Mode: mc.mode, Hook: ev.hook}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					runs.Add(1)
					w.WriteHeader(tt.status)
				}))
				key := fmt.Sprint("k", tt.status)
				w1 := do(h, post("/x", "alice", key, `{}`))
				w2 := do(h, post("/x", "alice", key, `{}`))
				wantRuns := int64(2)
				if tt.stored {
					wantRuns = 1
				}
				if w1.Code != tt.status || w2.Code != tt.status || runs.Load() != wantRuns {
					t.Fatalf("status %d: got %d then %d, runs %d, want %d", tt.status, w1.Code, w2.Code, runs.Load(), wantRuns)
				}
				if !tt.stored && ev.count(idempotency.EventRelease) != 2 {
					t.Fatalf("status %d: %d release events", tt.status, ev.count(idempotency.EventRelease))
				}
			}
		}},
		{name: "panic releases the key and re-panics", run: func(t *testing.T, mc modeCase, s idempotency.Store, _ *pgxpool.Pool) {
			var runs atomic.Int64
			h := newMW(t, s, idempotency.Config{Mode: mc.mode}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if runs.Add(1) == 1 {
					panic("boom")
				}
				w.WriteHeader(201)
			}))
			func() {
				defer func() {
					if v := recover(); v != "boom" {
						t.Fatalf("recovered %v, want the handler's panic", v)
					}
				}()
				do(h, post("/x", "alice", "k", `{}`))
			}()
			if w := do(h, post("/x", "alice", "k", `{}`)); w.Code != 201 || runs.Load() != 2 {
				t.Fatalf("retry after panic: %d, runs %d", w.Code, runs.Load())
			}
		}},
		{name: "client hung up: released", run: func(t *testing.T, mc modeCase, s idempotency.Store, _ *pgxpool.Pool) {
			var runs atomic.Int64
			entered := make(chan struct{}, 1)
			h := newMW(t, s, idempotency.Config{Mode: mc.mode}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if runs.Add(1) == 1 {
					entered <- struct{}{}
					<-r.Context().Done() // the handler gives up with its client
					return
				}
				w.WriteHeader(201)
			}))
			srv := httptest.NewServer(h)
			defer srv.Close()
			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/x", strings.NewReader(`{}`))
			req.Header.Set("X-User", "alice")
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(idem.HeaderKey, "k")
			errc := make(chan error, 1)
			go func() {
				resp, err := srv.Client().Do(req)
				if err == nil {
					resp.Body.Close()
				}
				errc <- err
			}()
			<-entered
			cancel()
			if err := <-errc; !errors.Is(err, context.Canceled) {
				t.Fatalf("client error %v", err)
			}
			eventually(t, "retry to run the handler", func() bool {
				return do(h, post("/x", "alice", "k", `{}`)).Code == 201
			})
			if runs.Load() != 2 {
				t.Fatalf("runs %d, want 2", runs.Load())
			}
		}},
		{name: "request body over the cap: 413, handler not run", run: func(t *testing.T, mc modeCase, s idempotency.Store, _ *pgxpool.Pool) {
			var runs atomic.Int64
			h := newMW(t, s, idempotency.Config{Mode: mc.mode, MaxRequestBody: 16}).Wrap(created(&runs))
			w := do(h, post("/x", "alice", "k", strings.Repeat("x", 17)))
			if w.Code != 413 || problemCode(t, w) != idem.CodeBodyTooLarge || runs.Load() != 0 {
				t.Fatalf("%d %s runs %d", w.Code, w.Body, runs.Load())
			}
			r := post("/x", "alice", "k2", "")
			r.Body = io.NopCloser(strings.NewReader(strings.Repeat("y", 100))) // no Content-Length
			r.ContentLength = -1
			if w := do(h, r); w.Code != 413 {
				t.Fatalf("chunked over cap: %d", w.Code)
			}
			if w := do(h, post("/x", "alice", "k3", strings.Repeat("x", 16))); w.Code != 201 {
				t.Fatalf("at the cap: %d", w.Code)
			}
		}},
		{name: "response over the stored cap: delivered, replayed without body", run: func(t *testing.T, mc modeCase, s idempotency.Store, _ *pgxpool.Pool) {
			var runs atomic.Int64
			h := newMW(t, s, idempotency.Config{Mode: mc.mode, MaxResponseBody: 8}).Wrap(created(&runs))
			w1 := do(h, post("/x", "alice", "k", `{}`))
			w2 := do(h, post("/x", "alice", "k", `{}`))
			if w1.Code != 201 || w1.Body.Len() <= 8 || w2.Code != 201 || w2.Body.Len() != 0 || runs.Load() != 1 {
				t.Fatalf("first %d %q, replay %d %q, runs %d", w1.Code, w1.Body, w2.Code, w2.Body, runs.Load())
			}
		}},
		{name: "missing, invalid key and unknown principal: problems, handler not run", run: func(t *testing.T, mc modeCase, s idempotency.Store, _ *pgxpool.Pool) {
			var runs atomic.Int64
			h := newMW(t, s, idempotency.Config{Mode: mc.mode}).Wrap(created(&runs))
			if w := do(h, post("/x", "alice", "", `{}`)); w.Code != 400 || problemCode(t, w) != idem.CodeKeyRequired {
				t.Fatalf("no key: %d %s", w.Code, w.Body)
			}
			if w := do(h, post("/x", "alice", "bad key", `{}`)); w.Code != 400 || problemCode(t, w) != idem.CodeKeyInvalid {
				t.Fatalf("bad key: %d %s", w.Code, w.Body)
			}
			if w := do(h, post("/x", "alice", `"`+strings.Repeat("k", 256)+`"`, `{}`)); w.Code != 400 || problemCode(t, w) != idem.CodeKeyInvalid {
				t.Fatalf("long key: %d %s", w.Code, w.Body)
			}
			if w := do(h, post("/x", "", "k", `{}`)); w.Code != 401 || problemCode(t, w) != idem.CodeScopeUnknown {
				t.Fatalf("no principal: %d %s", w.Code, w.Body)
			}
			if w := do(h, post("/x", "alice", "secret-key-value", `{}`)); strings.Contains(w.Body.String(), "secret-key-value") {
				t.Fatal("key echoed")
			}
			if runs.Load() != 1 {
				t.Fatalf("runs %d", runs.Load())
			}
			g := httptest.NewRequest(http.MethodGet, "/x", nil)
			if w := do(h, g); w.Code != 201 || runs.Load() != 2 {
				t.Fatalf("GET not passed through: %d", w.Code)
			}
		}},
		{name: "wait mode: a concurrent request waits and gets the replay", run: func(t *testing.T, mc modeCase, s idempotency.Store, _ *pgxpool.Pool) {
			var runs atomic.Int64
			entered, gate := make(chan struct{}), make(chan struct{})
			h := newMW(t, s, idempotency.Config{Mode: mc.mode, Wait: time.Minute}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				close(entered)
				<-gate
				w.WriteHeader(201)
				io.WriteString(w, "first")
			}))
			first := make(chan *httptest.ResponseRecorder)
			go func() { first <- do(h, post("/x", "alice", "k", `{}`)) }()
			<-entered
			second := make(chan *httptest.ResponseRecorder)
			go func() { second <- do(h, post("/x", "alice", "k", `{}`)) }()
			close(gate)
			w1, w2 := <-first, <-second
			if w1.Code != 201 || w2.Code != 201 || w2.Body.String() != "first" || w2.Header().Get(idem.HeaderReplayed) != "true" || runs.Load() != 1 {
				t.Fatalf("first %d, second %d %q %v, runs %d", w1.Code, w2.Code, w2.Body, w2.Header(), runs.Load())
			}
		}},
		{name: "hooks see claim, replay, conflict, mismatch", run: func(t *testing.T, mc modeCase, s idempotency.Store, _ *pgxpool.Pool) {
			var runs atomic.Int64
			ev := &events{}
			h := newMW(t, s, idempotency.Config{Mode: mc.mode, Hook: ev.hook}).Wrap(created(&runs))
			do(h, post("/x", "alice", "k", `{}`))
			do(h, post("/x", "alice", "k", `{}`))
			do(h, post("/x", "alice", "k", `{"x":1}`))
			for k, n := range map[idempotency.EventKind]int{idempotency.EventClaim: 1, idempotency.EventComplete: 1, idempotency.EventReplay: 1, idempotency.EventMismatch: 1} {
				if ev.count(k) != n {
					t.Fatalf("%s events: %d, want %d (all: %+v)", k, ev.count(k), n, ev.ev)
				}
			}
		}},
	}
	for _, mc := range modeCases {
		for _, tt := range testCases {
			if tt.only != nil && !tt.only(mc) {
				continue
			}
			t.Run(mc.name+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				s, pool := mc.store.new(t)
				tt.run(t, mc, s, pool)
			})
		}
	}
}

func twoStep(mc modeCase) bool { return mc.mode == idempotency.ModeTwoStep }
