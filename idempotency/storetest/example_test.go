package storetest_test

import (
	"testing"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/idempotency/storetest"
)

// A store's own test runs the suite; each subtest gets a fresh store.
func ExampleRun() {
	testMyStore := func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) idempotency.Store {
			return idempotency.NewMemoryStore() // or your own Store
		})
	}
	_ = testMyStore
}
