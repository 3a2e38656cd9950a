package wal_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/internal/testdb"
)

// TestMain makes sure the tests decode a server with wal_level=logical:
// the local one when CI has set it, else a throwaway cluster.
func TestMain(m *testing.M) {
	stop, err := testdb.LogicalMain()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	stop()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
