package paysim_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/paysim"
)

// chaosConfig is the fault mix: 20% of charges fail before
// charging, 30% of 201s are dropped after charging. Latency 0 keeps the
// run fast.
func chaosConfig() *paysim.Config {
	return &paysim.Config{FailRate: 0.2, DropRate: 0.3, Seed: 42}
}

type order struct {
	id, customer string
	amount       int64
}

func orders(n int) []order {
	out := make([]order, n)
	for i := range out {
		out[i] = order{id: fmt.Sprintf("o-%04d", i), customer: fmt.Sprintf("c-%d", i%37), amount: int64(100 + i)}
	}
	return out
}

type outcome struct {
	res paysim.ChargeResult
	err error
}

// chargeAll charges every order once through c, 16 at a time, with a key
// derived from the operation: order id + ":charge:" + request id.
func chargeAll(t *testing.T, c *paysim.Client, os []order) []outcome {
	t.Helper()
	out := make([]outcome, len(os))
	next := atomic.Int64{}
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(os) {
					return
				}
				o := os[i]
				res, err := c.Charge(t.Context(), paysim.ChargeCommand{
					IdempotencyKey: idemclient.Key(o.id, "charge", "r-1"),
					OrderID:        o.id,
					CustomerID:     o.customer,
					AmountKopecks:  o.amount,
				})
				out[i] = outcome{res, err}
			}
		})
	}
	wg.Wait()
	return out
}

// TestThousandChargesUnderFaultsChargeOnce: 1,000 charges through
// idemclient against paysim over loopback TCP, with 30% of responses
// dropped after the charge and 20% of charges failing first. Every call
// ends (success, or a definitive error), and the ledger holds exactly one
// row per key and per order.
func TestThousandChargesUnderFaultsChargeOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, chaosConfig())
	// Count the retries idemclient itself made after a lost connection
	// (net/http resends some dropped requests below it; see the idemclient
	// package doc).
	var transportRetries atomic.Int64
	ic, err := idemclient.New(httpClient(t, nil), &idemclient.Config{
		MaxAttempts: 40, BackoffMin: 200 * time.Microsecond, BackoffMax: 5 * time.Millisecond, Retry500: true,
		Hook: func(ctx context.Context, e idemclient.Event) context.Context {
			var se *idemclient.StatusError
			if e.Kind == idemclient.EventRetry && !errors.As(e.Err, &se) {
				transportRetries.Add(1)
			}
			return ctx
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	c, err := paysim.NewClient(b.url, ic)
	if err != nil {
		t.Fatal(err)
	}
	os := orders(1000)
	results := chargeAll(t, c, os)

	byKey := map[string]paysim.Charge{}
	for _, row := range b.sim.Ledger().Charges() {
		byKey[row.IdempotencyKey] = row
	}
	replayed, retried := 0, 0
	for i, r := range results {
		if r.err != nil {
			// The issue allows a definitive error; none is expected here,
			// and a retryable one means the client gave up on an unknown
			// outcome.
			t.Fatalf("order %s: %v (retryable %v)", os[i].id, r.err, idemclient.IsRetryable(r.err))
		}
		row, ok := byKey[idemclient.Key(os[i].id, "charge", "r-1")]
		if !ok || row.ChargeID != r.res.ChargeID || row.OrderID != os[i].id || row.AmountKopecks != os[i].amount {
			t.Fatalf("order %s: result %+v, ledger row %+v", os[i].id, r.res, row)
		}
		if r.res.Replayed {
			replayed++
		}
		if r.res.Attempts > 1 {
			retried++
		}
	}
	audit := paysim.Audit(b.sim.Ledger().Charges())
	if audit.Charges != 1000 || !audit.Clean() {
		t.Fatalf("audit: %v; want 1000 charges, none twice", audit)
	}
	// Each dropped answer was recovered by exactly one replay (a dropped
	// replay by one more): no retry ran the charge again.
	st := b.sim.Stats()
	if st.Replayed != st.Dropped || st.Charged != 1000 {
		t.Fatalf("%+v: want Replayed == Dropped and 1000 charges", st)
	}
	// The faults really happened: otherwise this test proves nothing.
	if st.Dropped < 100 || st.Failed < 100 || st.Replayed < int64(replayed) || replayed == 0 || retried == 0 || transportRetries.Load() == 0 {
		t.Fatalf("too few faults to mean anything: %+v, %d replayed, %d retried, %d retries after a lost connection",
			st, replayed, retried, transportRetries.Load())
	}
	t.Logf("audit: %v; %+v; %d calls answered by a replay, %d needed more than one attempt, %d retries after a lost connection",
		audit, st, replayed, retried, transportRetries.Load())
}

// freshKeyTransport is the common mistake: a new key on every attempt
// (uuid.New() per call). It rewrites the Idempotency-Key of each
// request idemclient sends.
type freshKeyTransport struct {
	base http.RoundTripper
	n    atomic.Int64
}

func (f *freshKeyTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	r.Header.Set("Idempotency-Key", fmt.Sprintf("%s~try-%d", req.Header.Get("Idempotency-Key"), f.n.Add(1)))
	return f.base.RoundTrip(r)
}

// TestFreshKeyPerAttemptDoubleCharges runs the same load with a client
// that makes a fresh key per attempt: orders get charged twice, and the
// audit that passes above finds them. Proof that the check can fail.
func TestFreshKeyPerAttemptDoubleCharges(t *testing.T) {
	t.Parallel()
	b := setup(t, chaosConfig())
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c, err := paysim.NewClient(b.url, fastIdem(t, &http.Client{Transport: &freshKeyTransport{base: tr}}))
	if err != nil {
		t.Fatal(err)
	}
	results := chargeAll(t, c, orders(1000))
	for _, r := range results {
		if r.err != nil {
			t.Fatalf("charge: %v", r.err)
		}
	}
	rows := b.sim.Ledger().Charges()
	audit := paysim.Audit(rows)
	if audit.Clean() || audit.Extra() == 0 || len(rows) <= 1000 {
		t.Fatalf("audit found no double charge with fresh keys per attempt: %v", audit)
	}
	if len(audit.DuplicateKeys) != 0 {
		t.Fatalf("two rows for one key: %v", audit.DuplicateKeys)
	}
	if len(rows) != 1000+audit.Extra() {
		t.Fatalf("%d rows, want 1000 + %d extra", len(rows), audit.Extra())
	}
	t.Logf("audit: %v", audit)
}
