package idemotel_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/lifecycle"
	idemotel "github.com/idemkit/idem/otel"
	"github.com/idemkit/idem/outbox"
)

var (
	_ lifecycle.Component   = (*idemotel.OutboxGauges)(nil)
	_ lifecycle.HardStopper = (*idemotel.OutboxGauges)(nil)
)

// A bad config is this module's ErrInvalidConfig and the poller's
// outbox.ErrInvalidConfig at once, and names the field.
func TestOutboxGaugesConfig(t *testing.T) {
	t.Parallel()
	tel, pool := setup(t).tel, testdb.New(t).Pool
	bad := map[string]error{}
	_, bad["db"] = tel.OutboxGauges(nil, nil)
	_, bad["Interval"] = tel.OutboxGauges(pool, &idemotel.OutboxGaugesConfig{Interval: -time.Second})
	_, bad["LeaseTTL"] = tel.OutboxGauges(pool, &idemotel.OutboxGaugesConfig{LeaseTTL: -time.Second})
	for field, err := range bad {
		if !errors.Is(err, idemotel.ErrInvalidConfig) || !errors.Is(err, outbox.ErrInvalidConfig) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: err = %v, want both ErrInvalidConfigs, naming %s", field, err, field)
		}
	}
}
