package migrate_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/migrate"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestEmbeddedSetIsValid(t *testing.T) {
	t.Parallel()
	m, err := migrate.Default()
	if err != nil {
		t.Fatal(err)
	}
	if m.Latest() < 3 {
		t.Fatalf("latest = %d, want at least 3", m.Latest())
	}
}

func TestLoadRejectsBadSets(t *testing.T) {
	t.Parallel()
	ok := func(v, name string) fstest.MapFS {
		return fstest.MapFS{
			"m/" + v + "_" + name + ".up.sql":   {Data: []byte("SELECT 1;")},
			"m/" + v + "_" + name + ".down.sql": {Data: []byte("SELECT 1;")},
		}
	}
	merge := func(fss ...fstest.MapFS) fstest.MapFS {
		out := fstest.MapFS{}
		for _, f := range fss {
			for k, v := range f {
				out[k] = v
			}
		}
		return out
	}
	testCases := []struct {
		name string
		fs   fstest.MapFS
		want string
	}{
		{"gap", merge(ok("001", "a"), ok("003", "c")), "gap"},
		{"starts at two", ok("002", "b"), "gap"},
		{"duplicate version", merge(ok("001", "a"), ok("001", "b")), "duplicate version 1"},
		{"missing down", fstest.MapFS{"m/001_a.up.sql": {Data: []byte("SELECT 1;")}}, "needs both"},
		{"bad name", merge(ok("001", "a"), fstest.MapFS{"m/2_b.up.sql": {Data: []byte("x")}}), "does not match"},
		{"empty file", fstest.MapFS{"m/001_a.up.sql": {Data: []byte(" \n")}, "m/001_a.down.sql": {Data: []byte("SELECT 1;")}}, "empty"},
	}
	for _, tt := range testCases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := migrate.Load(tt.fs, "m")
			if !errors.Is(err, migrate.ErrInvalidSet) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrInvalidSet containing %q", err, tt.want)
			}
		})
	}
	if _, err := migrate.Load(merge(ok("001", "a"), ok("002", "b")), "m"); err != nil {
		t.Fatalf("valid set rejected: %v", err)
	}
}

func tableExists(t *testing.T, db *testdb.DB, name string) bool {
	t.Helper()
	var ok bool
	if err := db.Pool.QueryRow(context.Background(), `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

func TestUpDownStatus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t, testdb.Empty())

	st, err := migrate.GetStatus(ctx, db.Pool)
	if err != nil || st.Current != 0 || st.Pending() != st.Latest {
		t.Fatalf("fresh status = %+v, %v", st, err)
	}
	applied, err := migrate.Up(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := migrate.Default()
	if len(applied) != m.Latest() {
		t.Fatalf("applied %v, want %d versions", applied, m.Latest())
	}
	if again, err := migrate.Up(ctx, db.Pool); err != nil || len(again) != 0 {
		t.Fatalf("second Up applied %v, %v", again, err)
	}
	st, err = migrate.GetStatus(ctx, db.Pool)
	if err != nil || st.Current != m.Latest() || st.Pending() != 0 {
		t.Fatalf("status after up = %+v, %v", st, err)
	}
	for i := m.Latest(); i > 0; i-- {
		v, err := migrate.Down(ctx, db.Pool)
		if err != nil || v != i {
			t.Fatalf("Down = %d, %v; want %d", v, err, i)
		}
	}
	if _, err := migrate.Down(ctx, db.Pool); !errors.Is(err, migrate.ErrNothingToRevert) {
		t.Fatalf("Down at 0: %v, want ErrNothingToRevert", err)
	}
	for _, tbl := range []string{"idempotency_key", "outbox_event", "processed_event"} {
		if tableExists(t, db, tbl) {
			t.Errorf("table %s still exists after reverting everything", tbl)
		}
	}
}

// Eight instances starting at once, each on its own connection: every
// version must be applied exactly once. A version applied twice would fail
// (CREATE TABLE without IF NOT EXISTS), and the counter table records each
// execution of each up script.
func TestConcurrentUpAppliesEachVersionOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t, testdb.Empty(), testdb.MaxConns(2))
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE runs (version int)`); err != nil {
		t.Fatal(err)
	}
	set := fstest.MapFS{}
	for _, v := range []string{"001", "002", "003", "004", "005"} {
		set["m/"+v+"_t.up.sql"] = &fstest.MapFile{Data: []byte(
			"CREATE TABLE t" + v + " (id int); INSERT INTO runs VALUES (" + v + "); SELECT pg_sleep(0.02);")}
		set["m/"+v+"_t.down.sql"] = &fstest.MapFile{Data: []byte("DROP TABLE t" + v + ";")}
	}
	m, err := migrate.Load(set, "m")
	if err != nil {
		t.Fatal(err)
	}

	const instances = 8
	var wg sync.WaitGroup
	errs := make(chan error, instances)
	total := make(chan int, instances)
	start := make(chan struct{})
	for range instances {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.Connect(ctx, db.URL)
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close(ctx)
			<-start
			applied, err := m.Up(ctx, conn)
			if err != nil {
				errs <- err
				return
			}
			total <- len(applied)
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	close(total)
	for err := range errs {
		t.Fatalf("instance failed: %v", err)
	}
	sum := 0
	for n := range total {
		sum += n
	}
	if sum != 5 {
		t.Fatalf("instances reported %d applications in all, want 5", sum)
	}
	var runs, distinct int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT version) FROM runs`).Scan(&runs, &distinct); err != nil {
		t.Fatal(err)
	}
	if runs != 5 || distinct != 5 {
		t.Fatalf("up scripts ran %d times over %d versions, want 5 and 5", runs, distinct)
	}
}

// A migration that fails half way (its first statement succeeds, its second
// fails) leaves the database at the previous version, with no trace of the
// first statement.
func TestFailingMigrationLeavesPreviousVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t, testdb.Empty())
	set := fstest.MapFS{
		"m/001_good.up.sql":   {Data: []byte("CREATE TABLE good (id int);")},
		"m/001_good.down.sql": {Data: []byte("DROP TABLE good;")},
		"m/002_bad.up.sql": {Data: []byte(`CREATE TABLE half (id int);
CREATE INDEX half_idx ON half (id);
INSERT INTO good VALUES (1);
SELECT * FROM no_such_table;`)},
		"m/002_bad.down.sql": {Data: []byte("DROP TABLE half;")},
	}
	m, err := migrate.Load(set, "m")
	if err != nil {
		t.Fatal(err)
	}
	applied, err := m.Up(ctx, db.Pool)
	if err == nil || !strings.Contains(err.Error(), "version 2") {
		t.Fatalf("Up err = %v, want failure in version 2", err)
	}
	if len(applied) != 1 || applied[0] != 1 {
		t.Fatalf("applied = %v, want [1]", applied)
	}
	st, err := m.Status(ctx, db.Pool)
	if err != nil || st.Current != 1 {
		t.Fatalf("status = %+v, %v; want version 1", st, err)
	}
	if tableExists(t, db, "half") || tableExists(t, db, "half_idx") {
		t.Fatal("partial objects of the failed migration remain")
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM good`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows written by the failed migration: %d, %v", n, err)
	}
}

func TestUnknownVersionIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	if _, err := db.Pool.Exec(ctx, `INSERT INTO `+migrate.VersionTable+` (version, name) VALUES (999, 'future')`); err != nil {
		t.Fatal(err)
	}
	if _, err := migrate.Up(ctx, db.Pool); !errors.Is(err, migrate.ErrUnknownVersion) {
		t.Fatalf("Up = %v, want ErrUnknownVersion", err)
	}
}

func TestSQLScript(t *testing.T) {
	t.Parallel()
	m, _ := migrate.Default()
	up := m.SQL(false)
	for _, want := range []string{"CREATE TABLE idempotency_key", "CREATE TABLE outbox_event", "CREATE TABLE processed_event", "INSERT INTO idem_migration"} {
		if !strings.Contains(up, want) {
			t.Errorf("up script lacks %q", want)
		}
	}
	down := m.SQL(true)
	if strings.Index(down, "processed_event") > strings.Index(down, "idempotency_key") {
		t.Error("down script does not run newest first")
	}
}

// An application's own set, recorded in its own table, lives beside idem's
// in one schema without either seeing the other's versions.
func TestWithTableKeepsSetsApart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	app, err := migrate.Load(fstest.MapFS{
		"m/001_orders.up.sql":   {Data: []byte("CREATE TABLE orders (id int);")},
		"m/001_orders.down.sql": {Data: []byte("DROP TABLE orders;")},
	}, "m")
	if err != nil {
		t.Fatal(err)
	}
	app = app.WithTable("app_migration")
	if applied, err := app.Up(ctx, db.Pool); err != nil || len(applied) != 1 {
		t.Fatalf("app Up = %v, %v", applied, err)
	}
	st, err := app.Status(ctx, db.Pool)
	if err != nil || st.Current != 1 {
		t.Fatalf("app status = %+v, %v", st, err)
	}
	idem, err := migrate.GetStatus(ctx, db.Pool)
	if err != nil || idem.Pending() != 0 {
		t.Fatalf("idem status = %+v, %v", idem, err)
	}
	if v, err := app.Down(ctx, db.Pool); err != nil || v != 1 || tableExists(t, db, "orders") {
		t.Fatalf("app Down = %d, %v", v, err)
	}
	if tableExists(t, db, "app_migration") && !tableExists(t, db, "idempotency_key") {
		t.Fatal("app Down touched idem's tables")
	}
}
