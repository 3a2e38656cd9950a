package idemconnect_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemconnect"
	"github.com/idemkit/idem/idempotency"
)

// TestReplay: the same key and request again get the first response
// (same row id), marked Idempotent-Replayed, without a second execution,
// over the JSON and the binary codec, in both modes; a replay crosses
// codecs (the stored message is re-encoded in the retry's codec), and the
// handler's Content-Language header (in ReplayHeaders) comes back.
func TestReplay(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, &idemconnect.Config{Idempotency: idempotency.Config{Mode: mode}})
			js, bin := b.client(procCharge, false), b.client(procCharge, true)
			req := map[string]any{"amount": 100.0, "card": map[string]any{"last4": "4242"}}
			first := call(t.Context(), js, "replay-1", req)
			second := call(t.Context(), js, "replay-1", req)
			third := call(t.Context(), bin, "replay-1", req)
			if first.err != nil || first.replayed {
				t.Fatalf("first: %s", first)
			}
			for _, a := range []answer{second, third} {
				if a.err != nil || !a.replayed || a.id() != first.id() || a.resp.GetFields()["procedure"].GetStringValue() != procCharge || a.header.Get("Content-Language") != "en" {
					t.Errorf("retry: %s, want the replay of id %v", a, first.id())
				}
			}
			if n := b.svc.calls.Load(); n != 1 {
				t.Errorf("%d executions, want 1", n)
			}
			if n := b.effects(t); n != 1 {
				t.Errorf("%d effect rows, want 1", n)
			}
		})
	}
}

// TestInProgress: a duplicate while the first call runs gets Aborted
// IDEMPOTENCY_KEY_IN_PROGRESS with a RetryInfo delay and a Retry-After
// header; after the first completes, the duplicate gets the replay.
func TestInProgress(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, &idemconnect.Config{Idempotency: idempotency.Config{Mode: mode}})
			c := b.client(procCharge, false)
			release := b.svc.hold()
			defer release()
			done := make(chan answer, 1)
			go func() { done <- call(t.Context(), c, "busy", map[string]any{"amount": 1.0}) }()
			// The first call holds the claim once it executes (the gate
			// holds it after the count).
			for b.svc.calls.Load() == 0 {
				time.Sleep(time.Millisecond)
			}
			dup := call(t.Context(), c, "busy", map[string]any{"amount": 1.0})
			r, delay := reason(dup.err)
			if connect.CodeOf(dup.err) != connect.CodeAborted || r != idem.CodeKeyInProgress || delay < 1 || dup.header.Get("Retry-After") == "" {
				t.Errorf("duplicate: %s reason %q delay %v Retry-After %q; want Aborted %s with a delay ≥ 1s", dup, r, delay, dup.header.Get("Retry-After"), idem.CodeKeyInProgress)
			}
			release()
			first := <-done
			after := call(t.Context(), c, "busy", map[string]any{"amount": 1.0})
			if first.err != nil || !after.replayed || after.id() != first.id() {
				t.Errorf("first %s, after %s: want the replay", first, after)
			}
			if n := b.svc.calls.Load(); n != 1 {
				t.Errorf("%d executions, want 1", n)
			}
		})
	}
}

