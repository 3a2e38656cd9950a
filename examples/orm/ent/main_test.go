package main

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/examples/orm/ent/ent"
	"github.com/idemkit/idem/examples/orm/internal/ormtest"
	"github.com/idemkit/idem/internal/testdb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestEnt(t *testing.T) {
	ormtest.Run(t, func(t *testing.T, sdb *sql.DB) ormtest.Impl {
		client := open(sdb)
		return ormtest.Impl{
			Place: func(ctx context.Context, id string, total int64, fail bool) error {
				return place(ctx, client, id, total, fail)
			},
			Ship:   ship,
			Orders: http.HandlerFunc(orders),
		}
	})
}

// A transaction whose driver is wrapped (Debug) has no *sql.Tx to hand
// out: SQLTx says so with ent.ErrNoSQLTx rather than returning nil or
// something else to write on.
func TestSQLTxWrappedDriver(t *testing.T) {
	db := testdb.New(t, testdb.MaxConns(2))
	if _, err := db.Pool.Exec(t.Context(), ormtest.Schema); err != nil {
		t.Fatal(err)
	}
	client := open(db.SQL(t, "pgx", 2))
	tx, err := client.Debug().Tx(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.SQLTx(); !errors.Is(err, ent.ErrNoSQLTx) {
		t.Fatalf("SQLTx on a Debug transaction: %v, want ent.ErrNoSQLTx", err)
	}
	if stx, err := func() (*sql.Tx, error) {
		tx, err := client.Tx(t.Context())
		if err != nil {
			return nil, err
		}
		defer func() { _ = tx.Rollback() }()
		return tx.SQLTx()
	}(); err != nil || stx == nil {
		t.Fatalf("SQLTx on a plain transaction: %v, %v", stx, err)
	}
}

// The generator that made ent/ is the ent of go.mod: ent/generate.go runs
// entgo.io/ent/cmd/ent at the version go.mod requires (the generated code
// and the runtime it calls must match).
func TestGeneratorVersionIsGoMods(t *testing.T) {
	gen, err := os.ReadFile("ent/generate.go")
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*entgo\.io/ent (v\S+)`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("go.mod requires no entgo.io/ent")
	}
	if want := "entgo.io/ent/cmd/ent@" + string(m[1]) + " "; !strings.Contains(string(gen), want) {
		t.Fatalf("ent/generate.go does not run %q (go.mod's ent)", want)
	}
}
