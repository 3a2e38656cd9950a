// Package migrate applies idem's embedded, versioned SQL migrations: the
// tables behind the idempotency, outbox and inbox packages.
//
// Files are named NNN_name.up.sql and NNN_name.down.sql and embedded with
// the go:embed directive. The set is validated when the package initialises: versions start
// at 1 with no gap, no duplicate, and both halves of every version present.
//
// Guarantees:
//   - each version runs in its own transaction together with the insertion of
//     its row in idem_migration, so a failing migration leaves the database at
//     the previous version with no partial objects;
//   - a transaction-scoped advisory lock, keyed by the current schema, makes
//     concurrent Up calls from several instances apply each version exactly
//     once.
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