// TestRefusals: another request on a used key, a missing key, an invalid
// key, no principal: each refused with its code and ErrorInfo reason, the
// handler not run. A procedure declared NoSideEffects is not guarded.
func TestRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t, &idemconnect.Config{})
	c := b.client(procCharge, false)
	first := call(t.Context(), c, "used", map[string]any{"amount": 1.0, "card": map[string]any{"last4": "4242"}})
	if first.err != nil {
		t.Fatal(first)
	}
	for _, tt := range []struct {
		name   string
		key    string
		msg    map[string]any
		anon   bool
		code   connect.Code
		reason string
	}{
		{"other amount", "used", map[string]any{"amount": 2.0, "card": map[string]any{"last4": "4242"}}, false, connect.CodeFailedPrecondition, idem.CodeKeyReused},
		{"other nested member", "used", map[string]any{"amount": 1.0, "card": map[string]any{"last4": "4243"}}, false, connect.CodeFailedPrecondition, idem.CodeKeyReused},
		{"no key", "", map[string]any{"amount": 1.0}, false, connect.CodeInvalidArgument, idem.CodeKeyRequired},
		{"space in key", "a b", map[string]any{"amount": 1.0}, false, connect.CodeInvalidArgument, idem.CodeKeyInvalid},
		{"no principal", "anon", map[string]any{"amount": 1.0}, true, connect.CodeUnauthenticated, idem.CodeScopeUnknown},
	} {
		var a answer
		if tt.anon {
			a = callAs(t.Context(), c, "", tt.key, tt.msg)
		} else {
			a = call(t.Context(), c, tt.key, tt.msg)
		}
		r, _ := reason(a.err)
		if connect.CodeOf(a.err) != tt.code || r != tt.reason || a.replayed {
			t.Errorf("%s: %s reason %q, want %s %s", tt.name, a, r, tt.code, tt.reason)
		}
	}
	again := call(t.Context(), c, "used", map[string]any{"amount": 1.0, "card": map[string]any{"last4": "4242"}})
	if !again.replayed || again.id() != first.id() {
		t.Errorf("the first request again: %s, want its replay", again)
	}
	get := b.client(procGet, false, connect.WithHTTPGet())
	g1, g2 := call(t.Context(), get, "", nil), call(t.Context(), get, "", nil)
	if g1.err != nil || g2.err != nil || g2.replayed {
		t.Errorf("a NoSideEffects procedure without a key: %s, %s; want two plain runs", g1, g2)
	}
	if n := b.svc.calls.Load(); n != 3 {
		t.Errorf("%d executions, want 3 (the first and two reads)", n)
	}
}

// TestCodes: a definitive error (InvalidArgument, NotFound, …) is stored
// and replayed with its message and details; Unavailable, Internal,
// Aborted and a panic release the key, and the retry runs again. In
// ModeTransactional a released outcome rolls the handler's write back.
func TestCodes(t *testing.T) {
	t.Parallel()
	testCases := []struct {
		code   connect.Code
		stored bool
	}{
		{connect.CodeInvalidArgument, true},
		{connect.CodeNotFound, true},
		{connect.CodeAlreadyExists, true},
		{connect.CodePermissionDenied, true},
		{connect.CodeFailedPrecondition, true},
		{connect.CodeOutOfRange, true},
		{connect.CodeUnimplemented, true},
		{connect.CodeCanceled, false},
		{connect.CodeUnknown, false},
		{connect.CodeDeadlineExceeded, false},
		{connect.CodeResourceExhausted, false},
		{connect.CodeAborted, false},
		{connect.CodeInternal, false},
		{connect.CodeUnavailable, false},
		{connect.CodeDataLoss, false},
		{connect.CodeUnauthenticated, false},
	}
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, &idemconnect.Config{Idempotency: idempotency.Config{Mode: mode}})
			c := b.client(procCharge, false)
			want := 0
			for _, tt := range testCases {
				if got := idemconnect.DefaultStoreCode(tt.code); got != tt.stored {
					t.Errorf("DefaultStoreCode(%s) = %v", tt.code, got)
				}
				key := "code-" + tt.code.String()
				req := map[string]any{"fail_code": float64(tt.code)}
				before := b.svc.calls.Load()
				first := call(t.Context(), c, key, req)
				second := call(t.Context(), c, key, req)
				runs := b.svc.calls.Load() - before
				if connect.CodeOf(first.err) != tt.code || first.replayed {
					t.Errorf("%s first: %s", tt.code, first)
				}
				var fe, se *connect.Error
				errors.As(first.err, &fe)
				errors.As(second.err, &se)
				switch {
				case tt.stored && (runs != 1 || !second.replayed || connect.CodeOf(second.err) != tt.code || se.Message() != fe.Message() || !hasBadRequest(se)):
					t.Errorf("%s stored: retry %s after %s, %d runs; want the replay with its details, 1 run", tt.code, second, first, runs)
				case !tt.stored && (runs != 2 || second.replayed || connect.CodeOf(second.err) != tt.code):
					t.Errorf("%s released: retry %s, %d runs; want a fresh run, 2 runs", tt.code, second, runs)
				}
				switch {
				case tt.stored:
					want++
				case mode == idempotency.ModeTwoStep:
					want += 2
				}
			}
			// A panic (answered Internal by connect.WithRecover) releases too.
			p1 := call(t.Context(), c, "panic", map[string]any{"panic": true})
			p2 := call(t.Context(), c, "panic", map[string]any{"panic": true})
			if connect.CodeOf(p1.err) != connect.CodeInternal || connect.CodeOf(p2.err) != connect.CodeInternal || p2.replayed {
				t.Errorf("panic: %s then %s; want Internal twice, not replayed", p1, p2)
			}
			if mode == idempotency.ModeTwoStep {
				want += 2
			}
			// In two-step mode the effect is outside the transaction: every
			// run's row stays. In transactional mode only stored runs commit.
			if n := b.effects(t); n != want {
				t.Errorf("%d effect rows, want %d", n, want)
			}
		})
	}
}

