package idemgrpc_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idem/idemgrpc"
	"github.com/idemkit/idem/idemgrpc/testsvc"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/failpoint"
	"github.com/idemkit/idem/internal/testbin"
	"github.com/idemkit/idem/internal/testdb"
)

const crashLease = 2 * time.Second

// TestCrashTakeover kills a real gRPC server process (this test binary as
// TestCrashChild) with SIGKILL between the handler's write and the stored
// outcome (failpoint HTTPHandlerDone, which the engine hits for gRPC
// calls too), restarts it and retries the key:
//
//   - two-step: the claim outlives the process; retries get Aborted in
//     progress until its lease runs out, then one retry takes the key
//     over (exactly one takeover event) and runs the handler again (two
//     effects); later retries replay that answer;
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
			if _, err := db.Pool.Exec(t.Context(), "CREATE TABLE effect (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY)"); err != nil {
				t.Fatal(err)
			}
			first := startChild(t, db.URL, tt.mode, failpoint.HTTPHandlerDone+"=kill")
			if a := crashCall(t, first.Addr); a.err == nil || status.Code(a.err) != codes.Unavailable {
				t.Fatalf("the armed child answered %s instead of dying", a)
			}
			<-first.Exited
			second := startChild(t, db.URL, tt.mode, "")
			var got answer
			deadline := time.Now().Add(30 * time.Second)
			for {
				got = crashCall(t, second.Addr)
				if status.Code(got.err) != codes.Aborted {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the key stayed in progress for 30s")
				}
				time.Sleep(50 * time.Millisecond) // poll the lease's end
			}
			if got.err != nil || got.replayed {
				t.Fatalf("retry after the restart: %s, want a fresh answer", got)
			}
			var n int
			if err := db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM effect").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != tt.effects {
				t.Fatalf("%d effects, want %d", n, tt.effects)
			}
			for range 3 {
				if again := crashCall(t, second.Addr); again.err != nil || !again.replayed || again.id() != got.id() {
					t.Fatalf("later retry: %s; want the replay of %s", again, got)
				}
			}
			if c := strings.Count(second.Stderr.String(), "event takeover"); (c == 1) != tt.takeover || c > 1 {
				t.Fatalf("%d takeover events, want takeover=%v\nstderr:\n%s", c, tt.takeover, second.Stderr.String())
			}
		})
	}
}

func crashCall(t *testing.T, addr string) answer {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	return call(ctx, conn, testsvc.MethodCharge, "crash-key", map[string]any{"n": 1.0})
}

func startChild(t *testing.T, dbURL string, mode idempotency.Mode, failpoints string) *testbin.Child {
	t.Helper()
	return testbin.StartChild(t, "TestCrashChild", "IDEMGRPC_CHILD_DB="+dbURL, "IDEMGRPC_CHILD_MODE="+mode.String(), failpoint.EnvVar+"="+failpoints)
}

// TestCrashChild is the gRPC server of TestCrashTakeover; without
// IDEMGRPC_CHILD_DB it does nothing. Charge writes one row of effect; the
// engine's events go to stderr.
func TestCrashChild(t *testing.T) {
	dbURL := os.Getenv("IDEMGRPC_CHILD_DB")
	if dbURL == "" {
		return
	}
	mode := idempotency.ModeTwoStep
	if os.Getenv("IDEMGRPC_CHILD_MODE") == idempotency.ModeTransactional.String() {
		mode = idempotency.ModeTransactional
	}
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ic, err := idemgrpc.New(idempotency.NewPostgresStore(pool), &idemgrpc.Config{
		Scope: principal,
		Idempotency: idempotency.Config{
			Mode:  mode,
			Lease: crashLease,
			Hook: func(ctx context.Context, e idempotency.Event) context.Context {
				fmt.Fprintf(os.Stderr, "event %s %d\n", e.Kind, e.Status)
				return ctx
			},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	svc := &testsvc.Service{Effect: func(ctx context.Context, _ string, _ *structpb.Struct) (int64, error) {
		const insert = "INSERT INTO effect DEFAULT VALUES RETURNING id"
		var id int64
		if tx, ok := idemgrpc.Tx(ctx); ok {
			return id, tx.QueryRow(ctx, insert).Scan(&id)
		}
		return id, pool.QueryRow(ctx, insert).Scan(&id)
	}}
	s := grpc.NewServer(grpc.ChainUnaryInterceptor(ic.Unary))
	testsvc.Register(s, svc)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("listening %s\n", ln.Addr())
	_ = s.Serve(ln)
}
