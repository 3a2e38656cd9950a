package main

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/testdb"
)

// TestMigrateStatusShowsChangedMigrations proves that `idem migrate status`
// shows what the version table says of each applied migration against this
// binary's files, and fails (exit 1, one line naming the version) when an
// applied migration was edited or renamed; `up` refuses to go on top of it.
// A version table from before checksums reads as such, and the next `up`
// records them.
func TestMigrateStatusShowsChangedMigrations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t, testdb.Empty())
	env := []string{"DATABASE_URL=" + db.URL}
	exec := func(sql string) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	if _, stderr, code := runIdem(t, env, "migrate", "up"); code != 0 {
		t.Fatalf("up: exit %d, %s", code, stderr)
	}
	line := func(out, version, state string) bool {
		return regexp.MustCompile(`(?m)^\s+` + version + `\s+\w+\s+` + regexp.QuoteMeta(state)).MatchString(out)
	}

	// Applied, then "edited": the recorded checksum is not the file's.
	exec(`UPDATE idem_migration SET checksum = repeat('0', 64) WHERE version = 2`)
	out, stderr, code := runIdem(t, env, "migrate", "status")
	if code != 1 || !line(out, "002", "applied, checksum mismatch") || !line(out, "001", "applied 2") ||
		strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "version 2") {
		t.Fatalf("status of an edited migration: exit %d\nstdout:\n%s\nstderr: %s", code, out, stderr)
	}
	if _, stderr, code := runIdem(t, env, "migrate", "up"); code != 1 || !strings.Contains(stderr, "version 2") || !strings.Contains(stderr, "checksum") {
		t.Fatalf("up over an edited migration: exit %d, %s", code, stderr)
	}

	// Renamed after it was applied.
	exec(`UPDATE idem_migration SET checksum = NULL WHERE version = 2`)
	exec(`UPDATE idem_migration SET name = 'old_name' WHERE version = 3`)
	out, stderr, code = runIdem(t, env, "migrate", "status")
	if code != 1 || !line(out, "003", `applied, renamed (was "old_name")`) || !strings.Contains(stderr, `"old_name"`) {
		t.Fatalf("status of a renamed migration: exit %d\nstdout:\n%s\nstderr: %s", code, out, stderr)
	}
	exec(`UPDATE idem_migration SET name = 'processed_event' WHERE version = 3`)

	// A table from before checksums: readable, and backfilled by up.
	exec(`ALTER TABLE idem_migration DROP COLUMN checksum`)
	out, stderr, code = runIdem(t, env, "migrate", "status")
	if code != 0 || !line(out, "002", "applied, no checksum recorded") {
		t.Fatalf("status of a legacy table: exit %d\nstdout:\n%s\nstderr: %s", code, out, stderr)
	}
	if _, stderr, code := runIdem(t, env, "migrate", "up"); code != 0 {
		t.Fatalf("up on a legacy table: exit %d, %s", code, stderr)
	}
	out, _, code = runIdem(t, env, "migrate", "status")
	if code != 0 || strings.Contains(out, "no checksum") || !line(out, "002", "applied 2") {
		t.Fatalf("status after the backfill: exit %d\n%s", code, out)
	}
}
