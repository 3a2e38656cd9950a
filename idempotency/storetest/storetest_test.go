package storetest_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/idempotency/storetest"
	"github.com/idemkit/idem/internal/testdb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestMemoryStore(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(*testing.T) idempotency.Store { return idempotency.NewMemoryStore() })
}

func TestPostgresStore(t *testing.T) {
	t.Parallel()
	storetest.RunTx(t, func(t *testing.T) idempotency.TxStore {
		// Racers claim at once: give them connections to race on.
		return idempotency.NewPostgresStore(testdb.New(t, testdb.MaxConns(storetest.Racers/2)).Pool)
	})
}

// TestSQLStore runs the whole suite, the transactional part included, on
// database/sql with each driver.
func TestSQLStore(t *testing.T) {
	t.Parallel()
	for _, driver := range testdb.SQLDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			storetest.RunTx(t, func(t *testing.T) idempotency.TxStore {
				db := testdb.New(t, testdb.MaxConns(1))
				return idempotency.NewSQLStore(db.SQL(t, driver, storetest.Racers/2))
			})
		})
	}
}

// TestSuiteCatchesBrokenStores proves the suite can fail: it runs the suite
// in a child process (this test binary again) against stores with one
// defect each, and checks that exactly the subtests meant to catch that
// defect fail. A child process, because a failing subtest cannot be
// observed from inside the test that ran it.
func TestSuiteCatchesBrokenStores(t *testing.T) {
	t.Parallel()
	testCases := []struct {
		defect   string
		wantFail []string
	}{
		// Complete and Release trust any fence: a late owner overwrites
		// the new owner's result.
		{"nofence", []string{"CompleteWithStaleFence", "LeaseExpiryTakeover", "ReleaseThenReclaim"}},
		// Claims get no lease: a retry takes over a running request, and
		// racing claims all win.
		{"nolease", []string{"CompleteWithStaleFence", "ConcurrentClaimsOneWinner", "ConcurrentTakeoverOneWinner",
			"DistinctKeysIndependent", "InProgressWhileLeased", "LeaseExpiryTakeover", "Purge", "ReleaseThenReclaim",
			"RenewExtendsRetention", "RenewFencedByToken", "RenewKeepsKeyPastLease"}},
		// Renew says yes to its owner and extends nothing: a long handler loses
		// its key, and a completed key is "renewed".
		{"norenew", []string{"RenewExtendsRetention", "RenewFencedByToken", "RenewKeepsKeyPastLease"}},
		// Renew trusts any fence: a fenced-out owner keeps a key it lost.
		{"renewanyfence", []string{"RenewFencedByToken", "RenewKeepsKeyPastLease"}},
		// Renew brings back a lease that ran out.
		{"renewexpired", []string{"RenewAfterLeaseRanOut"}},
		// Says its records expire by themselves (as Redis keys do), and
		// they never do: Purge's other branch must catch it.
		{"neverexpires", []string{"CompleteRetentionCountsFromCompletion", "Purge", "RenewExtendsRetention", "RetentionExpiry"}},
	}
	for _, tt := range testCases {
		t.Run(tt.defect, func(t *testing.T) {
			t.Parallel()
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestBrokenStore$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), "STORETEST_DEFECT="+tt.defect)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Fatalf("child: %v, want exit status 1\n%s", err, out)
			}
			var gotFail []string
			for _, m := range regexp.MustCompile(`--- FAIL: TestBrokenStore/(\w+)`).FindAllStringSubmatch(string(out), -1) {
				gotFail = append(gotFail, m[1])
			}
			sort.Strings(gotFail)
			if !slices.Equal(gotFail, tt.wantFail) {
				t.Fatalf("failed %v, want %v\n%s", gotFail, tt.wantFail, out)
			}
		})
	}
}

// TestBrokenStore is the child half of TestSuiteCatchesBrokenStores; run
// directly (no STORETEST_DEFECT) it has nothing to do.
func TestBrokenStore(t *testing.T) {
	switch os.Getenv("STORETEST_DEFECT") {
	case "nofence":
		storetest.Run(t, func(*testing.T) idempotency.Store {
			return &noFenceStore{MemoryStore: idempotency.NewMemoryStore(), last: map[idempotency.KeyHash]int64{}}
		})
	case "nolease":
		storetest.Run(t, func(*testing.T) idempotency.Store { return noLeaseStore{idempotency.NewMemoryStore()} })
	case "neverexpires":
		storetest.Run(t, func(*testing.T) idempotency.Store { return neverExpires{idempotency.NewMemoryStore()} })
	case "norenew", "renewanyfence", "renewexpired":
		defect := os.Getenv("STORETEST_DEFECT")
		storetest.Run(t, func(*testing.T) idempotency.Store { return newRenewDefect(defect) })
	}
}

