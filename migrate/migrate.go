package migrate

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

//go:embed migrations/*.sql
var embedded embed.FS

// Errors returned by this package. Use errors.Is.
var (
	// ErrInvalidSet is returned when a set of migration files has a gap, a
	// duplicate version, a missing half or a file name that does not match
	// NNN_name.up.sql / NNN_name.down.sql.
	ErrInvalidSet = errors.New("migrate: invalid migration set")
	// ErrNothingToRevert is returned by Down when no version is applied.
	ErrNothingToRevert = errors.New("migrate: nothing to revert")
	// ErrUnknownVersion is returned when the database records a version this
	// binary does not know (a newer binary migrated it).
	ErrUnknownVersion = errors.New("migrate: database has a version this binary does not know")
)

// VersionTable is the table that records applied versions, created in the
// current schema (the first entry of search_path).
const VersionTable = "idem_migration"

// Migration is one numbered step.
type Migration struct {
	Version int
	Name    string
	Up      string
	Down    string
}

// DB is what the migrator needs: a way to begin transactions. *pgx.Conn,
// *pgxpool.Pool and pgx.Tx (savepoints) satisfy it.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Migrator applies a fixed, validated set of migrations.
type Migrator struct {
	migrations []Migration
	table      string
}

// WithTable returns a copy of m that records versions in table instead of
// VersionTable, so that an application can keep its own migration set (with
// its own numbering) beside idem's in one schema. The advisory lock is keyed
// by the table name too.
func (m *Migrator) WithTable(table string) *Migrator {
	c := *m
	c.table = table
	return &c
}

var fileRE = regexp.MustCompile(`^(\d{3,})_([a-z0-9_]+)\.(up|down)\.sql$`)

// defaultSet is validated once, when the package is initialised: a broken
// embedded set is a build defect, reported by every call (and by this
// package's tests) rather than discovered half way through a deploy.
var defaultSet, defaultSetErr = Load(embedded, "migrations")

// Load reads and validates NNN_name.up.sql / NNN_name.down.sql files from dir
// in fsys. Versions must start at 1 and be contiguous; each needs both files.
func Load(fsys fs.FS, dir string) (*Migrator, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidSet, err)
	}
	byVersion := map[int]*Migration{}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		m := fileRE.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("%w: file %q does not match NNN_name.(up|down).sql", ErrInvalidSet, e.Name())
		}
		v, _ := strconv.Atoi(m[1])
		body, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidSet, err)
		}
		mig := byVersion[v]
		if mig == nil {
			mig = &Migration{Version: v, Name: m[2]}
			byVersion[v] = mig
		} else if mig.Name != m[2] {
			return nil, fmt.Errorf("%w: duplicate version %d (%q and %q)", ErrInvalidSet, v, mig.Name, m[2])
		}
		dst := &mig.Up
		if m[3] == "down" {
			dst = &mig.Down
		}
		if *dst != "" {
			return nil, fmt.Errorf("%w: duplicate %s file for version %d", ErrInvalidSet, m[3], v)
		}
		if strings.TrimSpace(string(body)) == "" {
			return nil, fmt.Errorf("%w: %s is empty", ErrInvalidSet, e.Name())
		}
		*dst = string(body)
	}
	out := make([]Migration, 0, len(byVersion))
	for _, m := range byVersion {
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i, m := range out {
		if m.Version != i+1 {
			return nil, fmt.Errorf("%w: gap: expected version %d, found %d", ErrInvalidSet, i+1, m.Version)
		}
		if m.Up == "" || m.Down == "" {
			return nil, fmt.Errorf("%w: version %d (%s) needs both up and down files", ErrInvalidSet, m.Version, m.Name)
		}
	}
	return &Migrator{migrations: out, table: VersionTable}, nil
}

// Default returns the migrator for idem's embedded migrations.
func Default() (*Migrator, error) { return defaultSet, defaultSetErr }