func hasBadRequest(ce *connect.Error) bool {
	if ce == nil {
		return false
	}
	for _, d := range ce.Details() {
		if v, err := d.Value(); err == nil {
			if br, ok := v.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) == 1 {
				return true
			}
		}
	}
	return false
}

// TestRace50: 50 calls race on one key; the handler runs once, every
// other call gets Aborted with a RetryInfo delay (or the replay).
func TestRace50(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, &idemconnect.Config{Idempotency: idempotency.Config{Mode: mode}})
			c := b.client(procCharge, false)
			release := b.svc.hold()
			const n = 50
			answers := make([]answer, n)
			var wg sync.WaitGroup
			var answered atomic.Int64
			for i := range n {
				wg.Go(func() {
					answers[i] = call(t.Context(), c, "race", map[string]any{"amount": 100.0})
					answered.Add(1)
				})
			}
			// The owner waits at the gate while the 49 others are answered
			// (no Config.Wait: at once); then it is let go.
			for answered.Load() < n-1 {
				time.Sleep(time.Millisecond)
			}
			release()
			wg.Wait()
			var ok, aborted int
			for _, a := range answers {
				switch r, d := reason(a.err); {
				case a.err == nil:
					ok++
				case connect.CodeOf(a.err) == connect.CodeAborted && r == idem.CodeKeyInProgress && d >= 1:
					aborted++
				default:
					t.Errorf("racer: %s", a)
				}
			}
			if ok != 1 || aborted != n-1 {
				t.Errorf("%d ok, %d aborted; want 1 and %d", ok, aborted, n-1)
			}
			if runs := b.svc.calls.Load(); runs != 1 {
				t.Errorf("%d executions, want 1", runs)
			}
			if rows := b.effects(t); rows != 1 {
				t.Errorf("%d effect rows, want 1", rows)
			}
			after := call(t.Context(), c, "race", map[string]any{"amount": 100.0})
			if !after.replayed {
				t.Errorf("after the race: %s, want the replay", after)
			}
		})
	}
}

// TestStoreDown: a store that cannot be reached answers Unavailable
// IDEMPOTENCY_STORE_UNAVAILABLE with a RetryInfo and Retry-After; the
// handler never runs unprotected.
func TestStoreDown(t *testing.T) {
	t.Parallel()
	var dead *pgxpool.Pool
	b := setupStore(t, &idemconnect.Config{}, func(p *pgxpool.Pool) *idempotency.PostgresStore {
		var err error
		dead, err = pgxpool.NewWithConfig(t.Context(), p.Config())
		if err != nil {
			t.Fatal(err)
		}
		dead.Close()
		return idempotency.NewPostgresStore(dead)
	})
	a := call(t.Context(), b.client(procCharge, false), "down", map[string]any{"amount": 1.0})
	r, d := reason(a.err)
	if connect.CodeOf(a.err) != connect.CodeUnavailable || r != idem.CodeStoreUnavailable || d < 1 || a.header.Get("Retry-After") == "" {
		t.Errorf("store down: %s reason %q delay %v; want Unavailable %s with a delay", a, r, d, idem.CodeStoreUnavailable)
	}
	if n := b.svc.calls.Load(); n != 0 {
		t.Errorf("%d executions, want 0", n)
	}
}

// TestRPCCodeIsConnects: idem.RPCCode's numbers are Connect's codes.
func TestRPCCodeIsConnects(t *testing.T) {
	for code, want := range map[string]connect.Code{
		idem.CodeKeyRequired:      connect.CodeInvalidArgument,
		idem.CodeKeyReused:        connect.CodeFailedPrecondition,
		idem.CodeKeyInProgress:    connect.CodeAborted,
		idem.CodeScopeUnknown:     connect.CodeUnauthenticated,
		idem.CodeStoreUnavailable: connect.CodeUnavailable,
		idem.CodeBodyTooLarge:     connect.CodeResourceExhausted,
		idem.CodeTxAborted:        connect.CodeInternal,
	} {
		if got, _ := idem.RPCCode(code); connect.Code(got) != want {
			t.Errorf("RPCCode(%s) = %v, want %v", code, connect.Code(got), want)
		}
	}
}
