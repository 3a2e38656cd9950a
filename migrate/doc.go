// Package migrate applies idem's embedded, versioned SQL migrations (the
// tables behind the idempotency, outbox and inbox packages) and, with the
// same machinery, an application's own set.
//
// Usage:
//
//	applied, err := migrate.Up(ctx, pool) // idem's tables, once per deploy
//	// or: idem migrate up
//	m, err := migrate.Load(appMigrations, "migrations", &migrate.Config{Table: "app_migration"})
//	_, err = m.Up(ctx, pool) // an application's own set
//
// # Guarantees
//
// Files are named NNN_name.up.sql and NNN_name.down.sql and embedded with
// the go:embed directive. A set is validated when it is loaded (idem's own
// when the package initialises): versions start at 1 with no gap, no
// duplicate, and both halves of every version present.
//
// Guarantees:
//   - each version runs in its own transaction together with the insertion of
//     its row in the version table, so a failing or cancelled migration (a
//     SIGTERM during a deploy) leaves the database at the previous version
//     with no partial objects;
//   - a transaction-scoped advisory lock, keyed by the current schema and
//     the version table, makes concurrent Up calls from several instances
//     apply each version exactly once;
//   - every applied version's row records the checksum of its up script
//     (Migration.Checksum). Up, Down and Status compare the recorded name
//     and checksum with the set and refuse, with ErrMigrationChanged naming
//     the version, a migration edited or renamed after it was applied:
//     applying more on top of a schema that is not what the files say is a
//     guess. A change belongs in a new version.
//
// Databases migrated before checksums were recorded keep working: their
// version table gets a nullable checksum column on the next Up, and the
// rows that lack a checksum are given the set's (their names must match).
// That is trust on first sight, the only choice the old rows allow: an edit
// made before that Up goes unnoticed, every later one is caught. Until
// then Status reports such rows as StateNoChecksum and takes no action.
//
// Not guaranteed: statements that cannot run inside a transaction (CREATE
// INDEX CONCURRENTLY, ALTER TYPE … ADD VALUE before PostgreSQL 12) are not
// supported in a migration file.
//
// Tables are created in the current schema (the first entry of search_path),
// which is how tests give every test its own schema. Teams that run goose,
// atlas or plain psql can print the SQL with Migrator.SQL or
// `idem migrate sql`.
package migrate
