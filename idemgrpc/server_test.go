package idemgrpc_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemgrpc"
	"github.com/idemkit/idem/idemgrpc/testsvc"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/testdb"
)

// TestCodeTable: each handler code is stored (the retry gets the same
// status, replayed, and nothing runs again) or released (the retry runs
// the handler again), in both modes, as DefaultStoreCode says. In
// ModeTransactional a released code rolls the handler's write back.
func TestCodeTable(t *testing.T) {
	t.Parallel()
	testCases := []struct {
		code   codes.Code
		stored bool
	}{
		{codes.OK, true},
		{codes.InvalidArgument, true},
		{codes.NotFound, true},
		{codes.AlreadyExists, true},
		{codes.PermissionDenied, true},
		{codes.FailedPrecondition, true},
		{codes.OutOfRange, true},
		{codes.Unimplemented, true},
		{codes.Canceled, false},
		{codes.Unknown, false},
		{codes.DeadlineExceeded, false},
		{codes.ResourceExhausted, false},
		{codes.Aborted, false},
		{codes.Internal, false},
		{codes.Unavailable, false},
		{codes.DataLoss, false},
		{codes.Unauthenticated, false},
	}
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, &idemgrpc.Config{Idempotency: idempotency.Config{Mode: mode}})
			for _, tt := range testCases {
				if got := idemgrpc.DefaultStoreCode(tt.code); got != tt.stored {
					t.Errorf("DefaultStoreCode(%s) = %v", tt.code, got)
				}
				key := "code-" + tt.code.String()
				req := map[string]any{"fail_code": float64(tt.code)}
				before := b.svc.Calls.Load()
				first := call(t.Context(), b.conn, testsvc.MethodCharge, key, req)
				second := call(t.Context(), b.conn, testsvc.MethodCharge, key, req)
				if status.Code(first.err) != tt.code || first.replayed {
					t.Errorf("%s first: %s", tt.code, first)
				}
				runs := b.svc.Calls.Load() - before
				switch {
				case tt.stored && (runs != 1 || !second.replayed || status.Code(second.err) != tt.code ||
					status.Convert(second.err).Message() != status.Convert(first.err).Message() || second.id() != first.id()):
					t.Errorf("%s stored: retry %s after %s, %d runs; want the replay, 1 run", tt.code, second, first, runs)
				case !tt.stored && (runs != 2 || second.replayed || status.Code(second.err) != tt.code):
					t.Errorf("%s released: retry %s, %d runs; want a fresh run, 2 runs", tt.code, second, runs)
				}
			}
			// Stored rows: OK and the stored errors in two-step mode, where
			// the effect is outside the transaction, every run's row; in
			// transactional mode only the runs that were stored commit.
			want := 0
			for _, tt := range testCases {
				switch {
				case mode == idempotency.ModeTwoStep && tt.stored:
					want++
				case mode == idempotency.ModeTwoStep:
					want += 2
				case tt.stored:
					want++
				}
			}
			if n := b.effects(t); n != want {
				t.Errorf("%d effect rows, want %d", n, want)
			}
		})
	}
}

// TestRace50: 50 calls race on one key; the handler runs once, every
// other call gets the replay or Aborted IDEMPOTENCY_KEY_IN_PROGRESS with
// a RetryInfo delay.
func TestRace50(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, &idemgrpc.Config{Idempotency: idempotency.Config{Mode: mode}})
			release := b.svc.Hold()
			const n = 50
			answers := make([]answer, n)
			var wg sync.WaitGroup
			var answered atomic.Int64
			for i := range n {
				wg.Go(func() {
					answers[i] = call(t.Context(), b.conn, testsvc.MethodCharge, "race", map[string]any{"amount_kopecks": 100.0})
					answered.Add(1)
				})
			}
			// The owner waits at the gate while the 49 others are answered
			// in progress at once (no Wait configured).
			deadline := time.Now().Add(30 * time.Second)
			for b.svc.Waiting() != 1 || answered.Load() != n-1 {
				if time.Now().After(deadline) {
					t.Fatalf("%d waiting, %d answered", b.svc.Waiting(), answered.Load())
				}
				time.Sleep(5 * time.Millisecond) // poll
			}
			release()
			wg.Wait()
			ok, inProgress := 0, 0
			var id float64
			for _, a := range answers {
				switch {
				case a.err == nil:
					if id != 0 && a.id() != id {
						t.Fatalf("two executions answered: %v and %v", id, a.id())
					}
					id = a.id()
					ok++
				case status.Code(a.err) == codes.Aborted:
					r, d := reason(a.err)
					if r != idem.CodeKeyInProgress || d < 1 {
						t.Errorf("aborted answer %s: reason %q, delay %v", a, r, d)
					}
					inProgress++
				default:
					t.Errorf("unexpected answer %s", a)
				}
			}
			if ok != 1 || inProgress != n-1 {
				t.Fatalf("%d ok, %d in progress", ok, inProgress)
			}
			if c, e := b.svc.Calls.Load(), b.effects(t); c != 1 || e != 1 {
				t.Fatalf("%d executions, %d effect rows; want 1 and 1", c, e)
			}
			again := call(t.Context(), b.conn, testsvc.MethodCharge, "race", map[string]any{"amount_kopecks": 100.0})
			if again.err != nil || !again.replayed || again.id() != id {
				t.Fatalf("after the race: %s, want the replay of id %v", again, id)
			}
		})
	}
}

