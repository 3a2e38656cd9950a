package migrate_test

import (
	"context"
	"errors"
	"fmt"
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
			_, err := migrate.Load(tt.fs, "m", nil)
			if !errors.Is(err, migrate.ErrInvalidSet) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrInvalidSet containing %q", err, tt.want)
			}
		})
	}
	if _, err := migrate.Load(merge(ok("001", "a"), ok("002", "b")), "m", nil); err != nil {
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
	m, err := migrate.Load(set, "m", nil)
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
	m, err := migrate.Load(set, "m", nil)
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
	}, "m", &migrate.Config{Table: "app_migration"})
	if err != nil {
		t.Fatal(err)
	}
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

// set builds a migration set from version → [name, up].
func appSet(t *testing.T, steps ...[2]string) *migrate.Migrator {
	t.Helper()
	fs := fstest.MapFS{}
	for i, st := range steps {
		v := fmt.Sprintf("%03d", i+1)
		fs["m/"+v+"_"+st[0]+".up.sql"] = &fstest.MapFile{Data: []byte(st[1])}
		fs["m/"+v+"_"+st[0]+".down.sql"] = &fstest.MapFile{Data: []byte("SELECT 1;")}
	}
	m, err := migrate.Load(fs, "m", &migrate.Config{Table: "app_migration"})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// An applied migration whose file was edited afterwards is refused by Up,
// Down and Status, with an error naming the version: applying the rest on
// top of a schema that is not what the files say would be a guess.
func TestChangedMigrationIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	orig := appSet(t, [2]string{"a", "CREATE TABLE a (id int);"}, [2]string{"b", "CREATE TABLE b (id int);"})
	if _, err := orig.Up(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	edited := appSet(t, [2]string{"a", "CREATE TABLE a (id bigint);"}, [2]string{"b", "CREATE TABLE b (id int);"},
		[2]string{"c", "CREATE TABLE c (id int);"})
	want := func(op string, err error) {
		t.Helper()
		if !errors.Is(err, migrate.ErrMigrationChanged) || !strings.Contains(err.Error(), "version 1 (a)") || !strings.Contains(err.Error(), "checksum") {
			t.Errorf("%s = %v, want ErrMigrationChanged naming version 1 (a) and its checksum", op, err)
		}
	}
	applied, err := edited.Up(ctx, db.Pool)
	want("Up", err)
	if len(applied) != 0 || tableExists(t, db, "c") {
		t.Errorf("Up applied %v (table c exists: %v) on top of a changed migration", applied, tableExists(t, db, "c"))
	}
	_, err = edited.Down(ctx, db.Pool)
	want("Down", err)
	if !tableExists(t, db, "b") {
		t.Error("Down reverted a version despite the changed migration")
	}
	st, err := edited.Status(ctx, db.Pool)
	want("Status", err)
	if st == nil || st.Migrations[0].State() != migrate.StateChecksumMismatch || st.Migrations[1].State() != migrate.StateApplied ||
		st.Migrations[2].State() != migrate.StatePending || !st.Migrations[0].Changed() {
		t.Fatalf("status = %+v", st)
	}
	// Whitespace around the script and CRLF line ends are not a change.
	same := appSet(t, [2]string{"a", "\r\n  CREATE TABLE a (id int);\r\n\n"}, [2]string{"b", "CREATE TABLE b (id int);"})
	if st, err := same.Status(ctx, db.Pool); err != nil || st.Migrations[0].State() != migrate.StateApplied {
		t.Fatalf("a reformatted file: status %+v, %v", st, err)
	}
}

// A file renamed after it was applied (same version, same SQL, another
// name) is refused too: the name is what people read in status and logs.
func TestRenamedMigrationIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	if _, err := appSet(t, [2]string{"a", "CREATE TABLE a (id int);"}).Up(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	renamed := appSet(t, [2]string{"create_a", "CREATE TABLE a (id int);"}, [2]string{"b", "CREATE TABLE b (id int);"})
	_, err := renamed.Up(ctx, db.Pool)
	if !errors.Is(err, migrate.ErrMigrationChanged) || !strings.Contains(err.Error(), "version 1") ||
		!strings.Contains(err.Error(), `"a"`) || !strings.Contains(err.Error(), `"create_a"`) {
		t.Fatalf("Up = %v, want ErrMigrationChanged naming version 1, a and create_a", err)
	}
	st, _ := renamed.Status(ctx, db.Pool)
	if st == nil || st.Migrations[0].State() != migrate.StateRenamed || st.Migrations[0].AppliedName != "a" {
		t.Fatalf("status = %+v", st)
	}
}

// A database migrated before checksums were recorded (a version table
// without the checksum column) keeps working: Status reads it without
// changing it, and the next Up adds the column and records the checksums
// of the applied versions as this binary has them (trust on first sight),
// after which an edit is caught like any other.
func TestLegacyVersionTableIsBackfilled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	// The version table and rows exactly as the previous release wrote them.
	for _, q := range []string{
		`CREATE TABLE app_migration (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`,
		`CREATE TABLE a (id int)`,
		`INSERT INTO app_migration (version, name) VALUES (1, 'a')`,
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	m := appSet(t, [2]string{"a", "CREATE TABLE a (id int);"}, [2]string{"b", "CREATE TABLE b (id int);"})
	st, err := m.Status(ctx, db.Pool)
	if err != nil || st.Current != 1 || st.Migrations[0].State() != migrate.StateNoChecksum {
		t.Fatalf("legacy status = %+v, %v", st, err)
	}
	if applied, err := m.Up(ctx, db.Pool); err != nil || len(applied) != 1 || applied[0] != 2 {
		t.Fatalf("Up on a legacy table = %v, %v", applied, err)
	}
	var nulls int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM app_migration WHERE checksum IS NULL`).Scan(&nulls); err != nil || nulls != 0 {
		t.Fatalf("%d rows without a checksum after Up, %v", nulls, err)
	}
	st, err = m.Status(ctx, db.Pool)
	if err != nil || st.Migrations[0].State() != migrate.StateApplied || st.Migrations[1].State() != migrate.StateApplied {
		t.Fatalf("status after backfill = %+v, %v", st, err)
	}
	edited := appSet(t, [2]string{"a", "CREATE TABLE a (id text);"}, [2]string{"b", "CREATE TABLE b (id int);"})
	if _, err := edited.Up(ctx, db.Pool); !errors.Is(err, migrate.ErrMigrationChanged) {
		t.Fatalf("edit after backfill: Up = %v, want ErrMigrationChanged", err)
	}
}

func TestChecksumIsRecordedAndExposed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t, testdb.Empty())
	m, _ := migrate.Default()
	if _, err := m.Up(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	for _, mig := range m.Migrations() {
		var sum string
		if err := db.Pool.QueryRow(ctx, `SELECT checksum FROM `+migrate.VersionTable+` WHERE version = $1`, mig.Version).Scan(&sum); err != nil {
			t.Fatal(err)
		}
		if len(mig.Checksum) != 64 || sum != mig.Checksum {
			t.Errorf("version %d: recorded %q, set has %q", mig.Version, sum, mig.Checksum)
		}
	}
	if !strings.Contains(m.SQL(false), m.Migrations()[0].Checksum) {
		t.Error("the SQL script does not record checksums")
	}
}

func TestInvalidConfig(t *testing.T) {
	t.Parallel()
	fs := fstest.MapFS{"m/001_a.up.sql": {Data: []byte("SELECT 1;")}, "m/001_a.down.sql": {Data: []byte("SELECT 1;")}}
	for _, table := range []string{"Bad-Name", "1abc", strings.Repeat("x", 64), "a b", `a"b`} {
		if _, err := migrate.Load(fs, "m", &migrate.Config{Table: table}); !errors.Is(err, migrate.ErrInvalidConfig) || !strings.Contains(err.Error(), "Table") {
			t.Errorf("Table %q: err %v, want ErrInvalidConfig naming Table", table, err)
		}
	}
}
