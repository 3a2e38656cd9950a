package domain_test

import (
	"errors"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/examples/billing/domain"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestValidation(t *testing.T) {
	t.Parallel()
	for _, v := range []int64{0, -1, -1 << 62} {
		if err := domain.ValidateAmount("total_kopecks", v); !errors.Is(err, domain.ErrValidation) || !strings.Contains(err.Error(), "total_kopecks") {
			t.Errorf("amount %d: %v", v, err)
		}
	}
	if err := domain.ValidateAmount("x", 1); err != nil {
		t.Error(err)
	}
	for _, id := range []string{"", "  ", strings.Repeat("c", domain.MaxIDLen+1)} {
		if err := domain.ValidateCustomerID("customer_id", id); !errors.Is(err, domain.ErrValidation) {
			t.Errorf("customer %q: %v", id, err)
		}
	}
	if err := domain.ValidateCustomerID("customer_id", "c1"); err != nil {
		t.Error(err)
	}
}

func TestNewIDIsUnique(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 10000 {
		id := domain.NewID("ord")
		if seen[id] || !strings.HasPrefix(id, "ord_") {
			t.Fatalf("id %q repeated or malformed", id)
		}
		seen[id] = true
	}
}

func TestValidateText(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"a\x00b", "\xff", "ok\xc3", "tab\there", "\u0085", "\x7f"} {
		err := domain.ValidateID("order_id", bad)
		if !errors.Is(err, domain.ErrInvalidText) || strings.Contains(err.Error(), bad) {
			t.Errorf("%q: %v", bad, err)
		}
	}
	for _, good := range []string{"c1", "ord_0123456789abcdef0123", "клиент-7", "a b"} {
		if err := domain.ValidateID("customer_id", good); err != nil {
			t.Errorf("%q: %v", good, err)
		}
	}
}

func TestAmountUpperBound(t *testing.T) {
	t.Parallel()
	for _, v := range []int64{domain.MaxAmountKopecks + 1, 1<<63 - 1} {
		if err := domain.ValidateAmount("amount_kopecks", v); !errors.Is(err, domain.ErrAmountTooLarge) {
			t.Errorf("%d: %v", v, err)
		}
	}
	if err := domain.ValidateAmount("amount_kopecks", domain.MaxAmountKopecks); err != nil {
		t.Error(err)
	}
}

func TestCheckPayment(t *testing.T) {
	t.Parallel()
	o := domain.Order{ID: "ord_1", CustomerID: "c1", TotalKopecks: 1000, Status: domain.OrderNew}
	testCases := []struct {
		name   string
		status string
		cust   string
		amount int64
		paid   int64
		want   error
	}{
		{"whole total", domain.OrderNew, "c1", 1000, 0, nil},
		{"the rest", domain.OrderNew, "c1", 400, 600, nil},
		{"over the rest", domain.OrderNew, "c1", 401, 600, domain.ErrExceedsOutstanding},
		{"nothing left", domain.OrderNew, "c1", 1, 1000, domain.ErrExceedsOutstanding},
		{"over the total", domain.OrderNew, "c1", 1001, 0, domain.ErrExceedsOutstanding},
		{"other customer", domain.OrderNew, "c2", 10, 0, domain.ErrCustomerMismatch},
		{"confirmed", domain.OrderConfirmed, "c1", 10, 0, domain.ErrOrderState},
		{"charged", domain.OrderCharged, "c1", 10, 0, domain.ErrOrderState},
		{"failed", domain.OrderFailed, "c1", 10, 0, domain.ErrOrderState},
	}
	for _, tt := range testCases {
		oo := o
		oo.Status = tt.status
		err := domain.CheckPayment(oo, tt.cust, tt.amount, tt.paid)
		if (tt.want == nil) != (err == nil) || (tt.want != nil && !errors.Is(err, tt.want)) {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
	}
}
