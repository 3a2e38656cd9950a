package pgtemp_test

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
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
