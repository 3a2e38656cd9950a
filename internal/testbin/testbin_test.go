package testbin_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/internal/testbin"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestBuild(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin, err := testbin.Build(dir, "idem", "github.com/idemkit/idem/cmd/idem", false)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(bin) != dir {
		t.Fatalf("binary at %s, want it in %s", bin, dir)
	}
	out, err := exec.Command(bin, "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Usage: idem") {
		t.Fatalf("built binary ran: %q, %v", out, err)
	}
	if _, err := testbin.Build(dir, "missing", "github.com/idemkit/idem/no/such/package", false); err == nil {
		t.Fatal("building a missing package succeeded")
	}
}
