package main

import (
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/internal/testbin"
	"github.com/idemkit/idem/internal/testdb"
)

var idemBin string

func TestMain(m *testing.M) {
	// The WAL outbox's status and bench need wal_level=logical.
	stopLogical, err := testdb.LogicalMain()
	if err != nil {
		panic(err)
	}
	dir, err := os.MkdirTemp("", "idem-cli-")
	if err != nil {
		panic(err)
	}
	if idemBin, err = testbin.Build(dir, "idem", ".", false); err != nil {
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(dir)
	stopLogical()
	if code == 0 {
		// bench http's Fiber variants leave goroutines that are not ours
		// to stop: fasthttp's worker pool cleaner sleeps out its interval
		// after the server stopped, its server date updater lives as long
		// as the process, and so do the GC of the memory storage that
		// Fiber's own idempotency middleware creates (it cannot be closed
		// from outside) and its clock.
		if err := goleak.Find(
			goleak.IgnoreAnyFunction("github.com/gofiber/fiber/v3/internal/storage/memory.(*Storage).gc"),
			goleak.IgnoreAnyFunction("github.com/gofiber/utils/v2.StartTimeStampUpdater.func1.1"),
			goleak.IgnoreAnyFunction("github.com/gofiber/fiber/v3/internal/storage/memory.New.StartTimeStampUpdater.func1.1"),
			goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
			goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		); err != nil {
			println("goleak:", err.Error())
			code = 1
		}
	}
	os.Exit(code)
}

// runIdem runs the built binary with env added and returns stdout, stderr
// and the exit status.
func runIdem(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	return testbin.Run(t, idemBin, env, args...)
}

func TestBadInputIsOneLineError(t *testing.T) {
	t.Parallel()
	testCases := []struct {
		name     string
		env      []string
		args     []string
		wantCode int
		wantErr  string
	}{
		{"unknown command", nil, []string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{"no command", nil, nil, 2, "missing command"},
		{"unknown migrate action", nil, []string{"migrate", "sideways"}, 2, `unknown action "sideways"`},
		{"bad flag", nil, []string{"migrate", "--nope", "up"}, 2, "flag provided but not defined: -nope"},
		{"malformed URL", []string{"DATABASE_URL=::not a url"}, []string{"migrate", "up"}, 2, "malformed"},
		{"unreachable database", []string{"DATABASE_URL=postgres://postgres@127.0.0.1:1/x?connect_timeout=2"}, []string{"migrate", "status"}, 1, "unreachable"},
	}
	for _, tt := range testCases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, stderr, code := runIdem(t, tt.env, tt.args...)
			if code != tt.wantCode {
				t.Errorf("exit %d, want %d (stderr %q)", code, tt.wantCode, stderr)
			}
			if strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tt.wantErr) {
				t.Errorf("stderr = %q, want one line containing %q", stderr, tt.wantErr)
			}
			if strings.Contains(stderr, "goroutine") || strings.Contains(stderr, "panic") {
				t.Errorf("stack trace in stderr: %q", stderr)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--help"}, {"migrate", "--help"}} {
		stdout, stderr, code := runIdem(t, nil, args...)
		if code != 0 || stderr != "" || !strings.Contains(stdout, "Usage") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
	}
}

func TestMigrateUpStatusDown(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, testdb.Empty())
	env := []string{"DATABASE_URL=" + db.URL}
	out, stderr, code := runIdem(t, env, "migrate", "up")
	if code != 0 || !strings.Contains(out, "applied 001_") {
		t.Fatalf("up: exit %d, %q %q", code, out, stderr)
	}
	out, _, code = runIdem(t, env, "migrate", "status")
	if code != 0 || !strings.Contains(out, "0 pending") {
		t.Fatalf("status after up: exit %d, %q", code, out)
	}
	out, _, code = runIdem(t, env, "migrate", "down")
	if code != 0 || !strings.Contains(out, "reverted") {
		t.Fatalf("down: exit %d, %q", code, out)
	}
	out, _, code = runIdem(t, env, "migrate", "status")
	if code != 0 || !strings.Contains(out, "1 pending") {
		t.Fatalf("status after down: exit %d, %q", code, out)
	}
	out, _, code = runIdem(t, nil, "migrate", "sql")
	if code != 0 || !strings.Contains(out, "CREATE TABLE idempotency_key") {
		t.Fatalf("sql: exit %d", code)
	}
}
