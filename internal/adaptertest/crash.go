package adaptertest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/failpoint"
	"github.com/idemkit/idem/internal/testbin"
	"github.com/idemkit/idem/internal/testdb"
)

// CrashLease is the lease of the crash child's middleware.
const CrashLease = 2 * time.Second

// The crash child's environment: its database and its mode.
const (
	crashDBEnv   = "IDEM_ADAPTERTEST_CRASH_DB"
	crashModeEnv = "IDEM_ADAPTERTEST_CRASH_MODE"
)

// Effect writes one row of crash_effect, through tx when the request has
// one (transactional mode), else through the pool, and returns its id.
type Effect func(ctx context.Context, tx pgx.Tx) (int64, error)

// CrashServe serves on ln, behind the adapter over mw, POST /effects: it
// calls effect with the request's transaction (nil when it has none) and
// answers 201 with a JSON body holding the id, or 500 with the error. It
// returns when ln is closed (never, for the crash child).
type CrashServe func(ln net.Listener, mw *idempotency.Middleware, effect Effect) error

// CrashTakeover kills a real server process of the adapter (the test
// binary itself, running the test TestCrashChild, which must call
// CrashChild) with SIGKILL between the handler's write and the stored
// response (failpoint HTTPHandlerDone), restarts it and retries the key:
//
//   - two-step: the claim outlives the process; retries get 409 in
//     progress until its lease runs out, then one retry takes the key over
//     (exactly one takeover event) and runs the handler again (two
//     effects); every later retry replays that answer;
//   - transactional: the write died with the process's transaction; the
//     retry runs at once and the effect exists once.
func CrashTakeover(t *testing.T) {
	for _, tt := range []struct {
		mode     idempotency.Mode
		effects  int
		takeover bool
	}{
		{idempotency.ModeTwoStep, 2, true},
		{idempotency.ModeTransactional, 1, false},
	} {
		t.Run(tt.mode.String(), func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			if _, err := db.Pool.Exec(t.Context(), "CREATE TABLE crash_effect (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY)"); err != nil {
				t.Fatal(err)
			}
			first := startCrashChild(t, db.URL, tt.mode, failpoint.HTTPHandlerDone+"=kill")
			if r, err := crashPost(t.Context(), first.Addr); err == nil {
				t.Fatalf("the armed child answered %+v instead of dying", r)
			}
			<-first.Exited
			second := startCrashChild(t, db.URL, tt.mode, "")
			var got Reply
			deadline := time.Now().Add(30 * time.Second)
			for {
				r, err := crashPost(t.Context(), second.Addr)
				if err != nil {
					t.Fatal(err)
				}
				if r.Status != http.StatusConflict {
					got = r
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the key stayed in progress for 30s")
				}
				time.Sleep(50 * time.Millisecond) // poll the lease's end
			}
			if got.Status != http.StatusCreated || got.Replayed {
				t.Fatalf("retry after the restart: %+v, want a fresh 201", got)
			}
			// Whether a retry met the dead claim in progress depends on how
			// long the restart took against the lease (a loaded machine
			// restarts in more than CrashLease): the takeover event below
			// is what proves the claim outlived the process.
			var n int
			if err := db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM crash_effect").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != tt.effects {
				t.Fatalf("%d effects, want %d", n, tt.effects)
			}
			for range 3 {
				again, err := crashPost(t.Context(), second.Addr)
				if err != nil || again.Status != got.Status || again.Body != got.Body || !again.Replayed {
					t.Fatalf("later retry: %+v, %v; want the replay of %q", again, err, got.Body)
				}
			}
			if c := strings.Count(second.Stderr.String(), "event takeover"); (c == 1) != tt.takeover || c > 1 {
				t.Fatalf("%d takeover events, want takeover=%v\nstderr:\n%s", c, tt.takeover, second.Stderr.String())
			}
		})
	}
}

// CrashChild is the body of the adapter's TestCrashChild: without the
// parent's environment it does nothing; with it, it serves through serve
// until it is killed, the middleware's events going to stderr.
func CrashChild(t *testing.T, serve CrashServe) {
	dbURL := os.Getenv(crashDBEnv)
	if dbURL == "" {
		return
	}
	mode := idempotency.ModeTwoStep
	if os.Getenv(crashModeEnv) == idempotency.ModeTransactional.String() {
		mode = idempotency.ModeTransactional
	}
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	mw, err := idempotency.New(idempotency.NewPostgresStore(pool), &idempotency.Config{
		Scope: Principal,
		Mode:  mode,
		Lease: CrashLease,
		Hook: func(ctx context.Context, e idempotency.Event) context.Context {
			fmt.Fprintf(os.Stderr, "event %s %d\n", e.Kind, e.Status)
			return ctx
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	effect := func(ctx context.Context, tx pgx.Tx) (int64, error) {
		const insert = "INSERT INTO crash_effect DEFAULT VALUES RETURNING id"
		var id int64
		if tx != nil {
			return id, tx.QueryRow(ctx, insert).Scan(&id)
		}
		return id, pool.QueryRow(ctx, insert).Scan(&id)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("listening %s\n", ln.Addr())
	_ = serve(ln, mw, effect)
}

func startCrashChild(t *testing.T, dbURL string, mode idempotency.Mode, failpoints string) *testbin.Child {
	t.Helper()
	return testbin.StartChild(t, "TestCrashChild", crashDBEnv+"="+dbURL, crashModeEnv+"="+mode.String(), failpoint.EnvVar+"="+failpoints)
}

func crashPost(ctx context.Context, addr string) (Reply, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/effects", strings.NewReader(`{"n":1}`))
	if err != nil {
		return Reply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer alice")
	req.Header.Set(idem.HeaderKey, "crash-key")
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return Reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return Reply{}, err
	}
	return Reply{Status: resp.StatusCode, Body: string(b), Replayed: resp.Header.Get(idem.HeaderReplayed) == "true", Retry: resp.Header.Get("Retry-After")}, nil
}
