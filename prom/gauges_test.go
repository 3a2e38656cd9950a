package idemprom_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/lifecycle"
	"github.com/idemkit/idem/outbox"
	idemprom "github.com/idemkit/idem/prom"
)

var (
	_ lifecycle.Component   = (*idemprom.OutboxGauges)(nil)
	_ lifecycle.HardStopper = (*idemprom.OutboxGauges)(nil)
	_ prometheus.Collector  = (*idemprom.OutboxGauges)(nil)
)

// A bad config is this module's ErrInvalidConfig and the poller's
// outbox.ErrInvalidConfig at once, names the field, and registers nothing.
func TestOutboxGaugesConfig(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := idemprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	pool := testdb.New(t).Pool
	bad := map[string]error{}
	_, bad["db"] = m.OutboxGauges(nil, nil)
	_, bad["Interval"] = m.OutboxGauges(pool, &idemprom.OutboxGaugesConfig{Interval: -time.Second})
	_, bad["LeaseTTL"] = m.OutboxGauges(pool, &idemprom.OutboxGaugesConfig{LeaseTTL: -time.Second})
	for field, err := range bad {
		if !errors.Is(err, idemprom.ErrInvalidConfig) || !errors.Is(err, outbox.ErrInvalidConfig) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: err = %v, want both ErrInvalidConfigs, naming %s", field, err, field)
		}
	}
	// The failed calls registered no collector: a good one still can.
	if _, err := m.OutboxGauges(pool, nil); err != nil {
		t.Fatalf("a good config after bad ones: %v", err)
	}
}
