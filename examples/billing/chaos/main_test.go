package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
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
	build := func(name, pkg string) (string, error) {
		p := filepath.Join(dir, name)
		out, err := exec.Command("go", "build", "-o", p, pkg).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
		return p, nil
	}
	idemBin, idemErr = build("idem", "github.com/idemkit/idem/cmd/idem")
	billingBin, billingErr = build("billing", "github.com/idemkit/idem/cmd/billing")
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
