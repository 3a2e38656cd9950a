package idempotency_test

import (
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/idempotency"
)

// TestLeaseLongerThanRetention: the check runs on the config as it will be
// used, defaults filled in: a 48h lease with the default 24h retention
// would let a different body take over a live claim after 24h.
func TestLeaseLongerThanRetention(t *testing.T) {
	t.Parallel()
	s := idempotency.NewMemoryStore()
	for _, cfg := range []idempotency.Config{
		{Scope: principal, Lease: 48 * time.Hour},
		{Scope: principal, Retention: 10 * time.Second},
	} {
		_, err := idempotency.New(s, &cfg)
		if err == nil || !strings.Contains(err.Error(), "Lease") || !strings.Contains(err.Error(), "Retention") {
			t.Errorf("New(Lease %s, Retention %s) = %v, want an error naming Lease and Retention", cfg.Lease, cfg.Retention, err)
		}
	}
}