// Up applies idem's embedded migrations; see Migrator.Up.
func Up(ctx context.Context, db DB) ([]int, error) {
	if defaultSetErr != nil {
		return nil, defaultSetErr
	}
	return defaultSet.Up(ctx, db)
}

// Down reverts the newest applied embedded migration; see Migrator.Down.
func Down(ctx context.Context, db DB) (int, error) {
	if defaultSetErr != nil {
		return 0, defaultSetErr
	}
	return defaultSet.Down(ctx, db)
}

// GetStatus reports the embedded migrations' state; see Migrator.Status.
func GetStatus(ctx context.Context, db DB) (*Status, error) {
	if defaultSetErr != nil {
		return nil, defaultSetErr
	}
	return defaultSet.Status(ctx, db)
}

// Migrations returns the set, oldest first.
func (m *Migrator) Migrations() []Migration { return append([]Migration(nil), m.migrations...) }

// Latest is the highest version in the set.
func (m *Migrator) Latest() int { return len(m.migrations) }

// lockAndPrepare takes the migration lock for the rest of tx and makes sure
// the version table exists. The lock key is derived from the current schema,
// so schemas migrate independently while instances sharing one schema
// serialise.
//
// Creating the table under the lock matters: two sessions running
// CREATE TABLE IF NOT EXISTS at once can both pass the existence check and
// one then fails on the catalog's unique index.
func lockAndPrepare(ctx context.Context, tx pgx.Tx, table string) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('idem.migrate:' || current_schema() || '.' || $1, 0))`, table); err != nil {
		return fmt.Errorf("migrate: lock: %w", err)
	}
	_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+pgx.Identifier{table}.Sanitize()+` (
		version    integer     PRIMARY KEY,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now()
	)`)
	if err != nil {
		return fmt.Errorf("migrate: create %s: %w", table, err)
	}
	return nil
}

func currentVersion(ctx context.Context, tx pgx.Tx, table string) (int, error) {
	var v int
	err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+pgx.Identifier{table}.Sanitize()).Scan(&v)
	if err != nil {
		return 0, fmt.Errorf("migrate: read version: %w", err)
	}
	return v, nil
}

// Up applies every pending migration, each in its own transaction together
// with its version row, and returns the versions it applied.
//
// Each transaction first takes a transaction-scoped advisory lock and reads
// the current version under it, so any number of instances may call Up at
// once: every version is applied exactly once, by whichever instance gets
// there first, and the others find nothing to do. A migration that fails
// rolls back whole; earlier versions stay applied.
//
// ctx governs every statement; cancelling it rolls back the version in hand.
func (m *Migrator) Up(ctx context.Context, db DB) ([]int, error) {
	var applied []int
	for {
		v, done, err := m.step(ctx, db)
		if err != nil {
			return applied, err
		}
		if done {
			return applied, nil
		}
		applied = append(applied, v)
	}
}

func (m *Migrator) step(ctx context.Context, db DB) (version int, done bool, err error) {
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := lockAndPrepare(ctx, tx, m.table); err != nil {
			return err
		}
		cur, err := currentVersion(ctx, tx, m.table)
		if err != nil {
			return err
		}
		if cur > len(m.migrations) {
			return fmt.Errorf("%w: database at %d, latest known %d", ErrUnknownVersion, cur, len(m.migrations))
		}
		if cur == len(m.migrations) {
			done = true
			return nil
		}
		next := m.migrations[cur]
		if _, err := tx.Exec(ctx, next.Up); err != nil {
			return fmt.Errorf("migrate: version %d (%s) up: %w", next.Version, next.Name, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{m.table}.Sanitize()+` (version, name) VALUES ($1, $2)`, next.Version, next.Name); err != nil {
			return fmt.Errorf("migrate: record version %d: %w", next.Version, err)
		}
		version = next.Version
		return nil
	})
	return version, done, err
}

// Down reverts the newest applied migration in one transaction with the
// removal of its version row, and returns the reverted version.
// ErrNothingToRevert when none is applied.
func (m *Migrator) Down(ctx context.Context, db DB) (int, error) {
	var reverted int
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := lockAndPrepare(ctx, tx, m.table); err != nil {
			return err
		}
		cur, err := currentVersion(ctx, tx, m.table)
		if err != nil {
			return err
		}
		if cur == 0 {
			return ErrNothingToRevert
		}
		if cur > len(m.migrations) {
			return fmt.Errorf("%w: database at %d, latest known %d", ErrUnknownVersion, cur, len(m.migrations))
		}
		mig := m.migrations[cur-1]
		if _, err := tx.Exec(ctx, mig.Down); err != nil {
			return fmt.Errorf("migrate: version %d (%s) down: %w", mig.Version, mig.Name, err)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM `+pgx.Identifier{m.table}.Sanitize()+` WHERE version = $1`, mig.Version); err != nil {
			return fmt.Errorf("migrate: remove version %d: %w", mig.Version, err)
		}
		reverted = mig.Version
		return nil
	})
	return reverted, err
}

