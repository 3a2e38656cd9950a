package migrate

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
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
	// ErrMigrationChanged is returned by Up, Down and Status when a version
	// recorded as applied differs from the one in the set: its up script's
	// checksum is not the recorded one (the file was edited after it was
	// applied) or its name is not (the file was renamed). The error names
	// the version. Nothing is applied or reverted: the schema is no longer
	// what the files say, and a fix belongs in a new version.
	ErrMigrationChanged = errors.New("migrate: an applied migration was changed")
	// ErrInvalidConfig is returned by Load for a bad Config; the error names
	// the field.
	ErrInvalidConfig = errors.New("migrate: invalid config")
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
	// Checksum is the hex SHA-256 of Up, with CRLF line ends read as LF and
	// the whitespace around the script trimmed (so that an editor's
	// reformatting is not a change). It is recorded with the version when
	// applied, and compared on every later Up, Down and Status.
	Checksum string
}

// checksum is Migration.Checksum of an up script.
func checksum(up string) string {
	sum := sha256.Sum256([]byte(strings.TrimSpace(strings.ReplaceAll(up, "\r\n", "\n"))))
	return hex.EncodeToString(sum[:])
}

// DB is what the migrator needs: a way to begin transactions. *pgx.Conn,
// *pgxpool.Pool and pgx.Tx (savepoints) satisfy it. It is the narrowest
// seam that lets each version run in a transaction of its own.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Migrator applies a fixed, validated set of migrations.
type Migrator struct {
	migrations []Migration
	table      string
}

// TableDefault is Config.Table's default: idem's own version table.
const TableDefault = VersionTable

// Config configures a Migrator. A nil Config means all defaults.
type Config struct {
	// Table is the table that records the set's applied versions, in the
	// current schema. An application keeps its own migration set (with its
	// own numbering) beside idem's in one schema by giving it a table of
	// its own; the advisory lock that serialises concurrent Up calls is
	// keyed by the table too. It must be a lower-case SQL identifier
	// ([a-z_][a-z0-9_]*, at most 63 bytes). Defaults to TableDefault
	// ("idem_migration").
	Table string
}

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

func (c *Config) withDefaults() Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.Table == "" {
		out.Table = TableDefault
	}
	return out
}

func (c *Config) validate() error {
	if !identRE.MatchString(c.Table) {
		return fmt.Errorf("%w: Table %q is not a lower-case SQL identifier of at most 63 bytes", ErrInvalidConfig, c.Table)
	}
	return nil
}

var fileRE = regexp.MustCompile(`^(\d{3,})_([a-z0-9_]+)\.(up|down)\.sql$`)

// defaultSet is validated once, when the package is initialised: a broken
// embedded set is a build defect, reported by every call (and by this
// package's tests) rather than discovered half way through a deploy.
var defaultSet, defaultSetErr = Load(embedded, "migrations", nil)

// Load reads and validates NNN_name.up.sql / NNN_name.down.sql files from dir
// in fsys, for a Migrator configured by cfg (nil: all defaults). Versions
// must start at 1 and be contiguous; each needs both files.
func Load(fsys fs.FS, dir string, cfg *Config) (*Migrator, error) {
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
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
		m.Checksum = checksum(m.Up)
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
	return &Migrator{migrations: out, table: c.Table}, nil
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
// the version table exists, with its checksum column. The lock key is
// derived from the current schema, so schemas migrate independently while
// instances sharing one schema serialise.
//
// Creating the table under the lock matters: two sessions running
// CREATE TABLE IF NOT EXISTS at once can both pass the existence check and
// one then fails on the catalog's unique index.
//
// A version table written before checksums were recorded lacks the
// column: it is added here (under the lock, once), its rows holding NULL
// until verify records the set's checksums for them.
func lockAndPrepare(ctx context.Context, tx pgx.Tx, table string) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('idem.migrate:' || current_schema() || '.' || $1, 0))`, table); err != nil {
		return fmt.Errorf("migrate: lock: %w", err)
	}
	_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+pgx.Identifier{table}.Sanitize()+` (
		version    integer     PRIMARY KEY,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now(),
		checksum   text
	)`)
	if err != nil {
		return fmt.Errorf("migrate: create %s: %w", table, err)
	}
	has, err := hasChecksumColumn(ctx, tx, table)
	if err != nil {
		return err
	}
	if !has {
		// Only when missing: ALTER TABLE takes an exclusive lock even when
		// IF NOT EXISTS makes it a no-op, which would block Status readers
		// on every Up.
		if _, err := tx.Exec(ctx, `ALTER TABLE `+pgx.Identifier{table}.Sanitize()+` ADD COLUMN IF NOT EXISTS checksum text`); err != nil {
			return fmt.Errorf("migrate: add checksum column to %s: %w", table, err)
		}
	}
	return nil
}

func hasChecksumColumn(ctx context.Context, tx pgx.Tx, table string) (bool, error) {
	var has bool
	err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute
		WHERE attrelid = to_regclass($1) AND attname = 'checksum' AND NOT attisdropped)`,
		pgx.Identifier{table}.Sanitize()).Scan(&has)
	if err != nil {
		return false, fmt.Errorf("migrate: read %s: %w", table, err)
	}
	return has, nil
}

