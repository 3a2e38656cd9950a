package chaos

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/failpoint"
	"github.com/idemkit/idem/internal/testdb"
)

// A short chaos run with the HTTP API's idempotency records in Redis
// (IDEMPOTENCY_STORE, two-step mode): SIGKILLs and a SIGTERM, paysim
// dropping and failing, and failpoints killing an instance between a
// handler's commit and the record's completion in Redis (the window that
// two-step mode leaves open: the retry runs the handler again) and after
// the completion. Every confirmed order and payment must be charged
// exactly once, as on PostgreSQL. The records go under a prefix of the
// run's own in the shared Redis (no persistence; they expire after the
// middleware's 24h retention).
func TestChaosOnRedisStore(t *testing.T) {
	t.Parallel()
	addr := os.Getenv("TEST_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	store := "redis://" + addr + "/0?prefix={chaostest-" + hex.EncodeToString(b[:]) + "}:"
	db := testdb.New(t, testdb.Empty())
	var log bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	rep, err := Run(ctx, &Config{
		IdemBin: needIdem(t), BillingBin: needBilling(t), DatabaseURL: db.URL,
		Quiescence: 3 * time.Minute,
		Orders:     40, Payments: 20, Instances: 2,
		Kills: 1, Terms: 1,
		DropRate: 0.2, FailRate: 0.1, Seed: 11,
		Failpoints: true, FailpointHits: 2,
		FailpointWindows: []string{failpoint.HTTPHandlerDone, failpoint.HTTPResponseStored},
		LoadDuration:     25 * time.Second,
		Env:              []string{"IDEMPOTENCY_STORE=" + store},
		Progress:         &log,
	})
	if rep != nil {
		var out strings.Builder
		rep.WriteText(&out)
		t.Log(out.String())
	}
	if err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	if !rep.Pass {
		t.Fatalf("violations (logs in %s):\n%s", rep.WorkDir, log.String())
	}
	if rep.ConfirmedOrders != 40 || rep.AcceptedPayments != 20 || rep.Charged+rep.Failed != 60 || rep.LedgerCharges != rep.Charged {
		t.Errorf("audit figures: %+v", rep)
	}
	// Nothing made twice, which the ledger audit alone would not see for
	// an order: a re-run of a create that made a second order leaves it
	// NEW and uncharged. One order per driver order (the payments' orders
	// included), one payment per payment, one operation mark per POST
	// that succeeded.
	for _, c := range []struct {
		sql  string
		want int
	}{
		{`SELECT count(*) FROM orders`, 60},
		{`SELECT count(*) FROM payments`, 20},
		{`SELECT count(*) FROM processed_event WHERE consumer_id = 'billing-http'`, 120},
		{`SELECT count(*) FROM idempotency_key`, 0},
	} {
		var n int
		if err := db.Pool.QueryRow(context.Background(), c.sql).Scan(&n); err != nil {
			t.Fatalf("%s: %v", c.sql, err)
		}
		if n != c.want {
			t.Errorf("%s = %d, want %d", c.sql, n, c.want)
		}
	}
	f := rep.Failpoints
	if f == nil || f.Hits[failpoint.HTTPHandlerDone] == 0 {
		t.Fatalf("no kill between a handler's commit and its completion in Redis: the re-run was not exercised (%+v)", f)
	}
	if rep.Stopped.HTTPReplays == 0 {
		t.Errorf("no replays: the Redis records were never read back: %+v", rep)
	}
}