// Status is the state of a database against a migration set.
type Status struct {
	Current    int // highest applied version, 0 for none
	Latest     int // highest version in the set
	Migrations []MigrationStatus
}

// Pending is the number of versions not yet applied.
func (s *Status) Pending() int { return s.Latest - s.Current }

// MigrationStatus is one version and whether it is applied.
type MigrationStatus struct {
	Version   int
	Name      string
	Applied   bool
	AppliedAt time.Time
}

// Status reads which versions are applied. It takes no lock and creates
// nothing: a database never migrated reports version 0.
func (m *Migrator) Status(ctx context.Context, db DB) (*Status, error) {
	st := &Status{Latest: len(m.migrations)}
	applied := map[int]time.Time{}
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, pgx.Identifier{m.table}.Sanitize()).Scan(&exists); err != nil {
			return fmt.Errorf("migrate: status: %w", err)
		}
		if !exists {
			return nil
		}
		rows, err := tx.Query(ctx, `SELECT version, applied_at FROM `+pgx.Identifier{m.table}.Sanitize()+` ORDER BY version`)
		if err != nil {
			return fmt.Errorf("migrate: status: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			var v int
			var at time.Time
			if err := rows.Scan(&v, &at); err != nil {
				return fmt.Errorf("migrate: status: %w", err)
			}
			applied[v] = at
			st.Current = max(st.Current, v)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	for _, mig := range m.migrations {
		at, ok := applied[mig.Version]
		st.Migrations = append(st.Migrations, MigrationStatus{Version: mig.Version, Name: mig.Name, Applied: ok, AppliedAt: at})
	}
	if st.Current > st.Latest {
		return st, fmt.Errorf("%w: database at %d, latest known %d", ErrUnknownVersion, st.Current, st.Latest)
	}
	return st, nil
}

// SQL returns the whole set as one script for teams that apply migrations
// with their own tool (goose, atlas, psql): every up step in order, or every
// down step newest first, each headed by a comment naming its version.
func (m *Migrator) SQL(down bool) string {
	var b strings.Builder
	if !down {
		for _, mig := range m.migrations {
			fmt.Fprintf(&b, "-- idem migration %03d_%s (up)\n%s\n", mig.Version, mig.Name, strings.TrimSpace(mig.Up))
			fmt.Fprintf(&b, "INSERT INTO %s (version, name) VALUES (%d, '%s');\n\n", m.table, mig.Version, mig.Name)
		}
		return "CREATE TABLE IF NOT EXISTS " + m.table + " (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now());\n\n" + b.String()
	}
	for i := len(m.migrations) - 1; i >= 0; i-- {
		mig := m.migrations[i]
		fmt.Fprintf(&b, "-- idem migration %03d_%s (down)\n%s\n", mig.Version, mig.Name, strings.TrimSpace(mig.Down))
		fmt.Fprintf(&b, "DELETE FROM %s WHERE version = %d;\n\n", m.table, mig.Version)
	}
	return b.String()
}