// noFenceStore completes and releases with the newest fence, whoever asks.
type noFenceStore struct {
	*idempotency.MemoryStore
	mu   sync.Mutex
	last map[idempotency.KeyHash]int64
}

func (s *noFenceStore) Claim(ctx context.Context, c idempotency.Claim) (idempotency.ClaimResult, error) {
	res, err := s.MemoryStore.Claim(ctx, c)
	if res.Fence != 0 {
		s.mu.Lock()
		s.last[c.Key] = res.Fence
		s.mu.Unlock()
	}
	return res, err
}

func (s *noFenceStore) newest(k idempotency.KeyHash) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last[k]
}

func (s *noFenceStore) Complete(ctx context.Context, k idempotency.KeyHash, _ int64, r *idempotency.Response, ret time.Duration) error {
	return s.MemoryStore.Complete(ctx, k, s.newest(k), r, ret)
}

func (s *noFenceStore) Release(ctx context.Context, k idempotency.KeyHash, _ int64) error {
	return s.MemoryStore.Release(ctx, k, s.newest(k))
}

// noLeaseStore claims with a zero lease.
type noLeaseStore struct{ *idempotency.MemoryStore }

func (s noLeaseStore) Claim(ctx context.Context, c idempotency.Claim) (idempotency.ClaimResult, error) {
	c.Lease = 0
	return s.MemoryStore.Claim(ctx, c)
}

// neverExpires claims to be a storetest.SelfExpiring store and keeps
// every record for an hour, whatever its retention.
type neverExpires struct{ *idempotency.MemoryStore }

func (neverExpires) RecordsExpireThemselves() bool { return true }

func (s neverExpires) Claim(ctx context.Context, c idempotency.Claim) (idempotency.ClaimResult, error) {
	c.Retention = time.Hour
	return s.MemoryStore.Claim(ctx, c)
}

func (s neverExpires) Complete(ctx context.Context, k idempotency.KeyHash, fence int64, r *idempotency.Response, _ time.Duration) error {
	return s.MemoryStore.Complete(ctx, k, fence, r, time.Hour)
}

// renewDefect is a MemoryStore whose Renew is broken in one way. It keeps
// its own lease per key beside the MemoryStore's, as a store with a
// separate lease table would.
type renewDefect struct {
	*idempotency.MemoryStore
	defect string
	mu     sync.Mutex
	owner  map[idempotency.KeyHash]int64
	until  map[idempotency.KeyHash]time.Time
	lease  map[idempotency.KeyHash]time.Duration
}

func newRenewDefect(defect string) *renewDefect {
	return &renewDefect{MemoryStore: idempotency.NewMemoryStore(), defect: defect,
		owner: map[idempotency.KeyHash]int64{}, until: map[idempotency.KeyHash]time.Time{}, lease: map[idempotency.KeyHash]time.Duration{}}
}

func (s *renewDefect) Claim(ctx context.Context, c idempotency.Claim) (idempotency.ClaimResult, error) {
	res, err := s.MemoryStore.Claim(ctx, c)
	if res.Fence != 0 {
		s.mu.Lock()
		s.owner[c.Key], s.until[c.Key], s.lease[c.Key] = res.Fence, time.Now().Add(c.Lease), c.Lease
		s.mu.Unlock()
	}
	return res, err
}

func (s *renewDefect) Renew(ctx context.Context, k idempotency.KeyHash, fence int64, lease time.Duration) error {
	s.mu.Lock()
	owner, until := s.owner[k], s.until[k]
	s.mu.Unlock()
	switch s.defect {
	case "norenew":
		if owner != fence || !time.Now().Before(until) {
			return idempotency.ErrFenced
		}
		return nil
	case "renewanyfence":
		fence = owner
	case "renewexpired":
		// Re-claim behind the MemoryStore's back when the lease ran out:
		// the expired owner's renewal succeeds.
		if owner == fence && !time.Now().Before(until) {
			return nil
		}
	}
	return s.MemoryStore.Renew(ctx, k, fence, lease)
}