// TestRollback: in ModeTransactional a released outcome (Internal, a
// panic) rolls the handler's write back and frees the key at once: the
// next call runs, and only its row exists.
func TestRollback(t *testing.T) {
	t.Parallel()
	b := setup(t, &idemgrpc.Config{Idempotency: idempotency.Config{Mode: idempotency.ModeTransactional}})
	for _, req := range []map[string]any{{"fail_code": float64(codes.Internal)}, {"panic": true}} {
		a := call(t.Context(), b.conn, testsvc.MethodCharge, "rollback", req)
		if status.Code(a.err) != codes.Internal {
			t.Fatalf("%v: %s, want Internal", req, a)
		}
		if n := b.effects(t); n != 0 {
			t.Fatalf("%v: %d effect rows after the rollback, want 0", req, n)
		}
		var records int
		if err := b.pool.QueryRow(t.Context(), "SELECT count(*) FROM idempotency_key").Scan(&records); err != nil {
			t.Fatal(err)
		}
		if records != 0 {
			t.Fatalf("%v: %d idempotency records after the rollback, want 0", req, records)
		}
	}
	// The key was never stored: the same key with another request runs.
	a := call(t.Context(), b.conn, testsvc.MethodCharge, "rollback", map[string]any{"panic": false})
	if a.err != nil || a.replayed || b.effects(t) != 1 {
		t.Fatalf("after the rollbacks: %s, %d rows", a, b.effects(t))
	}
}

// TestPolicy: required refuses a call without a key, optional runs it
// unguarded, off never guards (a key is ignored: two calls, two runs).
func TestPolicy(t *testing.T) {
	t.Parallel()
	b := setup(t, &idemgrpc.Config{Policy: func(m string) idemgrpc.Policy {
		if m == testsvc.MethodRefund {
			return idemgrpc.PolicyOff
		}
		return idemgrpc.PolicyRequired
	}})
	a := call(t.Context(), b.conn, testsvc.MethodCharge, "", map[string]any{})
	if r, _ := reason(a.err); status.Code(a.err) != codes.InvalidArgument || r != idem.CodeKeyRequired || b.svc.Calls.Load() != 0 {
		t.Fatalf("no key, required: %s (reason %q)", a, r)
	}
	for _, key := range []string{"", "off-key", "off-key"} {
		if a := call(t.Context(), b.conn, testsvc.MethodRefund, key, map[string]any{}); a.err != nil || a.replayed {
			t.Fatalf("off, key %q: %s", key, a)
		}
	}
	if c := b.svc.Calls.Load(); c != 3 {
		t.Fatalf("%d runs under PolicyOff, want 3", c)
	}
	opt := setup(t, &idemgrpc.Config{Policy: func(string) idemgrpc.Policy { return idemgrpc.PolicyOptional }})
	for i, key := range []string{"", "", "opt", "opt"} {
		a := call(t.Context(), opt.conn, testsvc.MethodCharge, key, map[string]any{})
		if a.err != nil || a.replayed != (i == 3) {
			t.Fatalf("optional, call %d key %q: %s", i, key, a)
		}
	}
	if c := opt.svc.Calls.Load(); c != 3 {
		t.Fatalf("%d runs under PolicyOptional, want 3 (two keyless, one guarded)", c)
	}
	if _, err := idemgrpc.New(nil, &idemgrpc.Config{}); err == nil {
		t.Fatal("New without Scope: no error")
	}
}