// appliedRow is one row of the version table.
type appliedRow struct {
	name     string
	at       time.Time
	checksum string // "" when none was recorded (a legacy row)
}

// readApplied reads the version table; withChecksum is false for a legacy
// table that has no checksum column yet (Status only: Up and Down add it).
func readApplied(ctx context.Context, tx pgx.Tx, table string, withChecksum bool) (map[int]appliedRow, int, error) {
	sum := "NULL::text"
	if withChecksum {
		sum = "checksum"
	}
	rows, err := tx.Query(ctx, `SELECT version, name, applied_at, `+sum+` FROM `+pgx.Identifier{table}.Sanitize()+` ORDER BY version`)
	if err != nil {
		return nil, 0, fmt.Errorf("migrate: read %s: %w", table, err)
	}
	defer rows.Close()
	out := map[int]appliedRow{}
	cur := 0
	for rows.Next() {
		var v int
		var r appliedRow
		var cs *string
		if err := rows.Scan(&v, &r.name, &r.at, &cs); err != nil {
			return nil, 0, fmt.Errorf("migrate: read %s: %w", table, err)
		}
		if cs != nil {
			r.checksum = *cs
		}
		out[v] = r
		cur = max(cur, v)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("migrate: read %s: %w", table, err)
	}
	return out, cur, nil
}

// changed returns the ErrMigrationChanged error for the first applied
// version that differs from the set, or nil. A row without a checksum is
// not a change (see backfill).
func (m *Migrator) changed(applied map[int]appliedRow) error {
	for _, mig := range m.migrations {
		r, ok := applied[mig.Version]
		switch {
		case !ok:
		case r.name != mig.Name:
			return fmt.Errorf("%w: version %d was applied as %q and is %q in this set: a file renamed after it was applied",
				ErrMigrationChanged, mig.Version, r.name, mig.Name)
		case r.checksum != "" && r.checksum != mig.Checksum:
			return fmt.Errorf("%w: version %d (%s): checksum %.12s… recorded when it was applied, %.12s… in this set: "+
				"the file was edited after it was applied; put the change in a new version",
				ErrMigrationChanged, mig.Version, mig.Name, r.checksum, mig.Checksum)
		}
	}
	return nil
}

// backfill records the set's checksum for applied versions that have none:
// rows written before checksums existed. It trusts the set on first sight
// (the only record of what was applied is the name, and it matched); from
// then on an edit is caught.
func (m *Migrator) backfill(ctx context.Context, tx pgx.Tx, applied map[int]appliedRow) error {
	for _, mig := range m.migrations {
		if r, ok := applied[mig.Version]; ok && r.checksum == "" {
			if _, err := tx.Exec(ctx, `UPDATE `+pgx.Identifier{m.table}.Sanitize()+` SET checksum = $2 WHERE version = $1 AND checksum IS NULL`,
				mig.Version, mig.Checksum); err != nil {
				return fmt.Errorf("migrate: record checksum of version %d: %w", mig.Version, err)
			}
		}
	}
	return nil
}

