package idemfiber_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gofiber/fiber/v3"
	"github.com/gofiber/fiber/v3/middleware/recover"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemfiber"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/adaptertest"
	"github.com/idemkit/idem/internal/failpoint"
	"github.com/idemkit/idem/internal/testbin"
	"github.com/idemkit/idem/internal/testdb"
)

const crashLease = 2 * time.Second

// TestCrashTakeover kills a real Fiber server process (this test binary as
// TestCrashChild) with SIGKILL between the handler's write and the stored
// response (failpoint HTTPHandlerDone), restarts it and retries the key:
//
//   - two-step: the claim outlives the process; retries get 409 in
//     progress until its lease runs out, then one retry takes the key over
//     (exactly one takeover event) and runs the handler again (two
//     effects); every later retry replays that answer;
//   - transactional: the write died with the process's transaction; the
//     retry runs at once and the effect exists once.
func TestCrashTakeover(t *testing.T) {
	t.Parallel()
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
			first := startChild(t, db.URL, tt.mode, failpoint.HTTPHandlerDone+"=kill")
			if r, err := crashPost(t.Context(), first.addr); err == nil {
				t.Fatalf("the armed child answered %+v instead of dying", r)
			}
			<-first.exited
			second := startChild(t, db.URL, tt.mode, "")
			var got reply
			deadline := time.Now().Add(30 * time.Second)
			for {
				r, err := crashPost(t.Context(), second.addr)
				if err != nil {
					t.Fatal(err)
				}
				if r.status != http.StatusConflict {
					got = r
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the key stayed in progress for 30s")
				}
				time.Sleep(50 * time.Millisecond) // poll the lease's end
			}
			if got.status != http.StatusCreated || got.replayed {
				t.Fatalf("retry after the restart: %+v, want a fresh 201", got)
			}
			// Whether a retry met the dead claim in progress depends on how
			// long the restart took against the lease (a loaded machine
			// restarts in more than crashLease): the takeover event below
			// is what proves the claim outlived the process.
			var n int
			if err := db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM crash_effect").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != tt.effects {
				t.Fatalf("%d effects, want %d", n, tt.effects)
			}
			for range 3 {
				again, err := crashPost(t.Context(), second.addr)
				if err != nil || again.status != got.status || again.body != got.body || !again.replayed {
					t.Fatalf("later retry: %+v, %v; want the replay of %q", again, err, got.body)
				}
			}
			if c := strings.Count(second.stderr.String(), "event takeover"); (c == 1) != tt.takeover || c > 1 {
				t.Fatalf("%d takeover events, want takeover=%v\nstderr:\n%s", c, tt.takeover, second.stderr.String())
			}
		})
	}
}

type reply struct {
	status   int
	body     string
	replayed bool
	retry    string
}

type child struct {
	addr   string
	cmd    *exec.Cmd
	stderr *testbin.Buffer
	exited chan struct{}
}

func startChild(t *testing.T, dbURL string, mode idempotency.Mode, failpoints string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), "IDEMFIBER_CHILD_DB="+dbURL, "IDEMFIBER_CHILD_MODE="+mode.String(), failpoint.EnvVar+"="+failpoints)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, stderr: &testbin.Buffer{}, exited: make(chan struct{})}
	cmd.Stderr = c.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "listening "); ok {
				addr <- a
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		_ = cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-c.exited })
	select {
	case c.addr = <-addr:
	case <-c.exited:
		t.Fatalf("the child exited before listening\nstderr:\n%s", c.stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("the child did not listen within 30s\nstderr:\n%s", c.stderr.String())
	}
	return c
}

func crashPost(ctx context.Context, addr string) (reply, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/effects", strings.NewReader(`{"n":1}`))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer alice")
	req.Header.Set(idem.HeaderKey, "crash-key")
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, err
	}
	return reply{resp.StatusCode, string(b), resp.Header.Get(idem.HeaderReplayed) == "true", resp.Header.Get("Retry-After")}, nil
}

// TestCrashChild is the Fiber server of TestCrashTakeover; without
// IDEMFIBER_CHILD_DB it does nothing. POST /effects writes one row of
// crash_effect and answers 201; the middleware's events go to stderr.
func TestCrashChild(t *testing.T) {
	dbURL := os.Getenv("IDEMFIBER_CHILD_DB")
	if dbURL == "" {
		return
	}
	mode := idempotency.ModeTwoStep
	if os.Getenv("IDEMFIBER_CHILD_MODE") == idempotency.ModeTransactional.String() {
		mode = idempotency.ModeTransactional
	}
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	mw, err := idempotency.New(idempotency.NewPostgresStore(pool), &idempotency.Config{
		Scope: adaptertest.Principal,
		Mode:  mode,
		Lease: crashLease,
		Hook: func(ctx context.Context, e idempotency.Event) context.Context {
			fmt.Fprintf(os.Stderr, "event %s %d\n", e.Kind, e.Status)
			return ctx
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	guard, err := idemfiber.New(mw, &idemfiber.Config{Scope: principal})
	if err != nil {
		t.Fatal(err)
	}
	app := fiber.New()
	app.Post("/effects", recover.New(), guard, func(c fiber.Ctx) error {
		const insert = "INSERT INTO crash_effect DEFAULT VALUES RETURNING id"
		var id int64
		var err error
		if tx, ok := idemfiber.Tx(c); ok {
			err = tx.QueryRow(c.Context(), insert).Scan(&id)
		} else {
			err = pool.QueryRow(c.Context(), insert).Scan(&id)
		}
		if err != nil {
			return c.Status(http.StatusInternalServerError).SendString(err.Error())
		}
		return c.Status(http.StatusCreated).JSON(fiber.Map{"effect": id})
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("listening %s\n", ln.Addr())
	_ = app.Listener(ln, fiber.ListenConfig{DisableStartupMessage: true})
}