// TestMismatchAndInvalid: a key reused with another request is
// FailedPrecondition IDEMPOTENCY_KEY_REUSED; a key breaking the key rule
// is InvalidArgument IDEMPOTENCY_KEY_INVALID; neither runs the handler.
func TestMismatchAndInvalid(t *testing.T) {
	t.Parallel()
	b := setup(t, &idemgrpc.Config{})
	if a := call(t.Context(), b.conn, testsvc.MethodCharge, "mm", map[string]any{"amount_kopecks": 1.0}); a.err != nil {
		t.Fatal(a)
	}
	a := call(t.Context(), b.conn, testsvc.MethodCharge, "mm", map[string]any{"amount_kopecks": 2.0})
	if r, _ := reason(a.err); status.Code(a.err) != codes.FailedPrecondition || r != idem.CodeKeyReused {
		t.Fatalf("reused key: %s (reason %q)", a, r)
	}
	long := make([]byte, idem.MaxKeyLength+1)
	for i := range long {
		long[i] = 'k'
	}
	a = call(t.Context(), b.conn, testsvc.MethodCharge, string(long), map[string]any{})
	if r, _ := reason(a.err); status.Code(a.err) != codes.InvalidArgument || r != idem.CodeKeyInvalid {
		t.Fatalf("long key: %s (reason %q)", a, r)
	}
	if c := b.svc.Calls.Load(); c != 1 {
		t.Fatalf("%d runs, want 1", c)
	}
}

// TestRefusals: a call whose principal Scope cannot tell is
// Unauthenticated IDEMPOTENCY_SCOPE_UNKNOWN; a store that fails answers
// Unavailable IDEMPOTENCY_STORE_UNAVAILABLE with a RetryInfo, and the
// handler never runs unprotected.
func TestRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t, &idemgrpc.Config{Scope: func(ctx context.Context) (string, error) {
		if p, err := principal(ctx); err == nil && p != "nobody" {
			return p, nil
		}
		return "", errors.New("unknown principal")
	}})
	ctx := metadata.NewOutgoingContext(t.Context(), metadata.Pairs("authorization", "nobody", idemgrpc.MetadataKey, "k"))
	err := b.conn.Invoke(ctx, testsvc.MethodCharge, &structpb.Struct{}, &structpb.Struct{})
	if r, _ := reason(err); status.Code(err) != codes.Unauthenticated || r != idem.CodeScopeUnknown {
		t.Fatalf("unknown principal: %v (reason %q)", err, r)
	}

	db := testdb.New(t)
	pool, err := pgxpool.New(t.Context(), db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pool.Close() // every claim fails
	ic, err := idemgrpc.New(idempotency.NewPostgresStore(pool), &idemgrpc.Config{Scope: principal})
	if err != nil {
		t.Fatal(err)
	}
	svc := &testsvc.Service{}
	_, conn := serve(t, svc, grpc.ChainUnaryInterceptor(ic.Unary))
	a := call(t.Context(), conn, testsvc.MethodCharge, "k", map[string]any{})
	if r, d := reason(a.err); status.Code(a.err) != codes.Unavailable || r != idem.CodeStoreUnavailable || d < 1 || svc.Calls.Load() != 0 {
		t.Fatalf("failing store: %s (reason %q, delay %v, %d runs)", a, r, d, svc.Calls.Load())
	}
	if c := b.svc.Calls.Load(); c != 0 {
		t.Fatalf("%d runs, want 0", c)
	}
}

// TestRPCCodeIsGRPCs: idem.RPCCode's numbers are grpc-go's codes for the
// refusals the package doc's table names (idemconnect answers through the
// same function, Connect sharing these numbers).
func TestRPCCodeIsGRPCs(t *testing.T) {
	for code, want := range map[string]codes.Code{
		idem.CodeKeyRequired:      codes.InvalidArgument,
		idem.CodeKeyInvalid:       codes.InvalidArgument,
		idem.CodeKeyReused:        codes.FailedPrecondition,
		idem.CodeKeyInProgress:    codes.Aborted,
		idem.CodeScopeUnknown:     codes.Unauthenticated,
		idem.CodeStoreUnavailable: codes.Unavailable,
		idem.CodeBodyTooLarge:     codes.ResourceExhausted,
		idem.CodeTxAborted:        codes.Internal,
		"SOMETHING_ELSE":          codes.Internal,
	} {
		got, retry := idem.RPCCode(code)
		if codes.Code(got) != want {
			t.Errorf("RPCCode(%s) = %v, want %v", code, codes.Code(got), want)
		}
		if wantRetry := want == codes.Aborted || want == codes.Unavailable; retry != wantRetry {
			t.Errorf("RPCCode(%s) retry %v, want %v", code, retry, wantRetry)
		}
	}
}
