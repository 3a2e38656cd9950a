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
	stdout, stderr, code := testbin.Run(t, bin, []string{"DATABASE_URL=::bad"}, "migrate", "up")
	if code != 2 || stdout != "" || !strings.Contains(stderr, "malformed") {
		t.Fatalf("Run = %q, %q, exit %d; want the child's stderr and exit 2", stdout, stderr, code)
	}
	var buf testbin.Buffer
	buf.Write([]byte("a"))
	buf.Write([]byte("b"))
	if buf.String() != "ab" {
		t.Fatalf("Buffer = %q", buf.String())
	}
	if _, err := testbin.Build(dir, "missing", "github.com/idemkit/idem/no/such/package", false); err == nil {
		t.Fatal("building a missing package succeeded")
	}
}
