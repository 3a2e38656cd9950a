package idemgin_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemgin"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/testdb"
)

var modes = []idempotency.Mode{idempotency.ModeTwoStep, idempotency.ModeTransactional}

func principal(r *http.Request) (string, error) {
	if a := r.Header.Get("Authorization"); a != "" {
		return a, nil
	}
	return "", errors.New("no credentials")
}

// app is one gin server behind idemgin over PostgreSQL. POST /charges and
// POST /orders/:id write one row of effect per execution (through the
// request's transaction in transactional mode) and answer 201 with its id;
// X-Fault answers 500 before the write; X-Panic panics after it and
// X-Fail-After-Write answers 503 after it.
type app struct {
	pool   *pgxpool.Pool
	engine *gin.Engine
	srv    *httptest.Server
	gate   idemtest.Gate
	// recoveryInside puts gin.Recovery after idemgin instead of before.
	recoveryInside bool
}

// setup builds the app; wrap, when given, decorates the PostgreSQL store.
func setup(t *testing.T, mode idempotency.Mode, recoveryInside bool, cfg *idempotency.Config, wrap ...func(*idempotency.PostgresStore) idempotency.Store) *app {
	t.Helper()
	db := testdb.New(t, testdb.MaxConns(16))
	if _, err := db.Pool.Exec(t.Context(), `CREATE TABLE effect (id bigserial PRIMARY KEY, principal text NOT NULL, body text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if cfg == nil {
		cfg = &idempotency.Config{}
	}
	cfg.Scope, cfg.Mode = principal, mode
	var store idempotency.Store = idempotency.NewPostgresStore(db.Pool)
	if len(wrap) > 0 {
		store = wrap[0](idempotency.NewPostgresStore(db.Pool))
	}
	mw, err := idempotency.New(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := &app{pool: db.Pool, recoveryInside: recoveryInside}
	e := gin.New()
	if !recoveryInside {
		e.Use(gin.RecoveryWithWriter(io.Discard))
	}
	e.Use(idemgin.New(mw))
	if recoveryInside {
		e.Use(gin.RecoveryWithWriter(io.Discard))
	}
	e.Use(func(c *gin.Context) {
		// The conformance suite's gate, as gin middleware.
		a.gate.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { c.Next() })).ServeHTTP(c.Writer, c.Request)
	})
	e.POST("/charges", a.effect)
	e.POST("/refunds", a.effect)
	e.POST("/orders/:id", a.effect)
	a.engine = e
	a.srv = httptest.NewServer(e)
	t.Cleanup(a.srv.Close)
	return a
}

func (a *app) effect(c *gin.Context) {
	if c.GetHeader("X-Fault") != "" {
		c.String(http.StatusInternalServerError, "injected fault")
		return
	}
	body, err := io.ReadAll(c.Request.Body)
	if err != nil {
		c.String(http.StatusBadRequest, err.Error())
		return
	}
	ctx := c.Request.Context()
	q := `INSERT INTO effect (principal, body) VALUES ($1, $2) RETURNING id`
	var id int64
	if tx, ok := idemgin.Tx(c); ok {
		err = tx.QueryRow(ctx, q, c.GetHeader("Authorization"), string(body)).Scan(&id)
	} else {
		err = a.pool.QueryRow(ctx, q, c.GetHeader("Authorization"), string(body)).Scan(&id)
	}
	if err != nil {
		c.String(http.StatusInternalServerError, err.Error())
		return
	}
	if c.GetHeader("X-Panic") != "" {
		panic("injected panic")
	}
	if c.GetHeader("X-Fail-After-Write") != "" {
		c.String(http.StatusServiceUnavailable, "failed after the write")
		return
	}
	if c.GetHeader("X-No-Store") != "" {
		idemgin.DoNotStore(c)
	}
	c.Header("Location", fmt.Sprintf("/effects/%d", id))
	c.JSON(http.StatusCreated, gin.H{"id": id})
}

func (a *app) rows(t *testing.T) int {
	t.Helper()
	var n int
	if err := a.pool.QueryRow(context.Background(), `SELECT count(*) FROM effect`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

type reply struct {
	status   int
	body     string
	replayed bool
	retry    string
}

func (a *app) post(t *testing.T, path, key, body string, hdr ...string) reply {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, a.srv.URL+path, strings.NewReader(body))
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
	resp, err := a.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, string(b), resp.Header.Get(idem.HeaderReplayed) == "true", resp.Header.Get("Retry-After")}
}

// TestConformance runs idemtest's whole suite against a gin server, in
// both modes, with gin.Recovery on either side of idemgin; the count of
// executions is read back from PostgreSQL.
func TestConformance(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		for _, inside := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/recovery-inside=%v", mode, inside), func(t *testing.T) {
				t.Parallel()
				const retention = 2e9
				a := setup(t, mode, inside, &idempotency.Config{Retention: retention, Lease: retention / 2})
				idemtest.Check(t, idemtest.Target{
					URL:         a.srv.URL + "/charges",
					AltURL:      a.srv.URL + "/refunds",
					Body:        []byte(`{"order_id":"o-1","customer_id":"c-1","amount_kopecks":1000}`),
					Header:      http.Header{"Authorization": {"Bearer alice"}},
					PrincipalB:  http.Header{"Authorization": {"Bearer bob"}},
					Count:       func(ctx context.Context) (int64, error) { return int64(a.rows(t)), nil },
					Hold:        a.gate.Hold,
					FaultHeader: http.Header{"X-Fault": {"1"}},
					TTL:         retention,
				})
			})
		}
	}
}

// TestRace sends 50 requests with one key at once: the handler runs once,
// every answer is the one response (replayed) or in progress.
func TestRace(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			a := setup(t, mode, false, nil)
			release := a.gate.Hold()
			defer release()
			const n = 50
			answers := make(chan reply, n)
			for range n {
				go func() { answers <- a.post(t, "/charges", "race-key", `{"n":1}`) }()
			}
			// The owner is held at the gate: the other 49 are answered
			// while it waits, then it is let through.
			var replies []reply
			for len(replies) < n-1 {
				replies = append(replies, <-answers)
			}
			release()
			replies = append(replies, <-answers)
			created, inProgress := 0, 0
			for _, r := range replies {
				switch {
				case r.status == http.StatusCreated && !r.replayed:
					created++
				case r.status == http.StatusConflict && strings.Contains(r.body, idem.CodeKeyInProgress) && r.retry != "":
					inProgress++
				default:
					t.Errorf("unexpected answer %+v", r)
				}
			}
			if created != 1 || created+inProgress != n {
				t.Fatalf("%d created, %d in progress; want 1 and %d", created, inProgress, n-1)
			}
			if got := a.rows(t); got != 1 {
				t.Fatalf("%d executions, want 1", got)
			}
			if r := a.post(t, "/charges", "race-key", `{"n":1}`); r.status != http.StatusCreated || !r.replayed {
				t.Fatalf("after the race: %+v, want the replay", r)
			}
		})
	}
}
