package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/idemkit/idem/internal/cli"
	"github.com/idemkit/idem/migrate"
)

func init() {
	register(&cli.Command{Name: "migrate", Summary: "apply, revert or print idem's SQL migrations", Run: runMigrate})
}

const migrateUsage = `Usage: idem migrate up|down|status|sql [flags]

  up      apply every pending migration
  down    revert the newest applied migration (one step)
  status  list migrations and the state of each: pending; applied; applied,
          checksum mismatch (the file was edited after it was applied);
          applied, renamed; applied, no checksum recorded (applied by a
          release that did not record checksums: the next up records them)
  sql     print the SQL of every migration (--down: the revert script)

Each applied version's checksum is recorded; up, down and status refuse
(exit 1, naming the version) a migration edited or renamed after it was
applied: put a change in a new version instead.

The database is --database-url, else DATABASE_URL, else the local server.`

func runMigrate(ctx context.Context, args []string) error {
	fs := cli.FlagSet("migrate", migrateUsage)
	dbURL := fs.String("database-url", cli.DatabaseURL(), "PostgreSQL URL")
	down := fs.Bool("down", false, "with sql: print the down migrations, newest first")
	// Accept flags before and after the action.
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return cli.Usagef("missing action: up, down, status or sql")
	}
	action := fs.Arg(0)
	if err := cli.Parse(fs, fs.Args()[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.Usagef("unexpected argument %q", fs.Arg(0))
	}
	m, err := migrate.Default()
	if err != nil {
		return err
	}
	switch action {
	case "sql":
		fmt.Print(m.SQL(*down))
		return nil
	case "up", "down", "status":
	default:
		return cli.Usagef("unknown action %q: want up, down, status or sql", action)
	}
	pool, err := cli.Connect(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	switch action {
	case "up":
		applied, err := m.Up(ctx, pool)
		for _, v := range applied {
			fmt.Printf("applied %03d_%s\n", v, m.Migrations()[v-1].Name)
		}
		if err != nil {
			return err
		}
		if len(applied) == 0 {
			fmt.Printf("already at version %d\n", m.Latest())
		}
	case "down":
		v, err := m.Down(ctx, pool)
		if errors.Is(err, migrate.ErrNothingToRevert) {
			fmt.Println("nothing to revert: version 0")
			return nil
		}
		if err != nil {
			return err
		}
		fmt.Printf("reverted %03d_%s, now at version %d\n", v, m.Migrations()[v-1].Name, v-1)
	case "status":
		// Status returns the table with ErrUnknownVersion or
		// ErrMigrationChanged: print the table, then fail with the error.
		st, err := m.Status(ctx, pool)
		if st == nil {
			return err
		}
		fmt.Printf("version %d of %d (%d pending)\n", st.Current, st.Latest, st.Pending())
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		for _, s := range st.Migrations {
			state := s.State()
			switch state {
			case migrate.StateApplied:
				state += " " + s.AppliedAt.Format("2006-01-02 15:04:05Z07:00")
			case migrate.StateRenamed:
				state += fmt.Sprintf(" (was %q)", s.AppliedName)
			}
			fmt.Fprintf(tw, "  %03d\t%s\t%s\n", s.Version, s.Name, state)
		}
		if ferr := tw.Flush(); ferr != nil {
			return ferr
		}
		return err
	}
	return nil
}
