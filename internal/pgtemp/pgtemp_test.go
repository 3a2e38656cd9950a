package pgtemp_test

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/internal/pgtemp"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStartQueryClose(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, err := pgtemp.Start(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1), (2)"); err != nil {
		t.Fatal(err)
	}
	var n int
	var user string
	if err := conn.QueryRow(ctx, "SELECT count(*), current_user FROM t").Scan(&n, &user); err != nil {
		t.Fatal(err)
	}
	if n != 2 || user != "postgres" {
		t.Fatalf("count %d user %q", n, user)
	}
	// Close disconnects sessions: the open connection does not hold it up.
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	_ = conn.Close(ctx)
	if _, err := os.Stat(c.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("directory %s still there after Close: %v", c.Dir, err)
	}
	d, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(c.Port), time.Second)
	if err == nil {
		d.Close()
		t.Fatalf("port %d still accepts connections after Close", c.Port)
	}
}

func TestTwoClustersAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, err := pgtemp.Start(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := pgtemp.Start(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if a.URL == b.URL || a.Dir == b.Dir {
		t.Fatalf("clusters share %s / %s", a.URL, a.Dir)
	}
}

func TestBadConfig(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if _, err := pgtemp.Start(ctx, &pgtemp.Config{BinDir: t.TempDir()}); !errors.Is(err, pgtemp.ErrNoBinaries) {
		t.Errorf("empty BinDir: %v, want ErrNoBinaries", err)
	}
	if os.Geteuid() == 0 {
		if _, err := pgtemp.Start(ctx, &pgtemp.Config{User: "no-such-user-pgtemp"}); !errors.Is(err, pgtemp.ErrNoUser) {
			t.Errorf("unknown user: %v, want ErrNoUser", err)
		}
	}
	if _, err := pgtemp.Start(ctx, &pgtemp.Config{StartTimeout: -time.Second}); err == nil {
		t.Error("negative StartTimeout accepted")
	}
}

func TestFindBinDir(t *testing.T) {
	t.Parallel()
	d, err := pgtemp.FindBinDir()
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"initdb", "postgres"} {
		if _, err := os.Stat(d + "/" + b); err != nil {
			t.Error(err)
		}
	}
}

func ExampleStart() {
	c, err := pgtemp.Start(context.Background(), nil)
	if err != nil {
		panic(err)
	}
	defer c.Close()
	conn, err := pgx.Connect(context.Background(), c.URL)
	if err != nil {
		panic(err)
	}
	defer conn.Close(context.Background())
}

// Restart in immediate mode is a crash: connections are dropped, the next
// start runs crash recovery, and every committed row is still there.
func TestRestartImmediateIsACrashThatLosesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var log syncBuffer
	c, err := pgtemp.Start(ctx, &pgtemp.Config{Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	// Many small commits right before the crash: with synchronous_commit
	// off the last ones would be lost.
	for i := range 300 {
		if _, err := conn.Exec(ctx, "INSERT INTO t VALUES ($1)", i); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Restart(ctx, pgtemp.StopImmediate); err != nil {
		t.Fatal(err)
	}
	if err := conn.Ping(ctx); err == nil {
		t.Fatal("a connection opened before the crash still works")
	}
	if !strings.Contains(log.String(), "automatic recovery in progress") {
		t.Fatalf("no crash recovery after an immediate restart; server log:\n%s", log.String())
	}
	conn2, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close(ctx)
	var n int
	if err := conn2.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 300 {
		t.Fatalf("%d rows after the crash, want 300", n)
	}
	// A fast restart is clean: no recovery this time.
	before := strings.Count(log.String(), "automatic recovery in progress")
	if err := c.Restart(ctx, pgtemp.StopFast); err != nil {
		t.Fatal(err)
	}
	if strings.Count(log.String(), "automatic recovery in progress") != before {
		t.Error("a fast restart ran crash recovery")
	}
	if err := c.Restart(ctx, "sideways"); err == nil {
		t.Error("Restart accepted an unknown mode")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(ctx, pgtemp.StopImmediate); !errors.Is(err, pgtemp.ErrClosed) {
		t.Fatalf("Restart after Close: %v, want ErrClosed", err)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
