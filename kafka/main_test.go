package kafka_test

import (
	"testing"

	"go.uber.org/goleak"
)

// One TestMain for the package: publisher tests (publisher*_test.go) and
// consumer tests (consumer*_test.go) share it.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
