package redisstore_test

import (
	"context"
	"encoding/hex"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/redisstore"
)

// What the load did before the kill, as its callers saw it.
type ledger struct {
	mu        sync.Mutex
	completed map[idempotency.KeyHash]string // Complete returned nil: acknowledged
	claimed   map[idempotency.KeyHash]int64  // Claim acknowledged, left in progress on purpose
	shortly   map[idempotency.KeyHash]int64  // the same, with a short lease
	unknown   map[idempotency.KeyHash]int64  // Claim acknowledged, Complete failed: not known
	unsent    []idempotency.KeyHash          // Claim failed: not known whether it landed
	maxFence  int64
}

func newLedger() *ledger {
	return &ledger{completed: map[idempotency.KeyHash]string{}, claimed: map[idempotency.KeyHash]int64{},
		shortly: map[idempotency.KeyHash]int64{}, unknown: map[idempotency.KeyHash]int64{}}
}

const shortLease = 2 * time.Second

// load runs workers that claim fresh keys and complete most of them
// (every 7th is left in progress, every 13th with a short lease), until
// stop is closed and each has seen an error (the server is gone).
// reached is closed once enough completions are acknowledged.
func (l *ledger) load(s *redisstore.Store, workers, enough int, reached chan<- struct{}, stop <-chan struct{}) *sync.WaitGroup {
	var (
		wg   sync.WaitGroup
		n    atomic.Int64
		once sync.Once
	)
	for w := range workers {
		wg.Go(func() {
			ctx := context.Background()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				var k idempotency.KeyHash
				k[0], k[1] = byte(w), byte(i>>16)
				k[2], k[3] = byte(i>>8), byte(i)
				copy(k[4:], []byte("restart-test-key-padding-bytes"))
				lease := time.Hour
				if i%13 == 12 {
					lease = shortLease
				}
				res, err := s.Claim(ctx, claimOf(k, "a", lease, time.Hour))
				if err != nil {
					l.mu.Lock()
					l.unsent = append(l.unsent, k)
					l.mu.Unlock()
					continue
				}
				if res.Outcome != idempotency.OutcomeClaimed {
					panic("a fresh key was not claimed: " + res.Outcome.String())
				}
				l.mu.Lock()
				l.maxFence = max(l.maxFence, res.Fence)
				switch {
				case i%13 == 12:
					l.shortly[k] = res.Fence
				case i%7 == 6:
					l.claimed[k] = res.Fence
				}
				l.mu.Unlock()
				if i%13 == 12 || i%7 == 6 {
					continue
				}
				body := hex.EncodeToString(k[:4])
				err = s.Complete(ctx, k, res.Fence, &idempotency.Response{Status: 201, Body: []byte(body)}, time.Hour)
				l.mu.Lock()
				if err == nil {
					l.completed[k] = body
				} else {
					l.unknown[k] = res.Fence
				}
				l.mu.Unlock()
				if err == nil && n.Add(1) == int64(enough) {
					once.Do(func() { close(reached) })
				}
			}
		})
	}
	return &wg
}

