package pgtemp_test

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/internal/faultproxy"
	"github.com/idemkit/idem/internal/pgtemp"
)

// TestOnlyThePasswordGetsIn: the cluster is not open to every local user.
// Real connection attempts, over TCP and over the Unix socket, without the
// password or with a wrong one, are refused by the server itself
// (SQLSTATE 28P01, invalid_password); the URL's password gets in, also
// through a TCP proxy (the chaos harness's faultproxy) and after an
// immediate restart. The directory holding the socket and the data
// directory are the cluster user's alone, and no password file is left.
func TestOnlyThePasswordGetsIn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, err := pgtemp.Start(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	u, err := url.Parse(c.URL)
	if err != nil {
		t.Fatal(err)
	}
	pw, ok := u.User.Password()
	if !ok || len(pw) < 32 {
		t.Errorf("Cluster.URL carries no password of at least 32 characters: %q", u.User)
	}
	refused := func(what, connString string) {
		t.Helper()
		conn, err := pgx.Connect(ctx, connString)
		if err == nil {
			conn.Close(ctx)
			t.Errorf("%s: connected", what)
			return
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "28P01" {
			t.Errorf("%s: %v, want the server's refusal (SQLSTATE 28P01)", what, err)
		}
	}
	tcp := "postgres://postgres@127.0.0.1:" + strconv.Itoa(c.Port) + "/postgres?sslmode=disable"
	refused("TCP without a password", tcp)
	refused("TCP with a wrong password", "postgres://postgres:"+pw+"x@127.0.0.1:"+strconv.Itoa(c.Port)+"/postgres?sslmode=disable")
	sock := "host=" + c.Dir + " port=" + strconv.Itoa(c.Port) + " user=postgres dbname=postgres"
	refused("the Unix socket without a password", sock)
	conn, err := pgx.Connect(ctx, sock+" password="+pw)
	if err != nil {
		t.Fatalf("the Unix socket with the password: %v", err)
	}
	conn.Close(ctx)
	if st, err := os.Stat(filepath.Join(c.Dir, ".s.PGSQL."+strconv.Itoa(c.Port))); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("the socket in Cluster.Dir: %v, want mode 0700 (%v)", st, err)
	}
	hba, err := os.ReadFile(filepath.Join(c.Dir, "data", "pg_hba.conf"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(hba), "\n") {
		if f := strings.Fields(line); len(f) > 0 && !strings.HasPrefix(f[0], "#") && f[len(f)-1] != "scram-sha-256" {
			t.Errorf("pg_hba.conf line %q does not ask for scram-sha-256", line)
		}
	}

	for _, d := range []string{c.Dir, filepath.Join(c.Dir, "data")} {
		st, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o700 {
			t.Errorf("%s is %v, want 0700", d, st.Mode().Perm())
		}
	}
	entries, err := os.ReadDir(c.Dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if b, err := os.ReadFile(filepath.Join(c.Dir, e.Name())); err == nil && pw != "" && strings.Contains(string(b), pw) {
			t.Errorf("%s holds the password after the start", e.Name())
		}
	}

	p, err := faultproxy.Listen("127.0.0.1:0", "127.0.0.1:"+strconv.Itoa(c.Port))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	viaProxy := *u
	viaProxy.Host = p.Addr()
	if err := c.Restart(ctx, pgtemp.StopImmediate); err != nil {
		t.Fatal(err)
	}
	conn, err = pgx.Connect(ctx, viaProxy.String())
	if err != nil {
		t.Fatalf("through the proxy after an immediate restart: %v", err)
	}
	var user string
	if err := conn.QueryRow(ctx, "SELECT current_user").Scan(&user); err != nil || user != "postgres" {
		t.Fatalf("current_user %q %v", user, err)
	}
	conn.Close(ctx)
	noPw := viaProxy
	noPw.User = url.User("postgres")
	refused("through the proxy without a password", noPw.String())
}
