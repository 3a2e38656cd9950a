package chaos

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/internal/testbin"
)

// Binaries built once for the package's tests. A build failure (billing
// being half-written, say) fails only the tests that need the binary.
var (
	idemBin, billingBin string
	idemErr, billingErr error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "chaos-test-")
	if err != nil {
		panic(err)
	}
	// Without the race detector, to keep the long chaos runs short;
	// cmd/billing's process tests run billing with it.
	idemBin, idemErr = testbin.Build(dir, "idem", "github.com/idemkit/idem/cmd/idem", false)
	billingBin, billingErr = testbin.Build(dir, "billing", "github.com/idemkit/idem/cmd/billing", false)
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func needIdem(t *testing.T) string {
	t.Helper()
	if idemErr != nil {
		t.Fatal(idemErr)
	}
	return idemBin
}

func needBilling(t *testing.T) string {
	t.Helper()
	if billingErr != nil {
		t.Fatal(billingErr)
	}
	return billingBin
}
