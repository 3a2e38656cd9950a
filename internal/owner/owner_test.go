package owner

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestDefault(t *testing.T) {
	a, b := Default(200), Default(200)
	if a == b {
		t.Fatalf("two owners of one process are both %q: the random part is missing", a)
	}
	host, _ := os.Hostname()
	if want := fmt.Sprintf("%s-%d-", host, os.Getpid()); !strings.HasPrefix(a, want) || len(a) != len(want)+6 {
		t.Fatalf("owner %q, want %s and 6 hex digits", a, want)
	}
	// Cut from the front: the random part, which tells processes apart,
	// is kept.
	if s := Default(8); len(s) != 8 || s[1] != '-' || strings.Trim(s[2:], "0123456789abcdef") != "" {
		t.Fatalf("Default(8) = %q: want the last 8 bytes (pid digit, '-', 6 hex digits)", s)
	}
}
