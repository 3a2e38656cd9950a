// Package adaptertest is the behaviour suite every framework adapter of
// the idempotency middleware (idemgin, idemecho, idemfiber) passes: idemtest's
// conformance suite in both modes, 50 requests racing on one key, the
// route template as the scope, release and rollback on a panic, a 5xx and
// DoNotStore, and wait mode. It talks to the adapter's server through
// net/http clients only, against a URL, and counts executions in
// PostgreSQL.
//
// An adapter's test supplies a Build that serves, behind the adapter over
// the given Middleware, the App contract below; the suite does the rest:
//
//	adaptertest.Run(t, func(t *testing.T, a *adaptertest.App, mw *idempotency.Middleware) string {
//		... serve a.Effect's contract behind the adapter, return the base URL
//	})
package adaptertest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/testdb"
)

// Modes are both modes, which every check runs in.
var Modes = []idempotency.Mode{idempotency.ModeTwoStep, idempotency.ModeTransactional}

// Principal is the Config.Scope of the suite: the Authorization header.
func Principal(r *http.Request) (string, error) {
	if a := r.Header.Get("Authorization"); a != "" {
		return a, nil
	}
	return "", errors.New("no credentials")
}

// EffectSQL writes one execution's row; $1 is the Authorization header,
// $2 the body. It returns the row's id.
const EffectSQL = `INSERT INTO effect (principal, body) VALUES ($1, $2) RETURNING id`

// App is one adapter's server for one check. Build must serve, behind the
// adapter over mw:
//
//   - POST /charges, POST /refunds and POST /orders/:id (a route
//     template): EffectSQL through the request's transaction in
//     transactional mode (else through Pool), then 201 with
//     Location: /effects/<id> and a JSON body holding the id;
//   - X-Bad: a definitive refusal, 422 with "refused" in its body, before
//     the write, returned as the framework's own error value where it has
//     one (*echo.HTTPError, *fiber.Error): that error's response is stored;
//   - X-Fault: 500 before the write; X-Panic: a panic after it;
//     X-Fail-After-Write: 503 after it; X-No-Store: DoNotStore, then the
//     201;
//   - Gate.Wait before the handler, inside the adapter (503 if it fails);
//   - the framework's recovery middleware after the adapter when
//     RecoveryInside, else before it.
type App struct {
	Pool           *pgxpool.Pool
	Gate           idemtest.Gate
	RecoveryInside bool
	URL            string
	client         *http.Client
}

// Build serves a's contract behind the adapter over mw and returns the
// server's base URL; it stops the server in t.Cleanup.
type Build func(t *testing.T, a *App, mw *idempotency.Middleware) string