// crashUnderLoad starts load on srv, SIGKILLs the server once enough
// completions are acknowledged (the workers still sending), stops the
// load, and starts the server again on the same data directory.
func crashUnderLoad(t *testing.T, srv *ownServer, prefix string) *ledger {
	t.Helper()
	// No client retries: what the caller sees acknowledged is what it
	// got back from this server, not a re-send to the restarted one.
	c := redis.NewClient(&redis.Options{Addr: srv.addr(), MaxRetries: -1, PoolSize: 16})
	defer c.Close()
	s, err := redisstore.New(c, &redisstore.Config{Prefix: prefix, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	l := newLedger()
	reached, stop := make(chan struct{}), make(chan struct{})
	wg := l.load(s, 8, 300, reached, stop)
	select {
	case <-reached:
	case <-time.After(time.Minute):
		close(stop)
		wg.Wait()
		t.Fatalf("300 completions were not acknowledged within a minute (%d)", len(l.completed))
	}
	srv.kill() // mid-load: the workers are sending
	close(stop)
	wg.Wait()
	if len(l.claimed) == 0 || len(l.shortly) == 0 {
		t.Fatalf("the load left no claims in progress: %d, %d", len(l.claimed), len(l.shortly))
	}
	srv.start()
	return l
}

// TestRestartAppendfsyncAlways: a redis-server of the test's own with
// appendonly yes and appendfsync always takes claims and completions from
// 8 workers and is SIGKILLed in the middle of them, then started again on
// the same data directory. What survives, precisely:
//
//   - every completion acknowledged before the kill: its key replays the
//     same response (the handler would not run again);
//   - every claim acknowledged and left in progress: it is still in
//     progress with its fence, and its owner can still complete it (the
//     lease is an absolute time in the record, in the server's clock); a
//     claim whose lease ran out meanwhile is taken over by one retry with
//     a higher fence, and its old owner is fenced out;
//   - a call that failed at the kill (no reply): either state, never a
//     wrong response;
//   - fences after the restart are above every fence before it.
func TestRestartAppendfsyncAlways(t *testing.T) {
	t.Parallel()
	srv := startOwnServer(t, "--appendonly", "yes", "--appendfsync", "always")
	const prefix = "{restart}:"
	l := crashUnderLoad(t, srv, prefix)

	c := newClient(t, srv.addr())
	s, err := redisstore.New(c, &redisstore.Config{Prefix: prefix, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	// The server's own settings keep the guarantee: nothing to warn about.
	if ws, err := s.CheckServer(ctx); err != nil || len(ws) != 0 {
		t.Fatalf("CheckServer on appendfsync always: %v, %v; want no warnings", ws, err)
	}
	for k, body := range l.completed {
		res, err := s.Claim(ctx, claimOf(k, "a", time.Hour, time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if res.Outcome != idempotency.OutcomeCompleted || string(res.Response.Body) != body {
			t.Fatalf("an acknowledged completion after the restart: %s %+v, want completed %q", res.Outcome, res.Response, body)
		}
	}
	for k, fence := range l.claimed {
		mustClaim(t, s, claimOf(k, "a", time.Hour, time.Hour), idempotency.OutcomeInProgress)
		if err := s.Complete(ctx, k, fence, &idempotency.Response{Status: 201, Body: []byte("late")}, time.Hour); err != nil {
			t.Fatalf("the owner of a claim from before the restart completes it: %v", err)
		}
		mustClaim(t, s, claimOf(k, "a", time.Hour, time.Hour), idempotency.OutcomeCompleted)
	}
	for k, fence := range l.shortly {
		var took idempotency.ClaimResult
		waitFor(t, "the short lease to run out", func() bool {
			res, err := s.Claim(ctx, claimOf(k, "a", time.Hour, time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			took = res
			return res.Outcome != idempotency.OutcomeInProgress
		})
		if took.Outcome != idempotency.OutcomeTookOver || took.Fence <= l.maxFence {
			t.Fatalf("a short claim from before the restart: %s fence %d, want took_over with a fence above %d", took.Outcome, took.Fence, l.maxFence)
		}
		if err := s.Complete(ctx, k, fence, &idempotency.Response{Status: 201}, time.Hour); !errors.Is(err, idempotency.ErrFenced) {
			t.Fatalf("the old owner after the takeover: %v, want ErrFenced", err)
		}
	}
	for k := range l.unknown {
		res, err := s.Claim(ctx, claimOf(k, "a", time.Hour, time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if res.Outcome == idempotency.OutcomeCompleted && string(res.Response.Body) != hex.EncodeToString(k[:4]) ||
			res.Outcome != idempotency.OutcomeCompleted && res.Outcome != idempotency.OutcomeInProgress {
			t.Fatalf("a claim whose completion got no reply: %s, want completed (with its body) or in progress", res.Outcome)
		}
	}
	for _, k := range l.unsent {
		res, err := s.Claim(ctx, claimOf(k, "a", time.Hour, time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if res.Outcome != idempotency.OutcomeClaimed && res.Outcome != idempotency.OutcomeInProgress {
			t.Fatalf("a claim that got no reply: %s, want claimed (it never landed) or in progress (it did)", res.Outcome)
		}
	}
	t.Logf("appendfsync always, SIGKILL under load: %d acknowledged completions replayed, %d claims in progress kept, %d short claims taken over, %d completions and %d claims without a reply",
		len(l.completed), len(l.claimed), len(l.shortly), len(l.unknown), len(l.unsent))
}

// TestRestartAppendonlyNo is the loss the package doc warns about: the
// same load on a server without persistence (appendonly no, no snapshots,
// as the shared test server runs), the same kill. Every acknowledged
// completion is gone: its key is new again, so a retry runs the handler a
// second time; every claim in progress is gone too, so a retry runs
// alongside the first owner. Fences still never repeat: the first claim
// after the restart gets one above every fence before the kill, and the
// old owners are fenced out.
func TestRestartAppendonlyNo(t *testing.T) {
	t.Parallel()
	srv := startOwnServer(t, "--appendonly", "no")
	const prefix = "{restart}:"
	l := crashUnderLoad(t, srv, prefix)

	var logged []string
	c := newClient(t, srv.addr())
	s, err := redisstore.New(c, &redisstore.Config{Prefix: prefix, Logger: recordingLogger(&logged)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	ws, err := s.CheckServer(ctx)
	if err != nil || len(ws) != 1 || ws[0].Setting != "appendonly" || len(logged) != 1 {
		t.Fatalf("CheckServer on appendonly no: %v, %v (logged %q); want one appendonly warning, logged", ws, err, logged)
	}
	lost := 0
	for k := range l.completed {
		res, err := s.Claim(ctx, claimOf(k, "a", time.Hour, time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if res.Outcome != idempotency.OutcomeClaimed {
			t.Fatalf("an acknowledged completion after a restart without persistence: %s, want claimed (lost)", res.Outcome)
		}
		lost++
		if res.Fence <= l.maxFence {
			t.Fatalf("fence after the restart %d, want above %d (the last before the kill)", res.Fence, l.maxFence)
		}
	}
	for k, fence := range l.claimed {
		res := mustClaim(t, s, claimOf(k, "a", time.Hour, time.Hour), idempotency.OutcomeClaimed)
		if res.Fence <= fence {
			t.Fatalf("fence %d after the restart, want above the lost claim's %d", res.Fence, fence)
		}
		if err := s.Complete(ctx, k, fence, &idempotency.Response{Status: 201}, time.Hour); !errors.Is(err, idempotency.ErrFenced) {
			t.Fatalf("the lost claim's owner completes: %v, want ErrFenced", err)
		}
	}
	t.Logf("appendonly no, SIGKILL under load: all %d acknowledged completions and %d claims in progress lost", lost, len(l.claimed))
}
