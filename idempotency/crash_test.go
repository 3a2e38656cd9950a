package idempotency_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/failpoint"
	"github.com/idemkit/idem/internal/testbin"
	"github.com/idemkit/idem/internal/testdb"
)

// crashLease is the child's lease: what a two-step takeover waits out.
const crashLease = 2 * time.Second

// TestCrashWindows kills a real server process (this test binary again, as
// TestCrashChild) with SIGKILL in each of the middleware's crash windows,
// armed by IDEM_FAILPOINTS, restarts it, and retries the request with the
// same key. What the retry gets is what the package doc promises:
//
//   - after the handler, before the store (HTTPHandlerDone), transactional:
//     the transaction died with the process; the retry runs the handler at
//     once and its effect exists once;
//   - the same, two-step: the claim stays until its lease runs out (409 in
//     progress meanwhile); then one retry takes over and runs the handler
//     again: its effect, committed outside the store, exists twice;
//   - after the store, before the answer (HTTPResponseStored), both modes:
//     the retry gets the stored response replayed, and the effect exists
//     once.
//
// The failpoints' error action is held to the same outcomes: at
// HTTPHandlerDone it stands for a store that fails the completion (two-step
// sends the handler's answer, unstored; transactional answers 503 and rolls
// back), at HTTPResponseStored for an answer lost after the store (503).
func TestCrashWindows(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		mode      idempotency.Mode
		point     string
		action    string
		first     int  // what the armed child answers: 0 when it dies
		replay    bool // the retry is a replay of the first run's answer
		effects   int  // handler effects that exist in the end
		inFlight  bool // the retry sees 409 in progress first
		takesOver bool
	}{
		{idempotency.ModeTransactional, failpoint.HTTPHandlerDone, "kill", 0, false, 1, false, false},
		{idempotency.ModeTwoStep, failpoint.HTTPHandlerDone, "kill", 0, false, 2, true, true},
		{idempotency.ModeTransactional, failpoint.HTTPResponseStored, "kill", 0, true, 1, false, false},
		{idempotency.ModeTwoStep, failpoint.HTTPResponseStored, "kill", 0, true, 1, false, false},
		{idempotency.ModeTransactional, failpoint.HTTPHandlerDone, "error", 503, false, 1, false, false},
		{idempotency.ModeTwoStep, failpoint.HTTPHandlerDone, "error", 201, false, 2, true, true},
		{idempotency.ModeTransactional, failpoint.HTTPResponseStored, "error", 503, true, 1, false, false},
		{idempotency.ModeTwoStep, failpoint.HTTPResponseStored, "error", 503, true, 1, false, false},
	} {
		t.Run(tt.mode.String()+"/"+tt.point+"="+tt.action, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			if _, err := db.Pool.Exec(context.Background(), "CREATE TABLE crash_effect (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY)"); err != nil {
				t.Fatal(err)
			}
			first := startCrashChild(t, db.URL, tt.mode, tt.point+"="+tt.action)
			resp, err := crashPost(t.Context(), first.addr)
			switch {
			case tt.first == 0 && err == nil:
				t.Fatalf("the armed child answered %d %s instead of dying", resp.status, resp.body)
			case tt.first != 0 && (err != nil || resp.status != tt.first || resp.replayed):
				t.Fatalf("the armed child answered %+v, %v; want %d", resp, err, tt.first)
			case tt.first == 0:
				if err := first.wait(); err == nil || !strings.Contains(err.Error(), "killed") {
					t.Fatalf("the armed child ended with %v, want killed by its failpoint\nstderr:\n%s", err, first.stderr.String())
				}
			default:
				first.kill()
			}
			if !strings.Contains(first.stderr.String(), "idem-failpoint: hit "+tt.point+" "+tt.action) {
				t.Fatalf("the child did not report the failpoint hit\nstderr:\n%s", first.stderr.String())
			}

			second := startCrashChild(t, db.URL, tt.mode, "")
			sawInProgress := false
			eventually(t, "the retry after the restart to be answered", func() bool {
				var err error
				resp, err = crashPost(t.Context(), second.addr)
				if err != nil {
					t.Fatalf("retry: %v", err)
				}
				if resp.status == http.StatusConflict && resp.code == idem.CodeKeyInProgress {
					sawInProgress = true
					return false
				}
				return true
			})
			if resp.status != http.StatusCreated || resp.replayed != tt.replay {
				t.Fatalf("retry after the restart: %d %s replayed=%v, want 201 replayed=%v", resp.status, resp.body, resp.replayed, tt.replay)
			}
			// In transactional mode the killed child's backend holds the
			// claim's row lock until PostgreSQL notices the dead connection
			// and rolls its transaction back: a retry in that moment is
			// answered "in progress", which is correct, and then goes through.
			// Two-step has no such window: its answer must be exactly as
			// documented.
			transientLock := tt.mode == idempotency.ModeTransactional && tt.point == failpoint.HTTPHandlerDone && tt.first == 0
			if sawInProgress != tt.inFlight && !(transientLock && sawInProgress) {
				t.Fatalf("the retry saw in progress: %v, want %v", sawInProgress, tt.inFlight)
			}
			if n := countRows(t, db.Pool, "crash_effect"); n != tt.effects {
				t.Fatalf("%d handler effects, want %d", n, tt.effects)
			}
			if tt.takesOver && !strings.Contains(second.stderr.String(), "event takeover") {
				t.Fatalf("the restarted child reported no takeover\nstderr:\n%s", second.stderr.String())
			}
			// And from now on the key replays what the retry got.
			again, err := crashPost(t.Context(), second.addr)
			if err != nil || again.status != resp.status || again.body != resp.body || !again.replayed {
				t.Fatalf("second retry: %+v, %v; want the replay of %q", again, err, resp.body)
			}
		})
	}
}

