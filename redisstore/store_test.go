package redisstore_test

import (
	"testing"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/idempotency/storetest"
)

func TestStoreConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) idempotency.Store { return newSetup(t, nil).store })
}