// prepare locks, reads and checks the version table for Up and Down; it
// returns the current version.
func (m *Migrator) prepare(ctx context.Context, tx pgx.Tx) (int, error) {
	if err := lockAndPrepare(ctx, tx, m.table); err != nil {
		return 0, err
	}
	applied, cur, err := readApplied(ctx, tx, m.table, true)
	if err != nil {
		return 0, err
	}
	if cur > len(m.migrations) {
		return 0, fmt.Errorf("%w: database at %d, latest known %d", ErrUnknownVersion, cur, len(m.migrations))
	}
	if err := m.changed(applied); err != nil {
		return 0, err
	}
	if err := m.backfill(ctx, tx, applied); err != nil {
		return 0, err
	}
	return cur, nil
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
		cur, err := m.prepare(ctx, tx)
		if err != nil {
			return err
		}
		if cur == len(m.migrations) {
			done = true
			return nil
		}
		next := m.migrations[cur]
		if _, err := tx.Exec(ctx, next.Up); err != nil {
			return fmt.Errorf("migrate: version %d (%s) up: %w", next.Version, next.Name, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{m.table}.Sanitize()+` (version, name, checksum) VALUES ($1, $2, $3)`,
			next.Version, next.Name, next.Checksum); err != nil {
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
		cur, err := m.prepare(ctx, tx)
		if err != nil {
			return err
		}
		if cur == 0 {
			return ErrNothingToRevert
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

// States of a migration, as MigrationStatus.State reports them and
// `idem migrate status` prints them.
const (
	StatePending          = "pending"
	StateApplied          = "applied"
	StateNoChecksum       = "applied, no checksum recorded" // a legacy row; the next Up records it
	StateChecksumMismatch = "applied, checksum mismatch"    // edited after it was applied
	StateRenamed          = "applied, renamed"              // AppliedName differs from Name
)

// MigrationStatus is one version and whether it is applied.
type MigrationStatus struct {
	Version int
	Name    string
	// Checksum is the set's checksum of the version (Migration.Checksum).
	Checksum  string
	Applied   bool
	AppliedAt time.Time
	// AppliedName and AppliedChecksum are what the version table recorded
	// when the version was applied; AppliedChecksum is empty for a row
	// written before checksums were recorded.
	AppliedName     string
	AppliedChecksum string
}

// State is one of the State constants.
func (s MigrationStatus) State() string {
	switch {
	case !s.Applied:
		return StatePending
	case s.AppliedName != s.Name:
		return StateRenamed
	case s.AppliedChecksum == "":
		return StateNoChecksum
	case s.AppliedChecksum != s.Checksum:
		return StateChecksumMismatch
	}
	return StateApplied
}

// Changed reports whether the version was applied and then renamed or
// edited.
func (s MigrationStatus) Changed() bool {
	st := s.State()
	return st == StateRenamed || st == StateChecksumMismatch
}

// Status reads which versions are applied and whether each still matches
// the set. It takes no lock and changes nothing: a database never migrated
// reports version 0, and a version table without checksums is read as it
// is. It returns the status together with ErrUnknownVersion or
// ErrMigrationChanged when one applies, so that a caller can show both.
func (m *Migrator) Status(ctx context.Context, db DB) (*Status, error) {
	st := &Status{Latest: len(m.migrations)}
	var applied map[int]appliedRow
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, pgx.Identifier{m.table}.Sanitize()).Scan(&exists); err != nil {
			return fmt.Errorf("migrate: status: %w", err)
		}
		if !exists {
			return nil
		}
		has, err := hasChecksumColumn(ctx, tx, m.table)
		if err != nil {
			return err
		}
		applied, st.Current, err = readApplied(ctx, tx, m.table, has)
		return err
	})
	if err != nil {
		return nil, err
	}
	for _, mig := range m.migrations {
		r, ok := applied[mig.Version]
		st.Migrations = append(st.Migrations, MigrationStatus{
			Version: mig.Version, Name: mig.Name, Checksum: mig.Checksum,
			Applied: ok, AppliedAt: r.at, AppliedName: r.name, AppliedChecksum: r.checksum,
		})
	}
	if st.Current > st.Latest {
		return st, fmt.Errorf("%w: database at %d, latest known %d", ErrUnknownVersion, st.Current, st.Latest)
	}
	if err := m.changed(applied); err != nil {
		return st, err
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
			fmt.Fprintf(&b, "INSERT INTO %s (version, name, checksum) VALUES (%d, '%s', '%s');\n\n", m.table, mig.Version, mig.Name, mig.Checksum)
		}
		return "CREATE TABLE IF NOT EXISTS " + m.table + " (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now(), checksum text);\n" +
			"ALTER TABLE " + m.table + " ADD COLUMN IF NOT EXISTS checksum text;\n\n" + b.String()
	}
	for i := len(m.migrations) - 1; i >= 0; i-- {
		mig := m.migrations[i]
		fmt.Fprintf(&b, "-- idem migration %03d_%s (down)\n%s\n", mig.Version, mig.Name, strings.TrimSpace(mig.Down))
		fmt.Fprintf(&b, "DELETE FROM %s WHERE version = %d;\n\n", m.table, mig.Version)
	}
	return b.String()
}