type crashChild struct {
	addr   string
	cmd    *exec.Cmd
	stderr *testbin.Buffer
	exited chan struct{}
	err    error // how it exited, once exited is closed
}

func (c *crashChild) wait() error {
	<-c.exited
	return c.err
}

// kill ends the child with SIGKILL and waits for it.
func (c *crashChild) kill() {
	_ = c.cmd.Process.Kill()
	<-c.exited
}

// startCrashChild runs TestCrashChild in a new process with failpoints
// armed (none if empty) and returns once it listens. The process is killed
// when the test ends, if it still runs.
func startCrashChild(t *testing.T, dbURL string, mode idempotency.Mode, failpoints string) *crashChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), "IDEM_CRASH_CHILD_DB="+dbURL, "IDEM_CRASH_CHILD_MODE="+mode.String(), failpoint.EnvVar+"="+failpoints)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &crashChild{cmd: cmd, stderr: &testbin.Buffer{}, exited: make(chan struct{})}
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
		c.err = cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(c.kill)
	select {
	case c.addr = <-addr:
	case <-time.After(30 * time.Second):
		t.Fatalf("the child did not listen within 30s\nstderr:\n%s", c.stderr.String())
	}
	return c
}

type crashResponse struct {
	status   int
	code     string
	body     string
	replayed bool
}

// crashPost sends the one request of TestCrashWindows: always the same key
// and body.
func crashPost(ctx context.Context, addr string) (crashResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/effects", strings.NewReader(`{"n":1}`))
	if err != nil {
		return crashResponse{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User", "alice")
	req.Header.Set(idem.HeaderKey, "crash-key")
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return crashResponse{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return crashResponse{}, err
	}
	r := crashResponse{status: resp.StatusCode, body: string(b), replayed: resp.Header.Get(idem.HeaderReplayed) == "true"}
	if resp.StatusCode >= 400 {
		if _, after, ok := strings.Cut(r.body, `"code":"`); ok {
			r.code, _, _ = strings.Cut(after, `"`)
		}
	}
	return r, nil
}

// TestCrashChild is the server process of TestCrashWindows; run by itself
// (no IDEM_CRASH_CHILD_DB) it has nothing to do. It serves POST /effects:
// the handler writes one row of crash_effect (through the request's
// transaction in transactional mode, else through the pool, committed at
// once) and answers 201 with its id. It reports the middleware's events on
// stderr and runs until it is killed.
func TestCrashChild(t *testing.T) {
	dbURL := os.Getenv("IDEM_CRASH_CHILD_DB")
	if dbURL == "" {
		return
	}
	mode := idempotency.ModeTwoStep
	if os.Getenv("IDEM_CRASH_CHILD_MODE") == idempotency.ModeTransactional.String() {
		mode = idempotency.ModeTransactional
	}
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	mw, err := idempotency.New(idempotency.NewPostgresStore(pool), &idempotency.Config{
		Scope: principal,
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
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		const insert = "INSERT INTO crash_effect DEFAULT VALUES RETURNING id"
		var id int64
		var err error
		if tx, ok := idempotency.TxFromContext(r.Context()); ok {
			err = tx.QueryRow(r.Context(), insert).Scan(&id)
		} else {
			err = pool.QueryRow(r.Context(), insert).Scan(&id)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"effect":%d}`, id)
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("listening %s\n", ln.Addr())
	err = (&http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}).Serve(ln)
	if !errors.Is(err, http.ErrServerClosed) {
		t.Fatal(err)
	}
}
