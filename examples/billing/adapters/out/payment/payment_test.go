package payment_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/examples/billing/adapters/out/payment"
	"github.com/idemkit/idem/examples/billing/usecase"
	"github.com/idemkit/idem/paysim"
	"github.com/idemkit/idem/paysim/paysimtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func gateway(t *testing.T, url string) *payment.Gateway {
	t.Helper()
	g, err := payment.New(url, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	return g
}

var cmd = usecase.ChargeRequested{Target: "order", TargetID: "o1", OrderID: "o1", CustomerID: "c1", AmountKopecks: 100, IdempotencyKey: "e1:billing"}

// TestOutcomes proves how the adapter classifies the provider's answers:
// a charge and its replay give one charge id; a refusal (key reused with
// another amount, a command that can never be sent) is ErrChargeDeclined;
// an unreachable or failing provider is an unknown outcome, to be retried
// with the same key.
func TestOutcomes(t *testing.T) {
	t.Parallel()
	sim, url := paysimtest.Start(t, nil)
	g := gateway(t, url)
	ctx := context.Background()
	id1, err := g.Charge(ctx, cmd)
	if err != nil {
		t.Fatal(err)
	}
	id2, err := g.Charge(ctx, cmd)
	if err != nil || id2.ID != id1.ID || id1.Replayed || !id2.Replayed || sim.Ledger().Len() != 1 {
		t.Fatalf("replay: %+v then %+v %v, ledger %d", id1, id2, err, sim.Ledger().Len())
	}
	other := cmd
	other.AmountKopecks = 999
	if _, err := g.Charge(ctx, other); !errors.Is(err, usecase.ErrChargeDeclined) {
		t.Fatalf("key reused with another amount: %v", err)
	}
	noKey := cmd
	noKey.IdempotencyKey = ""
	if _, err := g.Charge(ctx, noKey); !errors.Is(err, usecase.ErrChargeDeclined) {
		t.Fatalf("no key: %v", err)
	}

	_, failing := paysimtest.Start(t, &paysim.Config{FailRate: 1})
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := gateway(t, failing).Charge(short, cmd); err == nil || errors.Is(err, usecase.ErrChargeDeclined) {
		t.Fatalf("failing provider: %v, want an unknown outcome", err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := "http://" + ln.Addr().String()
	ln.Close()
	short2, cancel2 := context.WithTimeout(ctx, 2*time.Second)
	defer cancel2()
	if _, err := gateway(t, dead).Charge(short2, cmd); err == nil || errors.Is(err, usecase.ErrChargeDeclined) {
		t.Fatalf("unreachable provider: %v, want an unknown outcome", err)
	}
}
