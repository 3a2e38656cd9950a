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