// Setup builds one App: a schema of its own, the effect table, the
// middleware over PostgreSQL (wrap, when given, decorates the store).
func Setup(t *testing.T, build Build, mode idempotency.Mode, recoveryInside bool, cfg *idempotency.Config, wrap ...func(*idempotency.PostgresStore) idempotency.Store) *App {
	t.Helper()
	db := testdb.New(t, testdb.MaxConns(16))
	if _, err := db.Pool.Exec(t.Context(), `CREATE TABLE effect (id bigserial PRIMARY KEY, principal text NOT NULL, body text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if cfg == nil {
		cfg = &idempotency.Config{}
	}
	cfg.Scope, cfg.Mode = Principal, mode
	var store idempotency.Store = idempotency.NewPostgresStore(db.Pool)
	if len(wrap) > 0 {
		store = wrap[0](idempotency.NewPostgresStore(db.Pool))
	}
	mw, err := idempotency.New(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	a := &App{Pool: db.Pool, RecoveryInside: recoveryInside, client: &http.Client{Transport: tr}}
	a.URL = build(t, a, mw)
	t.Cleanup(tr.CloseIdleConnections)
	return a
}

// Rows is the number of executions: the effect table's rows.
func (a *App) Rows(t *testing.T) int {
	t.Helper()
	var n int
	if err := a.Pool.QueryRow(context.Background(), `SELECT count(*) FROM effect`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Reply is what a client saw.
type Reply struct {
	Status   int
	Body     string
	Replayed bool
	Retry    string
}

// Post sends one POST to path as alice, with the key (none if empty) and
// the header pairs hdr. It reports a transport failure with t.Error, so it
// may run on another goroutine.
func (a *App) Post(t *testing.T, path, key, body string, hdr ...string) Reply {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, a.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer alice")
	if key != "" {
		req.Header.Set(idem.HeaderKey, key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := a.client.Do(req)
	if err != nil {
		t.Error(err)
		return Reply{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return Reply{resp.StatusCode, string(b), resp.Header.Get(idem.HeaderReplayed) == "true", resp.Header.Get("Retry-After")}
}

// Run runs every check against the adapter that build serves, each as a
// parallel subtest.
func Run(t *testing.T, build Build) {
	t.Run("conformance", func(t *testing.T) { t.Parallel(); conformance(t, build) })
	t.Run("race", func(t *testing.T) { t.Parallel(); race(t, build) })
	t.Run("route-template", func(t *testing.T) { t.Parallel(); routeTemplate(t, build) })
	t.Run("release-rollback", func(t *testing.T) { t.Parallel(); releaseAndRollback(t, build) })
	t.Run("wait", func(t *testing.T) { t.Parallel(); wait(t, build) })
	t.Run("error-stored", func(t *testing.T) { t.Parallel(); errorStored(t, build) })
}

// errorStored: the framework's own error value for a 4xx (X-Bad) is
// answered by the framework's error handler inside the guarded chain, so
// its 422 is stored and replayed (an adapter that let the error out of
// the chain would store an empty 200).
func errorStored(t *testing.T, build Build) {
	for _, mode := range Modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			a := Setup(t, build, mode, false, nil)
			first := a.Post(t, "/charges", "k-error", `{"n":1}`, "X-Bad", "1")
			if first.Status != http.StatusUnprocessableEntity || first.Replayed || !strings.Contains(first.Body, "refused") {
				t.Fatalf("first: %+v, want the framework's 422", first)
			}
			again := a.Post(t, "/charges", "k-error", `{"n":1}`)
			if again.Status != http.StatusUnprocessableEntity || !again.Replayed || again.Body != first.Body {
				t.Fatalf("retry: %+v, want the replay of %+v", again, first)
			}
		})
	}
}

// conformance runs idemtest's whole suite, in both modes, with the
// recovery middleware on either side of the adapter; the count of
// executions is read back from PostgreSQL.
func conformance(t *testing.T, build Build) {
	for _, mode := range Modes {
		for _, inside := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/recovery-inside=%v", mode, inside), func(t *testing.T) {
				t.Parallel()
				const retention = 2 * time.Second
				a := Setup(t, build, mode, inside, &idempotency.Config{Retention: retention, Lease: retention / 2})
				idemtest.Check(t, idemtest.Target{
					URL:         a.URL + "/charges",
					AltURL:      a.URL + "/refunds",
					Body:        []byte(`{"order_id":"o-1","customer_id":"c-1","amount_kopecks":1000}`),
					Header:      http.Header{"Authorization": {"Bearer alice"}},
					PrincipalB:  http.Header{"Authorization": {"Bearer bob"}},
					Count:       func(ctx context.Context) (int64, error) { return int64(a.Rows(t)), nil },
					Hold:        a.Gate.Hold,
					FaultHeader: http.Header{"X-Fault": {"1"}},
					TTL:         retention,
				})
			})
		}
	}
}

// race sends 50 requests with one key at once: the handler runs once,
// every answer is the one response or in progress.
func race(t *testing.T, build Build) {
	for _, mode := range Modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			a := Setup(t, build, mode, false, nil)
			release := a.Gate.Hold()
			defer release()
			const n = 50
			answers := make(chan Reply, n)
			for range n {
				go func() { answers <- a.Post(t, "/charges", "race-key", `{"n":1}`) }()
			}
			// The owner is held at the gate: the other 49 are answered
			// while it waits, then it is let through.
			var replies []Reply
			for len(replies) < n-1 {
				replies = append(replies, <-answers)
			}
			release()
			replies = append(replies, <-answers)
			created, inProgress := 0, 0
			for _, r := range replies {
				switch {
				case r.Status == http.StatusCreated && !r.Replayed:
					created++
				case r.Status == http.StatusConflict && strings.Contains(r.Body, idem.CodeKeyInProgress) && r.Retry != "":
					inProgress++
				default:
					t.Errorf("unexpected answer %+v", r)
				}
			}
			if created != 1 || created+inProgress != n {
				t.Fatalf("%d created, %d in progress; want 1 and %d", created, inProgress, n-1)
			}
			if got := a.Rows(t); got != 1 {
				t.Fatalf("%d executions, want 1", got)
			}
			if r := a.Post(t, "/charges", "race-key", `{"n":1}`); r.Status != http.StatusCreated || !r.Replayed {
				t.Fatalf("after the race: %+v, want the replay", r)
			}
		})
	}
}

// routeTemplate: the route scope is the framework's route template, so one
// key on /orders/1 and then /orders/2 is the same operation sent twice
// with a different request (reused), while the same key on /charges is
// another operation. With the URL path as the route, /orders/2 would run.
func routeTemplate(t *testing.T, build Build) {
	a := Setup(t, build, idempotency.ModeTwoStep, false, nil)
	if r := a.Post(t, "/orders/1", "k-route", `{}`); r.Status != http.StatusCreated {
		t.Fatalf("/orders/1: %+v", r)
	}
	if r := a.Post(t, "/orders/2", "k-route", `{}`); r.Status != http.StatusConflict || !strings.Contains(r.Body, idem.CodeKeyReused) {
		t.Fatalf("/orders/2 with the key of /orders/1: %+v, want 409 %s", r, idem.CodeKeyReused)
	}
	if r := a.Post(t, "/charges", "k-route", `{}`); r.Status != http.StatusCreated || r.Replayed {
		t.Fatalf("/charges with the key of /orders/1: %+v, want its own 201", r)
	}
	if n := a.Rows(t); n != 2 {
		t.Fatalf("%d executions, want 2", n)
	}
}

// releaseAndRollback: a panic (with the recovery middleware before or
// after the adapter), a 5xx and DoNotStore release the key; in
// transactional mode the handler's write rolls back with it, so nothing of
// the failed run is stored. The retry runs the handler again and is then
// replayed.
func releaseAndRollback(t *testing.T, build Build) {
	for _, mode := range Modes {
		for _, inside := range []bool{false, true} {
			for _, fault := range []string{"X-Panic", "X-Fail-After-Write", "X-No-Store"} {
				t.Run(fmt.Sprintf("%s/recovery-inside=%v/%s", mode, inside, fault), func(t *testing.T) {
					t.Parallel()
					a := Setup(t, build, mode, inside, nil)
					first := a.Post(t, "/charges", "k-release", `{"n":1}`, fault, "1")
					want := http.StatusInternalServerError
					switch fault {
					case "X-Fail-After-Write":
						want = http.StatusServiceUnavailable
					case "X-No-Store":
						want = http.StatusCreated
					}
					if first.Status != want || first.Replayed {
						t.Fatalf("first: %+v, want %d", first, want)
					}
					// Two-step commits the write on its own; transactional
					// rolls it back with the claim, DoNotStore included.
					wantRows := 1
					if mode == idempotency.ModeTransactional {
						wantRows = 0
					}
					if n := a.Rows(t); n != wantRows {
						t.Fatalf("%d rows after the failed run, want %d", n, wantRows)
					}
					retry := a.Post(t, "/charges", "k-release", `{"n":1}`)
					if retry.Status != http.StatusCreated || retry.Replayed {
						t.Fatalf("retry: %+v, want a fresh 201", retry)
					}
					if n := a.Rows(t); n != wantRows+1 {
						t.Fatalf("%d rows after the retry, want %d", n, wantRows+1)
					}
					again := a.Post(t, "/charges", "k-release", `{"n":1}`)
					if again.Status != http.StatusCreated || !again.Replayed || again.Body != retry.Body {
						t.Fatalf("second retry: %+v, want the replay of %q", again, retry.Body)
					}
				})
			}
		}
	}
}

// wait: with Config.Wait a duplicate waits for the first request and gets
// its response replayed instead of 409.
func wait(t *testing.T, build Build) {
	for _, mode := range Modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			claims := make(chan idempotency.Outcome, 16)
			a := Setup(t, build, mode, false, &idempotency.Config{Wait: 20 * time.Second}, func(s *idempotency.PostgresStore) idempotency.Store {
				return &watchedStore{PostgresStore: s, outcomes: claims}
			})
			release := a.Gate.Hold()
			defer release()
			first := make(chan Reply, 1)
			go func() { first <- a.Post(t, "/charges", "k-wait", `{"n":1}`) }()
			if o := <-claims; o != idempotency.OutcomeClaimed {
				t.Fatalf("the first claim: %s", o)
			}
			second := make(chan Reply, 1)
			go func() { second <- a.Post(t, "/charges", "k-wait", `{"n":1}`) }()
			// The duplicate met the held claim: without Wait it would
			// answer 409 now; with it, it polls until the first completes.
			if o := <-claims; o != idempotency.OutcomeInProgress {
				t.Fatalf("the duplicate's claim: %s", o)
			}
			release()
			f, s := <-first, <-second
			if f.Status != http.StatusCreated || s.Status != http.StatusCreated || !s.Replayed || s.Body != f.Body {
				t.Fatalf("first %+v, duplicate %+v: want the duplicate to replay the first", f, s)
			}
			if n := a.Rows(t); n != 1 {
				t.Fatalf("%d executions, want 1", n)
			}
		})
	}
}

// watchedStore is the PostgreSQL store reporting each claim's outcome.
type watchedStore struct {
	*idempotency.PostgresStore
	outcomes chan idempotency.Outcome
}

func (s *watchedStore) Claim(ctx context.Context, c idempotency.Claim) (idempotency.ClaimResult, error) {
	res, err := s.PostgresStore.Claim(ctx, c)
	if err == nil {
		s.note(res.Outcome)
	}
	return res, err
}

func (s *watchedStore) BeginClaim(ctx context.Context, c idempotency.Claim) (*idempotency.ClaimTx, idempotency.ClaimResult, error) {
	tx, res, err := s.PostgresStore.BeginClaim(ctx, c)
	if err == nil {
		s.note(res.Outcome)
	}
	return tx, res, err
}

// note keeps the first outcomes; later ones (the duplicate's polls) are
// dropped rather than block the store.
func (s *watchedStore) note(o idempotency.Outcome) {
	select {
	case s.outcomes <- o:
	default:
	}
}
